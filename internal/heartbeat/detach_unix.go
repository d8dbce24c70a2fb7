//go:build unix

package heartbeat

import "syscall"

// detachAttr starts the loop in a new session: no controlling terminal,
// not in its caller's process group, so a terminal hangup or a Ctrl-C
// there does not reach it.
func detachAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }
