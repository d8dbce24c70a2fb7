package supervisor

import (
	"bufio"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// maxLineBytes bounds one copied line; a longer line is split.
const maxLineBytes = 64 << 10

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
	pipes []*os.File
	done  chan struct{}
}

// startOutputCopy copies each reader to its writer, prefixing every line with
// "[name] ". It owns the readers and closes them in finish.
func startOutputCopy(name string, pairs ...outputPair) *outputCopy {
	c := &outputCopy{done: make(chan struct{})}
	prefix := []byte("[" + name + "] ")
	var wg sync.WaitGroup
	for _, p := range pairs {
		c.pipes = append(c.pipes, p.r)
		wg.Go(func() { copyLines(p.w, p.r, prefix) })
	}
	go func() {
		wg.Wait()
		close(c.done)
	}()
	return c
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
	br := bufio.NewReaderSize(r, maxLineBytes)
	buf := make([]byte, 0, 256)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			buf = append(append(buf[:0], prefix...), line...)
			if buf[len(buf)-1] != '\n' {
				buf = append(buf, '\n')
			}
			_, _ = w.Write(buf)
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
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
