//go:build linux

package supervisor

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// eventLog is an EventSink that keeps what it is given, in order.
type eventLog struct {
	mu     sync.Mutex
	events []Event
	added  chan struct{}
}

func newEventLog() *eventLog { return &eventLog{added: make(chan struct{}, 100)} }

func (l *eventLog) RecordEvent(_ context.Context, e Event) error {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
	select {
	case l.added <- struct{}{}:
	default: // nobody counts this many; never block the supervisor
	}
	return nil
}

func (l *eventLog) all() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.events...)
}

// DESIGN E1: an unexpected exit is an event with its code, run time and the
// last lines of stderr; a launch failure is one too; the stops of the
// supervisor's own shutdown are not (S3). Each says when its process was
// launched (or tried), on this host's monotonic clock, for the server to
// tell which planned stop covers it (E2).
func TestSupervisorRecordsProcessEvents(t *testing.T) {
	before := time.Now()
	events := newEventLog()
	b := setup(t, Config{
		Agents: []Agent{
			{Name: "crasher", Command: []string{"sh", "-c", `echo first >&2; echo "last words" >&2; exit 3`}},
			{Name: "ghost", Command: []string{"/nonexistent/agent"}},
			{Name: "sleeper", Command: []string{"sleep", "1000"}},
		},
		Backoff: BackoffPolicy{Min: time.Hour, FastFailure: time.Hour, Max: time.Hour}, // one run each
		Events:  events,
	})
	b.run(t)
	for range 2 {
		recv(t, events.added, "event")
	}
	b.stop(t)

	byAgent := map[string]Event{}
	for _, e := range events.all() {
		byAgent[e.Agent] = e
	}
	require.Len(t, byAgent, 2, "the sleeper stopped by the shutdown has no event: %v", events.all())

	crash := byAgent["crasher"]
	require.Equal(t, vigiltype.EventExit, crash.Kind)
	require.NotNil(t, crash.ExitCode)
	require.Equal(t, 3, *crash.ExitCode)
	require.Empty(t, crash.Signal)
	require.Equal(t, "first\nlast words\n", crash.StderrTail)
	require.Positive(t, crash.RunDuration)
	require.True(t, crash.Launched.After(before), "the launch, on this host's clock")
	require.GreaterOrEqual(t, time.Since(crash.Launched), crash.RunDuration, "launched a run time or more ago")

	ghost := byAgent["ghost"]
	require.Equal(t, vigiltype.EventLaunchFailure, ghost.Kind)
	require.Contains(t, ghost.Detail["error"], "/nonexistent/agent")
	require.True(t, ghost.Launched.After(before), "the attempt, on this host's clock")
}

func TestLineTailKeepsTheLastLines(t *testing.T) {
	tail := newLineTail(2, "a")
	for _, l := range []string{"[a] one\n", "[a] two\n", "[a] three\n"} {
		_, err := tail.Write([]byte(l))
		require.NoError(t, err)
	}
	require.Equal(t, "two\nthree\n", tail.String())
}

// An agent that keeps exiting gets one flapping event per episode, after the
// exit that made it flap, however long its runs.
func TestSupervisorRecordsFlapping(t *testing.T) {
	events := newEventLog()
	b := setup(t, Config{
		Agents:   []Agent{{Name: "looper", Command: []string{"true"}}},
		Backoff:  BackoffPolicy{Min: time.Millisecond, FastFailure: time.Nanosecond, Max: time.Millisecond}, // every run healthy
		Flapping: FlapPolicy{Exits: 3, Window: time.Hour},
		Events:   events,
	})
	b.run(t)
	require.Equal(t, 3, recv(t, b.sup.testSignals.flapping.ch, "flapping"))
	for range 6 { // several more exits within the episode
		recv(t, b.sup.testSignals.exited.ch, "exit")
	}
	b.stop(t)

	var kinds []vigiltype.EventKind
	for _, e := range events.all() {
		kinds = append(kinds, e.Kind)
	}
	require.GreaterOrEqual(t, len(kinds), 6)
	require.Equal(t, []vigiltype.EventKind{vigiltype.EventExit, vigiltype.EventExit, vigiltype.EventExit, vigiltype.EventFlapping},
		kinds[:4], "flapping follows the third exit")
	require.NotContains(t, kinds[4:], vigiltype.EventFlapping, "one event per episode")
	flap := events.all()[3]
	require.Equal(t, "looper", flap.Agent)
	require.Equal(t, map[string]any{"exits": 3, "window_s": 3600.0}, flap.Detail)
	require.Empty(t, b.sup.testSignals.flapping.ch)
	require.Equal(t, 1, b.logs.count(`msg="agent is flapping" agent=looper exits=3 window=1h0m0s`))
}
