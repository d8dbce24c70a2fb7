package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// writeLogs writes name → content files into dir.
func writeLogs(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600))
	}
}

func TestLogsPrintsLastLines(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeLogs(t, dir, map[string]string{
		"w.log.2": "l1\nl2\n",
		"w.log.1": "l3\nl4\nl5\n",
		"w.log":   "l6\nl7\npartial", // a line still being written is not printed
	})

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"-n", "1"}, "l7\n"},
		{[]string{"-n", "2"}, "l6\nl7\n"},
		{[]string{"-n", "4"}, "l4\nl5\nl6\nl7\n"},
		{[]string{"--lines", "7"}, "l1\nl2\nl3\nl4\nl5\nl6\nl7\n"},
		{nil, "l1\nl2\nl3\nl4\nl5\nl6\nl7\n"}, // default 50: all there is
		{[]string{"-n", "0"}, ""},
	} {
		code, out, errOut := run(t, append([]string{"logs", "w", "--log-dir", dir}, tt.args...)...)
		require.Equal(t, 0, code, errOut)
		require.Equal(t, tt.want, out, "%v", tt.args)
	}
}

func TestLogsErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()

	code, _, errOut := run(t, "logs", "nobody", "--log-dir", dir)
	require.Equal(t, exitNotFound, code)
	require.Contains(t, errOut, `no log file for agent "nobody": `+filepath.Join(dir, "nobody.log")+" does not exist")

	code, _, errOut = run(t, "logs", "../x", "--log-dir", dir)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, `AGENT: agent name "../x" must be`)

	code, _, errOut = run(t, "logs", "w", "-n", "-1", "--log-dir", dir)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "-n/--lines must not be negative, got -1")

	code, _, errOut = run(t, "logs", "w", "--log-dir", "")
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "--log-dir must not be empty")

	code, _, errOut = run(t, "logs")
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "missing AGENT (usage: vigil logs AGENT")
}

func TestLogsFollowsAcrossRotation(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "w.log")
	writeLogs(t, dir, map[string]string{"w.log": "old1\nold2\n"})

	var stdout, stderr lockedBuffer
	root := NewRoot(strings.NewReader(""), &stdout, &stderr)
	root.SetArgs([]string{"logs", "w", "-f", "-n", "1", "--log-dir", dir})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("vigil logs -f did not return after cancellation")
		}
	}()

	waitOutput := func(want string) {
		t.Helper()
		require.Eventually(t, func() bool { return stdout.String() == want },
			10*time.Second, 5*time.Millisecond, "want %q, have %q", want, stdout.String())
	}
	waitOutput("old2\n")

	appendTo := func(s string) {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		require.NoError(t, err)
		_, err = f.WriteString(s)
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
	appendTo("new1\nhalf")
	waitOutput("old2\nnew1\n")
	appendTo(" done\n")
	waitOutput("old2\nnew1\nhalf done\n")

	// Rotate as the supervisor does: the file becomes w.log.1, a new w.log
	// starts. A line written to the old file just before is not lost.
	appendTo("last of old\n")
	require.NoError(t, os.Rename(path, path+".1"))
	writeLogs(t, dir, map[string]string{"w.log": "first of new\n"})
	waitOutput("old2\nnew1\nhalf done\nlast of old\nfirst of new\n")
	appendTo("second of new\n")
	waitOutput("old2\nnew1\nhalf done\nlast of old\nfirst of new\nsecond of new\n")
}

// The flags `vigil up` gets for the supervisor's new knobs are validated
// before anything starts, each error naming its flag.
func TestUpValidatesSupervisorFlags(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "v.db")
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--backoff-jitter", "1.5"}, "--backoff-jitter must be between 0 and 1, got 1.5"},
		{[]string{"--backoff-jitter", "-0.1"}, "--backoff-jitter must be between 0 and 1, got -0.1"},
		{[]string{"--flap-exits", "1"}, "--flap-exits must be at least 2, got 1"},
		{[]string{"--flap-window", "0s"}, "--flap-window must be positive, got 0s"},
		{[]string{"--log-dir", ""}, "--log-dir must not be empty"},
		{[]string{"--log-max-bytes", "10"}, "--log-max-bytes must be at least 1024, got 10"},
		{[]string{"--log-keep", "0"}, "--log-keep must be at least 1, got 0"},
	} {
		code, _, errOut := run(t, append([]string{"up", "--db", db}, tt.args...)...)
		require.Equal(t, exitFailure, code, "%v", tt.args)
		require.Contains(t, errOut, tt.want)
	}
	_, err := os.Stat(db)
	require.ErrorIs(t, err, os.ErrNotExist, "nothing started")
}

func TestDefaultLogDir(t *testing.T) {
	// Not parallel: sets the environment.
	t.Setenv("VIGIL_LOG_DIR", "")
	require.Equal(t, "vigil-logs", defaultLogDir("vigil.db"))
	require.Equal(t, "/var/lib/vigil/vigil-logs", defaultLogDir("/var/lib/vigil/vigil.db"))
	require.Equal(t, "vigil-logs", defaultLogDir("postgres://u@h/db"))
	require.Equal(t, "vigil-logs", defaultLogDir("postgresql://u@h/db"))
	t.Setenv("VIGIL_LOG_DIR", "/logs")
	require.Equal(t, "/logs", defaultLogDir("/var/lib/vigil/vigil.db"))
}
