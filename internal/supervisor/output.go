package supervisor

import (
	"bufio"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// maxLineBytes bounds one copied line; a longer line is split.
const maxLineBytes = 64 << 10

// copyReadBytes is the read buffer of one output copier. Lines are
// assembled, up to maxLineBytes, in a buffer of their own that grows only
// as long lines need.
const copyReadBytes = 4 << 10

// outputDrainTimeout is how long, once a child's process group is gone, the
// supervisor waits for the rest of its output before closing the pipes. Only
// a process that left the group (setsid) and kept the pipe open makes it wait
// that long.
const outputDrainTimeout = time.Second

// syncWriter serialises writes from all agents' copiers, so that each line
// reaches the destination whole even if the destination is not safe for
// concurrent use.
type syncWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (s syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// outputCopy copies one child's stdout and stderr, line by line, prefixed.
type outputCopy struct {
	pipes   []*os.File
	cancels []func() bool // per pipe, with a watcher: stop waiting for its first output
	running atomic.Int32  // copiers not finished (or never to start)
	done    chan struct{} // closed when running reaches 0
}

// startOutputCopy copies each reader to its writer, prefixing every line with
// "[name] ". It owns the readers and closes them in finish.
//
// A copier starts only once its pipe is readable: with a watcher, its loop
// waits for that, so that a quiet agent's output costs no goroutine at all;
// without one, the copier's goroutine waits parked on the network poller
// (waitReadable), with no read buffer yet (issue #6).
func startOutputCopy(name string, w *fdWatcher, pairs ...outputPair) *outputCopy {
	c := &outputCopy{done: make(chan struct{}), cancels: make([]func() bool, len(pairs))}
	prefix := []byte("[" + name + "] ")
	for _, p := range pairs {
		c.pipes = append(c.pipes, p.r)
	}
	c.running.Store(int32(len(pairs)))
	if len(pairs) == 0 {
		close(c.done)
		return c
	}
	for i, p := range pairs {
		copyPipe := func() {
			defer c.copierDone()
			copyLines(p.w, p.r, prefix)
		}
		if w != nil {
			if cancel, err := watchFile(w, p.r, copyPipe); err == nil {
				c.cancels[i] = cancel
				continue
			}
		}
		go func() {
			waitReadable(p.r)
			copyPipe()
		}()
	}
	return c
}

// copierDone counts one copier finished, or one that will never start.
func (c *outputCopy) copierDone() {
	if c.running.Add(-1) == 0 {
		close(c.done)
	}
}

// watchFile has w run fn once f is readable. It reads f's descriptor
// without os.File.Fd, which would make f blocking.
func watchFile(w *fdWatcher, f *os.File, fn func()) (cancel func() bool, err error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	if cerr := rc.Control(func(fd uintptr) { cancel, err = w.watch(int(fd), fn) }); cerr != nil {
		return nil, cerr
	}
	return cancel, err
}

type outputPair struct {
	r *os.File
	w io.Writer
}

// finish waits up to drain for the copiers to reach end of file, then closes
// the pipes (which ends a copier still blocked on a read) and waits for them.
func (c *outputCopy) finish(drain time.Duration) {
	t := time.NewTimer(drain)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
	}
	for _, cancel := range c.cancels {
		if cancel != nil && cancel() {
			c.copierDone() // never started, never will
		}
	}
	for _, f := range c.pipes {
		_ = f.Close()
	}
	<-c.done
}

// copyLines writes each line of r to w as prefix+line+"\n" in one Write. A
// final line without newline is completed; a line longer than maxLineBytes
// is split. Write errors are ignored so that the child never blocks on a full
// pipe.
func copyLines(w io.Writer, r io.Reader, prefix []byte) {
	br := bufio.NewReaderSize(r, copyReadBytes)
	buf := append(make([]byte, 0, 256), prefix...) // prefix + the line so far
	flush := func() {
		if buf[len(buf)-1] != '\n' {
			buf = append(buf, '\n')
		}
		_, _ = w.Write(buf)
		buf = append(buf[:0], prefix...)
	}
	for {
		chunk, err := br.ReadSlice('\n')
		for len(chunk) > 0 {
			n := min(len(chunk), maxLineBytes-(len(buf)-len(prefix)))
			buf = append(buf, chunk[:n]...)
			chunk = chunk[n:]
			if buf[len(buf)-1] == '\n' || len(buf)-len(prefix) == maxLineBytes {
				flush()
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			if len(buf) > len(prefix) {
				flush()
			}
			return
		}
	}
}

// stderrTailLines is how many of a child's last stderr lines go with its
// exit event.
const stderrTailLines = 20

// lineTail keeps the last n lines written to it (each Write is one line, as
// copyLines writes them), without the "[name] " prefix copyLines adds. It is
// safe for concurrent use.
type lineTail struct {
	mu     sync.Mutex
	n      int
	prefix string
	lines  []string
}

func newLineTail(n int, agent string) *lineTail { return &lineTail{n: n, prefix: "[" + agent + "] "} }

func (t *lineTail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, strings.TrimPrefix(string(p), t.prefix))
	if len(t.lines) > t.n {
		t.lines = t.lines[len(t.lines)-t.n:]
	}
	return len(p), nil
}

// String is the kept lines, oldest first.
func (t *lineTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, "")
}
