//go:build !unix

package heartbeat

import "errors"

// LockFile is the state directory's lock (unix only).
const LockFile = "lock"

// ErrBusy: another vigil command is changing the workdir's task right now.
var ErrBusy = errors.New("another vigil command is claiming or finishing a task in this workdir")

// Lock is a no-op off unix: there is no flock.
func (s State) Lock() (func(), error) { return func() {}, s.Init() }
