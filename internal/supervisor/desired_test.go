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

// desiredMap is a DesiredSource an operator edits in the test.
type desiredMap struct {
	mu sync.Mutex
	m  map[string]Desired
}

func (d *desiredMap) Desired(_ context.Context, agent string) (Desired, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if v, ok := d.m[agent]; ok {
		return v, nil
	}
	return Desired{}, vigiltype.ErrNotFound
}

func (d *desiredMap) set(agent string, v Desired) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.m[agent] = v
}

// vigil stop keeps an agent down across its backoff; vigil start brings it
// back; vigil restart (a planned stop newer than the process) restarts it
// at once. Each operator kill is reported as an exit event (which the
// planned stop, on the server, marks suppressed).
func TestSupervisorFollowsDesiredState(t *testing.T) {
	desired := &desiredMap{m: map[string]Desired{}}
	events := newEventLog()
	b := setup(t, Config{
		Agents:      []Agent{{Name: "research", Command: []string{"sleep", "1000"}}},
		Backoff:     BackoffPolicy{Min: time.Hour, FastFailure: time.Hour, Max: time.Hour, Jitter: JitterOff},
		Events:      events,
		Desired:     desired,
		DesiredPoll: 10 * time.Millisecond,
	})
	b.run(t)
	first := recv(t, b.sup.testSignals.started.ch, "start")

	desired.set("research", Desired{Status: vigiltype.AgentStopped, PlannedStop: &Marker{ID: "stop"}})
	require.Contains(t, recv(t, b.sup.testSignals.exited.ch, "the stop"), "stopped by an operator: ")
	require.Equal(t, "research", recv(t, b.sup.testSignals.heldStopped.ch, "held down"))
	for range 5 { // several polls while stopped: nothing starts
		recv(t, b.sup.testSignals.desiredApplied.ch, "poll")
	}
	require.Empty(t, b.sup.testSignals.started.ch, "a stopped agent stays down")
	requireGone(t, first)

	desired.set("research", Desired{Status: vigiltype.AgentActive})
	second := recv(t, b.sup.testSignals.started.ch, "the start")

	// The marker's age stays 0 here, as if the server's clock stood still:
	// it is acted on once all the same, by its identity.
	desired.set("research", Desired{Status: vigiltype.AgentActive, PlannedStop: &Marker{ID: "restart"}})
	require.Contains(t, recv(t, b.sup.testSignals.exited.ch, "the restart"), "restarted by an operator: ")
	third := recv(t, b.sup.testSignals.started.ch, "started again at once, despite the 1h backoff")
	require.NotEqual(t, second, third)
	for range 5 { // the marker was acted on: no more restarts
		recv(t, b.sup.testSignals.desiredApplied.ch, "poll")
	}
	require.Empty(t, b.sup.testSignals.exited.ch)
	b.stop(t)

	var exits int
	for _, e := range events.all() {
		if e.Kind == vigiltype.EventExit {
			exits++
		}
	}
	require.Equal(t, 2, exits, "the stop and the restart are each an exit event; the shutdown is not")
}

// vigil stop writes a planned stop and then marks the agent stopped: a poll
// that reads the marker before the mark must not restart the agent (which
// would record a second exit and start a process only to stop it). A
// restart acts when the same marker is seen on two polls in a row. The
// polls are made by the test (the loop's own waits an hour).
func TestSupervisorDoesNotReadAStopInProgressAsARestart(t *testing.T) {
	desired := &desiredMap{m: map[string]Desired{}}
	b := setup(t, Config{
		Agents:      []Agent{{Name: "research", Command: []string{"sleep", "1000"}}},
		Backoff:     BackoffPolicy{Min: time.Hour, FastFailure: time.Hour, Max: time.Hour, Jitter: JitterOff},
		Events:      newEventLog(),
		Desired:     desired,
		DesiredPoll: time.Hour,
	})
	b.run(t)
	first := recv(t, b.sup.testSignals.started.ch, "start")
	recv(t, b.sup.testSignals.desiredApplied.ch, "the loop's first poll")
	ctx := t.Context()

	// The first write of a stop: the marker, the agent still active.
	marker := &Marker{ID: "stop"}
	desired.set("research", Desired{Status: vigiltype.AgentActive, PlannedStop: marker})
	b.sup.applyDesired(ctx)
	require.Empty(t, b.sup.kills[0], "one sight of a marker kills nothing")
	// The second write: the mark. The next poll stops the agent.
	desired.set("research", Desired{Status: vigiltype.AgentStopped, PlannedStop: marker})
	b.sup.applyDesired(ctx)
	require.Contains(t, recv(t, b.sup.testSignals.exited.ch, "the stop"), "stopped by an operator: ")
	require.Equal(t, "research", recv(t, b.sup.testSignals.heldStopped.ch, "held down"))
	require.Empty(t, b.sup.testSignals.started.ch, "no restart in between")
	requireGone(t, first)

	// A real restart: active again, then a newer marker seen on two polls.
	desired.set("research", Desired{Status: vigiltype.AgentActive})
	b.sup.applyDesired(ctx)
	second := recv(t, b.sup.testSignals.started.ch, "the start")
	desired.set("research", Desired{Status: vigiltype.AgentActive, PlannedStop: &Marker{ID: "restart"}})
	b.sup.applyDesired(ctx)
	require.Empty(t, b.sup.kills[0])
	b.sup.applyDesired(ctx)
	require.Contains(t, recv(t, b.sup.testSignals.exited.ch, "the restart"), "restarted by an operator: ")
	require.NotEqual(t, second, recv(t, b.sup.testSignals.started.ch, "started again"))
	b.stop(t)
}

// A marker asks for a restart of the process that was running when it was
// written, once. The write is placed on this host's monotonic clock by the
// marker's age (measured by the server's clock), so a server whose clock is
// hours off changes nothing (DESIGN L10).
func TestRestartAskedPlacesTheMarkerByItsAge(t *testing.T) {
	launched := time.Now()
	polled := launched.Add(10 * time.Second)
	for _, c := range []struct {
		name      string
		m         *Marker
		restarted string
		want      bool
	}{
		{"no marker", nil, "", false},
		{"written after the launch", &Marker{ID: "a", Age: 5 * time.Second}, "", true},
		{"written before the launch (the one that restarted it, or from before the supervisor)", &Marker{ID: "a", Age: 15 * time.Second}, "", false},
		{"already acted on", &Marker{ID: "a", Age: 5 * time.Second}, "a", false},
		{"a new marker after one acted on", &Marker{ID: "b", Age: 5 * time.Second}, "a", true},
	} {
		require.Equal(t, c.want, restartAsked(c.m, c.restarted, launched, polled), c.name)
	}
}
