//go:build linux

package supervisor

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// An agent that has not registered its instance within its startup timeout
// is killed, a startup_timeout event is recorded, and it is restarted; one
// that registered is left alone.
func TestSupervisorStartupTimeout(t *testing.T) {
	events := newEventLog()
	b := setup(t, Config{
		Agents: []Agent{
			{Name: "hangs", Command: []string{"sleep", "1000"}, StartupTimeout: 50 * time.Millisecond},
			{Name: "boots", Command: []string{"sleep", "1000"}, StartupTimeout: 50 * time.Millisecond},
		},
		Backoff: BackoffPolicy{Min: 10 * time.Millisecond, FastFailure: time.Hour, Max: 10 * time.Millisecond, Jitter: JitterOff},
		Events:  events,
		Registered: func(_ context.Context, agent string, since time.Time) (bool, error) {
			require.False(t, since.IsZero())
			return agent == "boots", nil
		},
	})
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
