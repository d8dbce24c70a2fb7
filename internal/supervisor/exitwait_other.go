//go:build !linux

package supervisor

import (
	"os"
	"syscall"
)

// pidfdAttr: no pidfds here (see exitwait_linux.go); cmd.Wait blocks a
// thread per running agent.
func pidfdAttr(*syscall.SysProcAttr) *int {
	fd := -1
	return &fd
}

// parkUntilExited returns at once: cmd.Wait does the waiting.
func parkUntilExited(int) {}

// waitReadable returns at once: the copier's first read does the waiting.
func waitReadable(*os.File) {}

// closePidfd: there are none here.
func closePidfd(int) {}
