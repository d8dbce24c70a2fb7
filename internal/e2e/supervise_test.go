package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/testserver"
)

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// A supervisor killed with SIGKILL leaves its agents running; started
// again, it stops that old generation before launching its own, so the
// agent never runs twice.
func TestRestartedSupervisorStopsTheOldGeneration(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	dir := t.TempDir()
	pids := filepath.Join(dir, "pids")
	fleet := filepath.Join(dir, "fleet.yaml")
	require.NoError(t, os.WriteFile(fleet, []byte(`agents:
  - name: singleton
    command: ["sh", "-c", "echo $$ >> `+pids+`; exec sleep 1000"]
`), 0o644))
	args := []string{"supervise", "--server", srv.URL, "--fleet", fleet, "--log-dir", filepath.Join(dir, "logs"), "--stop-grace", "2s"}
	readPIDs := func() []int {
		b, _ := os.ReadFile(pids)
		var out []int
		for _, f := range strings.Fields(string(b)) {
			n, err := strconv.Atoi(f)
			require.NoError(t, err)
			out = append(out, n)
		}
		return out
	}

	// Agents run in process groups of their own, which the harness does
	// not kill: whatever this test started goes at the end.
	t.Cleanup(func() {
		for _, pid := range readPIDs() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	first := start(t, nil, bins.vigil, args...)
	eventually(t, 30*time.Second, "the first generation", func() bool { return len(readPIDs()) == 1 })
	old := readPIDs()[0]
	require.NoError(t, syscall.Kill(first.cmd.Process.Pid, syscall.SIGKILL))
	<-first.done
	require.True(t, alive(old), "a SIGKILLed supervisor leaves its agent running")

	second := start(t, nil, bins.vigil, args...)
	eventually(t, 30*time.Second, "the second generation", func() bool { return len(readPIDs()) == 2 })
	require.False(t, alive(old), "the old generation was stopped before the new one started")
	require.True(t, alive(readPIDs()[1]))
	require.Contains(t, second.out.String(), "left by a supervisor that is gone")
	require.NoError(t, syscall.Kill(second.cmd.Process.Pid, syscall.SIGTERM))
	<-second.done
	require.False(t, alive(readPIDs()[1]), "a supervisor stopped with SIGTERM stops its agent")
}
