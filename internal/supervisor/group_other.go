//go:build !unix

package supervisor

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
)

// groupSupport reports whether this platform has process groups; New refuses
// to build a supervisor where it has not.
func groupSupport() error {
	return fmt.Errorf("process groups on %s: %w", runtime.GOOS, errors.ErrUnsupported)
}

func groupSysProcAttr() *syscall.SysProcAttr     { return nil }
func terminateGroup(int) error                   { return errors.ErrUnsupported }
func killGroup(int) error                        { return errors.ErrUnsupported }
func groupRunning(int) bool                      { return false }
func exitSignal(*os.ProcessState) (string, bool) { return "", false }

func inGroup(int, int) bool { return false }
