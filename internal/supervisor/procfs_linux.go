//go:build linux

package supervisor

import (
	"bytes"
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

// pidfdPIDs lists the processes this process holds a pidfd for: its
// descriptors (/proc/self/fd) that are pidfds, by the "Pid:" line of their
// /proc/self/fdinfo. os.Process keeps one for each child it starts until
// Wait has reaped it (or Release), so a child listed here is one whose
// status some os/exec caller is waiting for. A descriptor closed meanwhile
// is skipped.
func pidfdPIDs() (map[int]struct{}, error) {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return nil, err
	}
	names, err := d.Readdirnames(-1)
	_ = d.Close()
	if err != nil {
		return nil, err
	}
	buf := procBufs.Get().(*[]byte)
	defer procBufs.Put(buf)
	self := os.Getpid()
	pids := map[int]struct{}{}
	var link [64]byte
	for _, name := range names {
		n, err := syscall.Readlink("/proc/self/fd/"+name, link[:])
		if err != nil || !isPidfdLink(link[:n]) {
			continue
		}
		info, err := readProcFile(self, "fdinfo/"+name, buf)
		if err != nil {
			continue
		}
		if pid, ok := fdinfoPid(info); ok && pid > 0 {
			pids[pid] = struct{}{}
		}
	}
	return pids, nil
}

// isPidfdLink reports whether a /proc/<pid>/fd link names a pidfd
// ("anon_inode:[pidfd]", and "pidfd:[<inode>]" for pidfs).
func isPidfdLink(link []byte) bool {
	return bytes.Equal(link, []byte("anon_inode:[pidfd]")) || bytes.HasPrefix(link, []byte("pidfd:"))
}

// fdinfoPid reads the "Pid:" line of a pidfd's fdinfo: the process's pid,
// or -1 once it has been reaped.
func fdinfoPid(info []byte) (int, bool) {
	for len(info) > 0 {
		line := info
		if j := bytes.IndexByte(info, '\n'); j >= 0 {
			line, info = info[:j], info[j+1:]
		} else {
			info = nil
		}
		if v, ok := bytes.CutPrefix(line, []byte("Pid:")); ok {
			return atoiBytes(bytes.TrimSpace(v))
		}
	}
	return 0, false
}

// osHoldsPidfds reports whether os.Process holds a pidfd for each child it
// starts, as it does since Go 1.23 where the kernel allows it (Linux 5.4+,
// no seccomp filter in the way): what tells the reaper that os/exec waits
// for a child. It asks os itself, once: os.FindProcess holds a pidfd
// exactly when os uses them for its children.
var osHoldsPidfds = sync.OnceValue(func() bool {
	self := os.Getpid()
	p, err := os.FindProcess(self)
	if err != nil {
		return false
	}
	defer p.Release()
	pids, err := pidfdPIDs()
	_, held := pids[self]
	return err == nil && held
})
