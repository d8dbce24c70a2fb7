package cli

import "syscall"

// childSysProcAttr makes CMD get SIGTERM when vigil run dies, even by
// SIGKILL, so a task's command never outlives its reaper.
func childSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
