//go:build !linux

package supervisor

import "errors"

// fdWatcher is Linux only (fdwatch_linux.go); elsewhere every running agent
// has a goroutine waiting for its exit and one per output stream.
type fdWatcher struct{}

func newFDWatcher() (*fdWatcher, error) { return nil, errors.ErrUnsupported }

func (*fdWatcher) watch(int, func()) (func() bool, error) { return nil, errors.ErrUnsupported }

func (*fdWatcher) stop() {}
