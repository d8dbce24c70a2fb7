//go:build !linux

package heartbeat

import (
	"errors"
	"os"
	"syscall"
)

// ProcStartTime is not known without /proc: 0 (not compared). A pid reused
// by another process is then taken for the parent; gopsutil would close
// this gap on macOS and Windows.
func ProcStartTime(pid int) (uint64, error) { return 0, nil }

// Observe asks the OS whether pid exists (signal 0); EPERM counts as alive.
// The start time is unknown.
func Observe(pid int) Observation {
	p, err := os.FindProcess(pid)
	if err != nil {
		return Observation{}
	}
	err = p.Signal(syscall.Signal(0))
	if err == nil || errors.Is(err, syscall.EPERM) || errors.Is(err, os.ErrPermission) {
		return Observation{Exists: true}
	}
	return Observation{}
}
