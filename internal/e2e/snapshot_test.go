package e2e

import (
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// snapshotRow reads `vigil snapshot --json` and returns agent's row.
func snapshotRow(t *testing.T, url, agent string) *vigiltype.AgentSnapshot {
	t.Helper()
	var snap vigiltype.FleetSnapshot
	vigil(t, url, &snap, "snapshot")
	for _, row := range snap.Agents {
		if row.Source == "registry" && row.Agent == agent {
			return row
		}
	}
	t.Fatalf("no snapshot row for agent %s", agent)
	return nil
}

// DESIGN F3 with a supervised agent and real signals: `vigil up` runs one
// example worker; the worker SIGKILLed shows down (process not_running,
// declared still active) until the supervisor restarts it, and idle again
// with its new instance after.
//
// The window is made observable by the backoff, not by timing luck: the
// restart waits --backoff-min (15s) after the kill, while the snapshot
// shows the kill within the discovery cache's 7.5s (DESIGN F4: the lookup
// of the killed pid may have been cached as found by the snapshot taken
// just before). The restart is checked not to have happened when down is
// seen, from the supervisor's own log.
func TestSnapshotShowsAKilledAgentDownUntilRestarted(t *testing.T) {
	t.Parallel()
	const agent = "sentry"
	url, up := startUp(t, agent, "--backoff-min", "15s", "--backoff-max", "15s")
	starts := func() int { return strings.Count(up.out.String(), `msg="agent started" agent=`+agent) }

	var before *vigiltype.AgentSnapshot
	eventually(t, 60*time.Second, "the agent's instance running in the snapshot", func() bool {
		before = snapshotRow(t, url, agent)
		return before.InstanceID != nil && before.ProcessState == vigiltype.ProcessRunning
	})
	require.Equal(t, vigiltype.StateIdle, before.OperationalState, "no task: idle")
	require.Equal(t, "os", before.ProcessSignal, "this host's agent: the OS decides")
	require.Equal(t, 1, starts())

	require.NoError(t, syscall.Kill(before.PID, syscall.SIGKILL))
	var down *vigiltype.AgentSnapshot
	eventually(t, 30*time.Second, "the killed agent down", func() bool {
		down = snapshotRow(t, url, agent)
		return down.ProcessState != vigiltype.ProcessRunning
	})
	require.Equal(t, 1, starts(), "seen before the restart")
	require.Equal(t, *before.InstanceID, *down.InstanceID, "still the killed instance: no new one registered")
	require.Equal(t, vigiltype.ProcessNotRunning, down.ProcessState)
	require.Equal(t, vigiltype.StateDown, down.OperationalState)
	require.Equal(t, "active", down.DeclaredStatus, "declared active, not running: the mismatch shows")
	require.Empty(t, down.TelemetryErrors)

	var after *vigiltype.AgentSnapshot
	eventually(t, 60*time.Second, "the restarted agent's new instance running", func() bool {
		after = snapshotRow(t, url, agent)
		return *after.InstanceID != *before.InstanceID && after.ProcessState == vigiltype.ProcessRunning
	})
	require.Equal(t, 2, starts(), "restarted once")
	require.Contains(t, []vigiltype.OperationalState{vigiltype.StateIdle, vigiltype.StateWorking}, after.OperationalState)
	require.NotEqual(t, before.PID, after.PID)
	ev := after.LatestProcessEvent
	require.NotNil(t, ev, "the kill is on record")
	require.Equal(t, vigiltype.EventExit, ev.Kind)
	require.Equal(t, "killed", ev.Signal)

	resp, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Contains(t, string(body), `vigil_restarts_total{agent="`+agent+`"} 1`, "vigil up counts the restart in /metrics")
}
