//go:build !unix

package heartbeat

import "syscall"

func detachAttr() *syscall.SysProcAttr { return nil }
