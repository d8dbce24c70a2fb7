package supervisor

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRotatingFile(t *testing.T) {
	t.Parallel()

	dir := filepath.Join(t.TempDir(), "logs", "nested") // created on open
	path := filepath.Join(dir, "a.log")
	f, err := openRotatingFile(path, 100, 2)
	require.NoError(t, err)
	var written []string
	for i := range 30 {
		line := fmt.Sprintf("line %02d: %s\n", i, strings.Repeat("x", 10)) // 20 bytes
		written = append(written, line)
		n, err := f.Write([]byte(line))
		require.NoError(t, err)
		require.Equal(t, len(line), n)
	}
	require.NoError(t, f.Close())
	_, err = f.Write([]byte("late\n"))
	require.ErrorIs(t, err, os.ErrClosed)

	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.Equal(t, []string{"a.log", "a.log.1", "a.log.2"}, names, "keep 2 rotated files")

	// Oldest first, the kept files hold the last lines written, whole,
	// each file at most 100 bytes.
	var got string
	for _, name := range []string{"a.log.2", "a.log.1", "a.log"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		require.LessOrEqual(t, len(data), 100, name)
		got += string(data)
	}
	require.Equal(t, strings.Join(written[30-15:], ""), got)

	// Reopening appends, counting what is there.
	f, err = openRotatingFile(path, 100, 2)
	require.NoError(t, err)
	require.Equal(t, int64(100), f.size)
	_, err = f.Write([]byte("after reopen\n"))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "after reopen\n", string(data), "a full file rotates before the next write")

	// A write larger than the limit goes whole into a fresh file.
	f, err = openRotatingFile(path, 10, 1)
	require.NoError(t, err)
	_, err = f.Write([]byte("0123456789abcdef\n"))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	data, err = os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "0123456789abcdef\n", string(data))
}

func TestLogLineWriter(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "w.log")
	f, err := openRotatingFile(path, LogMaxBytesDefault, LogKeepDefault)
	require.NoError(t, err)
	now := func() time.Time { return time.Date(2026, 11, 30, 8, 1, 2, 345e6, time.FixedZone("X", 3600)) }
	w := logLineWriter{file: f, stream: "stderr", prefix: len("[w] "), now: now}
	n, err := w.Write([]byte("[w] oops\n"))
	require.NoError(t, err)
	require.Equal(t, len("[w] oops\n"), n)
	require.NoError(t, f.Close())
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "2026-11-30T07:01:02.345Z stderr oops\n", string(data))
}

func TestLogFile(t *testing.T) {
	t.Parallel()
	p, err := LogFile("/var/log/vigil", "worker-1")
	require.NoError(t, err)
	require.Equal(t, "/var/log/vigil/worker-1.log", p)
	for _, bad := range []string{"", "../etc/passwd", "a/b"} {
		_, err := LogFile("/d", bad)
		require.ErrorContains(t, err, "must be 1 to 128 characters", bad)
	}
}
