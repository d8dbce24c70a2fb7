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
	l.added <- struct{}{}
	return nil
}

func (l *eventLog) all() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.events...)
}

// DESIGN E1: an unexpected exit is an event with its code, run time and the
// last lines of stderr; a launch failure is one too; the stops of the
// supervisor's own shutdown are not (S3).
func TestSupervisorRecordsProcessEvents(t *testing.T) {
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

	ghost := byAgent["ghost"]
	require.Equal(t, vigiltype.EventLaunchFailure, ghost.Kind)
	require.Contains(t, ghost.Detail["error"], "/nonexistent/agent")
}

func TestLineTailKeepsTheLastLines(t *testing.T) {
	tail := newLineTail(2, "a")
	for _, l := range []string{"[a] one\n", "[a] two\n", "[a] three\n"} {
		_, err := tail.Write([]byte(l))
		require.NoError(t, err)
	}
	require.Equal(t, "two\nthree\n", tail.String())
}
