//go:build linux

package supervisor

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/clock"
	"github.com/vigil-fleet/vigil/internal/metrics"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// newMetrics returns vigil's metrics for the Restarted and StallKilled
// hooks. Its store-backed gauge is never scraped here, so it has no store.
func newMetrics() *metrics.Metrics {
	return metrics.New(nil, clock.Real{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// value reads a counter.
func value(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}

// series counts the label sets a vector has.
func series(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric, 100)
	c.Collect(ch)
	close(ch)
	return len(ch)
}

// vigil_restarts_total{agent} counts relaunches of a real process that
// keeps exiting, never its first launch.
func TestSupervisorMetricsCountRestarts(t *testing.T) {
	m := newMetrics()
	b := setup(t, Config{
		Agents: []Agent{
			{Name: "crasher", Command: []string{"sh", "-c", "exit 1"}},
			{Name: "steady", Command: []string{"sleep", "1000"}},
		},
		Backoff:   BackoffPolicy{Min: 10 * time.Millisecond, FastFailure: time.Hour, Max: 10 * time.Millisecond, Jitter: JitterOff},
		Restarted: m.Restarted, StallKilled: m.StallKilled,
	})
	b.run(t)
	starts := 0
	for range 4 { // steady's launch and crasher's first three
		recv(t, b.sup.testSignals.started.ch, "a start")
		starts++
	}
	b.stop(t)
	for range len(b.sup.testSignals.started.ch) { // starts between the last receive and the stop
		<-b.sup.testSignals.started.ch
		starts++
	}

	crasher := value(t, m.Restarts.WithLabelValues("crasher"))
	require.GreaterOrEqual(t, crasher, 2.0, "at least two relaunches after exits")
	require.Equal(t, float64(starts-2), crasher, "every start but each agent's first is a restart")
	require.Equal(t, float64(b.sup.Status()[0].Restarts), crasher)
	require.Zero(t, value(t, m.Restarts.WithLabelValues("steady")), "a first launch is not a restart")
	require.Zero(t, series(m.StallKills), "no stall kills")
}

// vigil_stall_kills_total{agent} counts a stall kill of a real process,
// and its relaunch counts as a restart (DESIGN S4; the setup of
// TestSupervisorStallKill).
func TestSupervisorMetricsCountStallKills(t *testing.T) {
	m := newMetrics()
	source := &stallTasks{byKind: map[string][]*vigiltype.Task{"wedged": {stalledTask(7)}}}
	b := setup(t, Config{
		Agents: []Agent{
			{Name: "wedged", Command: []string{"sleep", "1000"}},
			{Name: "healthy", Command: []string{"sleep", "1000"}},
		},
		Backoff:   BackoffPolicy{Min: 10 * time.Millisecond, FastFailure: time.Hour, Max: 10 * time.Millisecond, Jitter: JitterOff},
		Events:    newEventLog(),
		Stall:     &StallConfig{Source: source, After: time.Minute, Every: 20 * time.Millisecond},
		Restarted: m.Restarted, StallKilled: m.StallKilled,
	})
	b.run(t)
	recv(t, b.sup.testSignals.started.ch, "start")
	recv(t, b.sup.testSignals.started.ch, "start")
	require.Equal(t, 1, waitStallCheck(t, b, func(n int) bool { return n > 0 }), "one agent killed")
	require.Equal(t, 1.0, value(t, m.StallKills.WithLabelValues("wedged")))
	require.Contains(t, recv(t, b.sup.testSignals.exited.ch, "the kill"), "stall kill: ")
	recv(t, b.sup.testSignals.started.ch, "the restart")
	require.Equal(t, 1.0, value(t, m.Restarts.WithLabelValues("wedged")), "the relaunch after the kill")
	b.stop(t)

	require.Equal(t, 1.0, value(t, m.StallKills.WithLabelValues("wedged")), "one kill: the task was taken back")
	require.Equal(t, 1, series(m.StallKills), "the healthy agent was not killed")
	require.Zero(t, value(t, m.Restarts.WithLabelValues("healthy")))
}
