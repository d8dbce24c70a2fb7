//go:build unix && !linux

package supervisor

import (
	"errors"
	"syscall"
)

// groupRunning reports whether group pgid still has members. Without /proc,
// unreaped zombies count as members; init reaps orphans promptly on these
// systems.
func groupRunning(pgid int) bool {
	return !errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH)
}
