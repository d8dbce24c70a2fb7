//go:build unix

package supervisor

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// groupSupport reports whether this platform has process groups.
func groupSupport() error { return nil }

// groupSysProcAttr puts the child in a new process group whose id is its pid,
// so that signals sent to the group reach every process it forks (DESIGN S1).
func groupSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// terminateGroup sends SIGTERM to every process of group pgid.
func terminateGroup(pgid int) error { return signalGroup(pgid, syscall.SIGTERM) }

// killGroup sends SIGKILL to every process of group pgid.
func killGroup(pgid int) error { return signalGroup(pgid, syscall.SIGKILL) }

// signalGroup signals group pgid. An empty group is not an error.
func signalGroup(pgid int, sig syscall.Signal) error {
	if pgid <= 1 {
		// kill(0) would signal our own group and kill(-1) every process we may.
		return fmt.Errorf("refusing to signal process group %d", pgid)
	}
	if err := syscall.Kill(-pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal process group %d with %s: %w", pgid, sig, err)
	}
	return nil
}

// exitSignal returns the name of the signal that ended the process, if one did.
func exitSignal(state *os.ProcessState) (string, bool) {
	ws, ok := state.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		return "", false
	}
	return ws.Signal().String(), true
}

// inGroup reports whether process pid is a member of process group pgid
// (a descendant of an agent that stayed in its group, such as the program
// `go run` or `sh -c` starts).
func inGroup(pid, pgid int) bool {
	g, err := syscall.Getpgid(pid)
	return err == nil && g == pgid
}
