//go:build linux

package supervisor

import (
	"os"
	"syscall"
	"unsafe"
)

// Waiting for an agent's leader without an OS thread (issue #6).
//
// cmd.Wait blocks in waitid(2), and a goroutine blocked in a system call
// holds an OS thread: one thread per running agent, each with its stacks
// (about 25 KiB of RSS apiece). Instead, the leader's goroutine first parks
// on a pidfd, which the runtime's network poller (one epoll set for the
// whole process) watches like a socket; the pidfd becomes readable when the
// process exits, and only then is cmd.Wait called, which collects the
// status at once. os/exec still owns the leader's status; nothing here
// calls wait4.

// pidfdAttr asks os/exec, through attr, for a pidfd of the child it starts
// (clone with CLONE_PIDFD; os/exec keeps its own duplicate). After a
// successful Start, the returned int holds it, or -1 when the kernel has
// none (before Linux 5.2).
func pidfdAttr(attr *syscall.SysProcAttr) *int {
	fd := -1
	attr.PidFD = &fd
	return &fd
}

// parkUntilExited returns once the process behind pidfd has exited — its
// status then waits to be collected, so that cmd.Wait returns at once —
// with only the calling goroutine parked, on the network poller. It closes
// pidfd. With pidfd -1, or a pidfd the poller cannot watch, it returns at
// once, and cmd.Wait blocks a thread as before.
func parkUntilExited(pidfd int) {
	if pidfd < 0 {
		return
	}
	if err := syscall.SetNonblock(pidfd, true); err != nil {
		_ = syscall.Close(pidfd)
		return
	}
	f := os.NewFile(uintptr(pidfd), "pidfd")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	// Read calls the function, and parks until the poller reports the
	// pidfd readable whenever it returns false. An error (a pidfd the
	// poller does not take) ends the wait.
	_ = rc.Read(func(fd uintptr) bool { return readableOrUnknown(int(fd)) })
}

// waitReadable parks the calling goroutine, on the network poller, until f
// has something to read or is at end of file (or is closed). It needs no
// buffer: an agent's output copiers allocate theirs only when it first
// writes, so that a quiet agent costs none.
func waitReadable(f *os.File) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Read(func(fd uintptr) bool { return readableOrUnknown(int(fd)) })
}

// closePidfd closes a pidfd from pidfdAttr.
func closePidfd(pidfd int) { _ = syscall.Close(pidfd) }

// pollfd is struct pollfd from <poll.h>.
type pollfd struct {
	fd      int32
	events  int16
	revents int16
}

// pollIn is POLLIN: a pidfd polls readable once its process has exited, a
// pipe once it has data or its writers are gone (then with POLLHUP, which
// poll always reports).
const pollIn = 0x1

// readableOrUnknown polls fd without waiting: true if it is readable (for a
// pidfd: its process has exited), or if poll fails (then the caller's
// blocking call decides).
func readableOrUnknown(fd int) bool {
	p := pollfd{fd: int32(fd), events: pollIn}
	var zero syscall.Timespec // do not wait
	n, _, errno := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&p)), 1, uintptr(unsafe.Pointer(&zero)), 0, 0, 0)
	return errno != 0 || n > 0
}
