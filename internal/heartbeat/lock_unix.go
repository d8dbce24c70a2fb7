//go:build unix

package heartbeat

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// LockFile is the state directory's lock, held while a command changes
// which task the workdir holds.
const LockFile = "lock"

// ErrBusy: another vigil command is changing the workdir's task right now.
var ErrBusy = errors.New("another vigil command is claiming or finishing a task in this workdir")

// Lock takes the workdir's lock (flock on DIR/.vigil/lock) without waiting,
// so that two claims in one workdir cannot both succeed and leave a task
// held with no heartbeat loop. The returned func releases it.
func (s State) Lock() (func(), error) {
	if err := s.Init(); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(s.Path(LockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", s.Workdir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w", s.Workdir, ErrBusy)
		}
		return nil, fmt.Errorf("lock %s: %w", s.Workdir, err)
	}
	return func() { _ = f.Close() }, nil // closing releases the flock
}
