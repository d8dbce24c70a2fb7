//go:build linux

package supervisor

import (
	"errors"
	"os"
	"strconv"
	"sync"
	"syscall"
)

// The generation and reaper scans read /proc/<pid>/stat for every process
// and /proc/<pid>/environ for many, on every exit and every reaper pass.
// They read with plain system calls into pooled buffers: an *os.File per
// read would cost an fstat, a poller registration and several allocations,
// which at thousands of processes is most of a scan (issue #6).

// procBufs pools the buffers /proc files are read into.
var procBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// readProcFile reads the whole of /proc/<pid>/<name> into *buf, growing
// it as needed, and returns the content (which aliases *buf).
func readProcFile(pid int, name string, buf *[]byte) ([]byte, error) {
	fd, err := syscall.Open("/proc/"+strconv.Itoa(pid)+"/"+name, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	b := (*buf)[:0]
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := syscall.Read(fd, b[len(b):cap(b)])
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			*buf = b
			return nil, err
		}
		if n == 0 {
			*buf = b
			return b, nil
		}
		b = b[:len(b)+n]
	}
}

// procPIDs lists the pids under /proc, unsorted.
func procPIDs() ([]int, error) {
	d, err := os.Open("/proc")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	pids := make([]int, 0, len(names))
	for _, name := range names {
		if pid, err := strconv.Atoi(name); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}
