package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// startUp runs `vigil up` on a one-agent fleet of the example worker named
// agent, with extra flags, and returns the server URL and the process.
func startUp(t *testing.T, agent string, flags ...string) (string, *proc) {
	t.Helper()
	dir := t.TempDir()
	prefix := "VIGIL_" + strings.ToUpper(strings.ReplaceAll(agent, "-", "_"))
	fleet := fmt.Sprintf(`agents:
  - name: %s
    command: [%q]
    env:
      %s_LIVENESS_INTERVAL: "1s"
      %s_HEARTBEAT_INTERVAL: "500ms"
      %s_POLL_INTERVAL: "100ms"
`, agent, bins.worker, prefix, prefix, prefix)
	path := filepath.Join(dir, "fleet.yaml")
	require.NoError(t, os.WriteFile(path, []byte(fleet), 0o644))
	args := append([]string{"up", "--fleet", path, "--db", filepath.Join(dir, "v.db"), "--addr", "127.0.0.1:0"}, flags...)
	p := start(t, nil, bins.vigil, args...)
	var url string
	eventually(t, 30*time.Second, "the server to log its URL", func() bool {
		m := servingRe.FindStringSubmatch(p.out.String())
		if m != nil {
			url = m[1]
		}
		return m != nil
	})
	return url, p
}

func events(t *testing.T, url string) []vigiltype.ProcessEvent {
	var page struct {
		Events []vigiltype.ProcessEvent `json:"events"`
	}
	vigil(t, url, &page, "events", "--limit", "1000")
	return page.Events
}

func countKind(evs []vigiltype.ProcessEvent, kind vigiltype.EventKind) int {
	n := 0
	for _, e := range evs {
		if e.Kind == kind {
			n++
		}
	}
	return n
}

// DESIGN S4 with real processes: a worker holding a task past stall_after
// is killed, the task goes back to scheduled with one more reclaim, and one
// stall_kill event is recorded. (A long backoff keeps the restarted worker
// from claiming the task again before the test has looked.)
func TestStalledWorkerIsKilledAndItsTaskTakenBack(t *testing.T) {
	t.Parallel()
	url, _ := startUp(t, "stuck", "--stall-after", "2s", "--stall-check", "200ms",
		"--backoff-min", "1m", "--backoff-max", "1m")
	queued := enqueue(t, url, `{"seconds":600}`)
	waitRunning(t, url, queued.TaskID)

	var evs []vigiltype.ProcessEvent
	eventually(t, 60*time.Second, "a stall_kill event", func() bool {
		evs = events(t, url)
		return countKind(evs, vigiltype.EventStallKill) > 0
	})
	require.Equal(t, 1, countKind(evs, vigiltype.EventStallKill))
	require.Zero(t, countKind(evs, vigiltype.EventExit), "the stall kill is not also reported as an exit")
	var back vigiltype.Task
	eventually(t, 30*time.Second, "the task to be taken back", func() bool {
		back = task(t, url, queued.TaskID)
		return back.Status == vigiltype.TaskScheduled
	})
	require.Equal(t, 1, back.Reclaims)
	require.Nil(t, back.StartedAt)
	require.Contains(t, *back.LastError, "stall kill")
}

// With an approval pending, nothing is stall-killed.
func TestPendingApprovalSuppressesStallKills(t *testing.T) {
	t.Parallel()
	url, up := startUp(t, "waiting", "--stall-after", "1s", "--stall-check", "100ms",
		"--pending-approval-cmd", "true", "--log-level", "debug") // later checks say it at debug
	queued := enqueue(t, url, `{"seconds":600}`)
	waitRunning(t, url, queued.TaskID)
	eventually(t, 60*time.Second, "five stall checks held back by the pending approval", func() bool {
		return strings.Count(up.out.String(), "an approval is pending; killing nothing") >= 5
	})
	require.Zero(t, countKind(events(t, url), vigiltype.EventStallKill))
	running := task(t, url, queued.TaskID)
	require.Equal(t, vigiltype.TaskRunning, running.Status)
	require.Zero(t, running.Reclaims)
}

func waitRunning(t *testing.T, url string, id int64) {
	t.Helper()
	eventually(t, 30*time.Second, "the task to be claimed", func() bool {
		return task(t, url, id).Status == vigiltype.TaskRunning
	})
}

// A pending-approval check that fails — its command missing, or still
// running at --pending-approval-timeout — fails open: nothing is
// stall-killed, and each failure is logged and counted (issue #14: through
// sh -c a missing command exited 127, counted as "none pending", and the
// stall kill went ahead; a hanging one held the check loop for good).
func TestFailedApprovalCheckFailsOpen(t *testing.T) {
	t.Parallel()
	for name, flags := range map[string][]string{
		"missing": {"--pending-approval-cmd", "/nonexistent/approvals --pending"},
		"hanging": {"--pending-approval-cmd", "sleep 600", "--pending-approval-timeout", "200ms"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			url, up := startUp(t, "waiting", append([]string{"--stall-after", "1s", "--stall-check", "100ms"}, flags...)...)
			queued := enqueue(t, url, `{"seconds":600}`)
			waitRunning(t, url, queued.TaskID)
			eventually(t, 60*time.Second, "three failed approval checks", func() bool {
				return strings.Count(up.out.String(), "pending-approval check failed; failing open") >= 3
			})
			require.Zero(t, countKind(events(t, url), vigiltype.EventStallKill))
			running := task(t, url, queued.TaskID)
			require.Equal(t, vigiltype.TaskRunning, running.Status)
			require.Zero(t, running.Reclaims)

			resp, err := http.Get(url + "/metrics")
			require.NoError(t, err)
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			m := regexp.MustCompile(`(?m)^vigil_stall_approval_check_failures_total (\d+)`).FindSubmatch(body)
			require.NotNil(t, m, "the failures are counted")
			n, err := strconv.Atoi(string(m[1]))
			require.NoError(t, err)
			require.GreaterOrEqual(t, n, 3)
		})
	}
}
