//go:build !linux

package cli

import "syscall"

// childSysProcAttr: no parent-death signal off Linux.
func childSysProcAttr() *syscall.SysProcAttr { return nil }
