package supervisor

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// Agent log file defaults.
const (
	// LogMaxBytesDefault is the size at which an agent's log file is
	// rotated: 10 MiB.
	LogMaxBytesDefault = 10 << 20
	// LogKeepDefault is how many rotated files are kept besides the current
	// one: 3 (<agent>.log.1, the newest, to <agent>.log.3).
	LogKeepDefault = 3
)

// LogFile returns the path of agent's current log file in dir:
// <dir>/<agent>.log. Rotated files add ".1" (newest) to ".<keep>".
// It rejects a name that is not a valid agent name, so that the path stays
// inside dir.
func LogFile(dir, agent string) (string, error) {
	if !agentNameRE.MatchString(agent) {
		return "", fmt.Errorf("agent name %q must be 1 to 128 characters from [A-Za-z0-9_.-]", agent)
	}
	return filepath.Join(dir, agent+".log"), nil
}

// rotatingFile is an append-only file rotated by size: before a write that
// would take it past maxBytes, <path> becomes <path>.1, <path>.1 becomes
// <path>.2, and so on up to <path>.<keep>, which is dropped. A single write
// larger than maxBytes still goes whole into a fresh file. It is safe for
// concurrent use.
type rotatingFile struct {
	path     string
	maxBytes int64
	keep     int

	mu   sync.Mutex
	f    *os.File
	size int64
}

// openRotatingFile opens (creating it and dir if needed) path for
// appending.
func openRotatingFile(path string, maxBytes int64, keep int) (*rotatingFile, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("log dir: %w", err)
	}
	r := &rotatingFile{path: path, maxBytes: maxBytes, keep: keep}
	if err := r.open(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *rotatingFile) open() error {
	f, err := os.OpenFile(r.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("open log file: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("open log file: %w", err)
	}
	r.f, r.size = f, fi.Size()
	return nil
}

func (r *rotatingFile) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return 0, os.ErrClosed
	}
	if r.size > 0 && r.size+int64(len(p)) > r.maxBytes {
		if err := r.rotate(); err != nil {
			return 0, err
		}
	}
	n, err := r.f.Write(p)
	r.size += int64(n)
	return n, err
}

// rotate shifts the files by one and opens a fresh current file.
func (r *rotatingFile) rotate() error {
	if err := r.f.Close(); err != nil {
		return fmt.Errorf("rotate log file: %w", err)
	}
	r.f = nil
	for i := r.keep - 1; i >= 1; i-- {
		err := os.Rename(r.path+"."+strconv.Itoa(i), r.path+"."+strconv.Itoa(i+1))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("rotate log file: %w", err)
		}
	}
	if err := os.Rename(r.path, r.path+".1"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("rotate log file: %w", err)
	}
	return r.open()
}

// Close closes the current file; later writes fail.
func (r *rotatingFile) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return nil
	}
	err := r.f.Close()
	r.f = nil
	return err
}

// logLineWriter turns the lines copyLines writes ("[agent] text\n") into
// log file lines "<time> <stream> text\n", time in UTC with milliseconds.
type logLineWriter struct {
	file   *rotatingFile
	stream string // "stdout" or "stderr"
	prefix int    // len("[agent] ")
	now    func() time.Time
}

func (w logLineWriter) Write(p []byte) (int, error) {
	line := p[min(w.prefix, len(p)):]
	buf := make([]byte, 0, len(line)+40)
	buf = w.now().UTC().AppendFormat(buf, "2006-01-02T15:04:05.000Z07:00")
	buf = append(append(append(buf, ' '), w.stream...), ' ')
	buf = append(buf, line...)
	if _, err := w.file.Write(buf); err != nil {
		return 0, err
	}
	return len(p), nil
}

// teeWriter writes to every writer, whatever errors any of them returns
// (unlike io.MultiWriter, which stops at the first), so that a failing
// terminal never keeps lines from the log file.
type teeWriter []io.Writer

func (t teeWriter) Write(p []byte) (int, error) {
	for _, w := range t {
		_, _ = w.Write(p)
	}
	return len(p), nil
}
