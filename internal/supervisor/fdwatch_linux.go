//go:build linux

package supervisor

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
)

// fdWatcher is the supervisor's one loop for the events of all its agents
// (issue #6): one goroutine, on one OS thread, blocked in epoll_wait(2) on
// every running leader's pidfd (readable when the leader exits) and on
// every quiet agent's output pipes (readable at its first output or when
// its writers are gone). Each watch fires once and runs its function on a
// new goroutine. An agent that neither exits nor writes thus costs no
// goroutine but its own supervising one, and no thread at all.
type fdWatcher struct {
	epfd         int
	wakeR, wakeW int // a pipe that ends the loop

	mu     sync.Mutex
	next   int32
	funcs  map[int32]func() // by epoll token, until fired or cancelled
	closed bool             // the loop has ended: watch refuses, its callers fall back

	done chan struct{}
}

// wakeToken is the epoll token of the wake pipe.
const wakeToken = 0

// newFDWatcher creates the epoll set and starts the loop.
func newFDWatcher() (*fdWatcher, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		_ = syscall.Close(epfd)
		return nil, fmt.Errorf("pipe2: %w", err)
	}
	w := &fdWatcher{epfd: epfd, wakeR: p[0], wakeW: p[1], next: wakeToken, funcs: map[int32]func(){}, done: make(chan struct{})}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: wakeToken}
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, w.wakeR, &ev); err != nil {
		w.closeFDs()
		return nil, fmt.Errorf("epoll_ctl: %w", err)
	}
	go w.loop()
	return w, nil
}

// watch runs fn on a new goroutine once fd is readable (or hung up). fd
// must stay open until fn runs or cancel returns true. cancel removes the
// watch and reports whether fn will now never run.
func (w *fdWatcher) watch(fd int, fn func()) (cancel func() bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, errors.New("fd watcher stopped")
	}
	w.next++
	if w.next <= wakeToken { // wrapped
		w.next = wakeToken + 1
	}
	token := w.next
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLONESHOT, Fd: token}
	if err := syscall.EpollCtl(w.epfd, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return nil, fmt.Errorf("epoll_ctl: %w", err)
	}
	w.funcs[token] = fn
	return func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		if _, ok := w.funcs[token]; !ok {
			return false
		}
		delete(w.funcs, token)
		_ = syscall.EpollCtl(w.epfd, syscall.EPOLL_CTL_DEL, fd, nil)
		return true
	}, nil
}

func (w *fdWatcher) loop() {
	defer close(w.done)
	defer func() {
		w.mu.Lock()
		w.closed = true
		w.mu.Unlock()
	}()
	var events [64]syscall.EpollEvent
	for {
		n, err := syscall.EpollWait(w.epfd, events[:], -1)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			// Cannot happen with a valid epfd; fire every watch rather
			// than leave their owners waiting forever.
			w.mu.Lock()
			w.closed = true
			for token, fn := range w.funcs {
				delete(w.funcs, token)
				go fn()
			}
			w.mu.Unlock()
			return
		}
		stop := false
		for _, ev := range events[:n] {
			if ev.Fd == wakeToken {
				stop = true
				continue
			}
			w.mu.Lock()
			fn, ok := w.funcs[ev.Fd]
			delete(w.funcs, ev.Fd)
			w.mu.Unlock()
			if ok {
				go fn()
			}
		}
		if stop {
			return
		}
	}
}

// stop ends the loop and closes the epoll set. Every watch must have fired
// or been cancelled.
func (w *fdWatcher) stop() {
	_, _ = syscall.Write(w.wakeW, []byte{0})
	<-w.done
	w.closeFDs()
}

func (w *fdWatcher) closeFDs() {
	_ = syscall.Close(w.epfd)
	_ = syscall.Close(w.wakeR)
	_ = syscall.Close(w.wakeW)
}
