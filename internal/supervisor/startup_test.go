//go:build linux

package supervisor

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// An agent that has not registered its instance within its startup timeout
// is killed, a startup_timeout event is recorded, and it is restarted; one
// that registered is left alone. Only an instance of the launched process
// counts: its pid on this host. The server is asked for the instances
// registered since the launch as a duration, never a time of this host's
// clock (DESIGN L10).
func TestSupervisorStartupTimeout(t *testing.T) {
	events := newEventLog()
	var sup *Supervisor
	pidOf := func(agent string) int {
		for _, st := range sup.Status() {
			if st.Name == agent {
				return st.PID
			}
		}
		return 0
	}
	b := setup(t, Config{
		Agents: []Agent{
			{Name: "hangs", Command: []string{"sleep", "1000"}, StartupTimeout: 50 * time.Millisecond},
			{Name: "boots", Command: []string{"sleep", "1000"}, StartupTimeout: 50 * time.Millisecond},
		},
		Backoff: BackoffPolicy{Min: 10 * time.Millisecond, FastFailure: time.Hour, Max: 10 * time.Millisecond, Jitter: JitterOff},
		Events:  events,
		Host:    "box1",
		Registered: func(_ context.Context, agent string, within time.Duration) ([]*vigiltype.Process, error) {
			require.GreaterOrEqual(t, within, 50*time.Millisecond, "the time since the launch")
			require.Less(t, within, time.Minute, "the time since the launch")
			if agent == "boots" {
				return []*vigiltype.Process{{ProcessKind: agent, Hostname: "box1", PID: pidOf(agent)}}, nil
			}
			// Not the launched process: another host's with its pid, and
			// this host's under another pid.
			return []*vigiltype.Process{
				{ProcessKind: agent, Hostname: "box2", PID: pidOf(agent)},
				{ProcessKind: agent, Hostname: "box1", PID: os.Getpid()},
			}, nil
		},
	})
	sup = b.sup
	b.run(t)
	for range 2 {
		recv(t, b.sup.testSignals.started.ch, "start")
	}
	results := map[bool]int{}
	for range 2 {
		results[recv(t, b.sup.testSignals.startupChecked.ch, "startup check")]++
	}
	require.Equal(t, map[bool]int{true: 1, false: 1}, results)
	require.Contains(t, recv(t, b.sup.testSignals.exited.ch, "the kill"), "startup timeout: ")
	recv(t, b.sup.testSignals.started.ch, "the restart")
	b.stop(t)

	var timeouts []Event
	for _, e := range events.all() {
		if e.Kind == vigiltype.EventStartupTimeout {
			timeouts = append(timeouts, e)
		}
	}
	require.NotEmpty(t, timeouts)
	for _, e := range timeouts {
		require.Equal(t, "hangs", e.Agent)
	}
}

// An agent started through a wrapper (`go run`, `sh -c`) registers under
// its own pid, a descendant of the launched process: that counts too.
func TestSupervisorStartupCheckFindsAWrappedAgent(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	b := setup(t, Config{
		Agents: []Agent{{Name: "wrapped", StartupTimeout: time.Second, // time for sh to write the pid file
			Command: []string{"sh", "-c", `sleep 1000 & echo $! > "$PIDFILE"; wait`}, Env: map[string]string{"PIDFILE": pidFile}}},
		Backoff: BackoffPolicy{Min: time.Hour, FastFailure: time.Hour, Max: time.Hour, Jitter: JitterOff},
		Events:  newEventLog(),
		Host:    "box1",
		Registered: func(_ context.Context, agent string, _ time.Duration) ([]*vigiltype.Process, error) {
			data, err := os.ReadFile(pidFile)
			if err != nil {
				return nil, nil // not registered yet
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
			require.NoError(t, err)
			return []*vigiltype.Process{{ProcessKind: agent, Hostname: "box1", PID: pid}}, nil
		},
	})
	b.run(t)
	leader := recv(t, b.sup.testSignals.started.ch, "start")
	require.True(t, recv(t, b.sup.testSignals.startupChecked.ch, "startup check"), "the wrapped process registered")
	data, err := os.ReadFile(pidFile)
	require.NoError(t, err)
	require.NotEqual(t, strconv.Itoa(leader), strings.TrimSpace(string(data)), "a descendant, not the leader")
	b.stop(t)
}
