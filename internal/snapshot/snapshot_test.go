package snapshot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/clock"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// DESIGN F3: the precedence, over every combination of its inputs.
func TestOperationalPrecedence(t *testing.T) {
	t.Parallel()
	const (
		act  = "active"
		stp  = "stopped"
		self = DeclaredSelfSupervising
		run  = ProcessRunning
		not  = ProcessNotRunning
		unk  = ProcessUnknown
	)
	cases := []struct {
		telemetryFailed bool
		declared        string
		ps              ProcessState
		task            bool
		want            OperationalState
	}{
		// A telemetry read failure wins over everything.
		{true, act, run, true, StateTelemetryMissing},
		{true, act, run, false, StateTelemetryMissing},
		{true, act, not, true, StateTelemetryMissing},
		{true, act, not, false, StateTelemetryMissing},
		{true, act, unk, true, StateTelemetryMissing},
		{true, act, unk, false, StateTelemetryMissing},
		{true, stp, run, true, StateTelemetryMissing},
		{true, stp, run, false, StateTelemetryMissing},
		{true, stp, not, true, StateTelemetryMissing},
		{true, stp, not, false, StateTelemetryMissing},
		{true, stp, unk, true, StateTelemetryMissing},
		{true, stp, unk, false, StateTelemetryMissing},
		{true, self, run, true, StateTelemetryMissing},
		{true, self, run, false, StateTelemetryMissing},
		{true, self, not, true, StateTelemetryMissing},
		{true, self, not, false, StateTelemetryMissing},
		{true, self, unk, true, StateTelemetryMissing},
		{true, self, unk, false, StateTelemetryMissing},
		// Then declared stopped, whatever the process does.
		{false, stp, run, true, StateStopped},
		{false, stp, run, false, StateStopped},
		{false, stp, not, true, StateStopped},
		{false, stp, not, false, StateStopped},
		{false, stp, unk, true, StateStopped},
		{false, stp, unk, false, StateStopped},
		// Then running: working with a task, idle without.
		{false, act, run, true, StateWorking},
		{false, act, run, false, StateIdle},
		{false, self, run, true, StateWorking},
		{false, self, run, false, StateIdle},
		// Else down, unknown included.
		{false, act, not, true, StateDown},
		{false, act, not, false, StateDown},
		{false, act, unk, true, StateDown},
		{false, act, unk, false, StateDown},
		{false, self, not, true, StateDown},
		{false, self, not, false, StateDown},
		{false, self, unk, true, StateDown},
		{false, self, unk, false, StateDown},
	}
	seen := map[string]bool{}
	for _, c := range cases {
		key := fmt.Sprintf("telemetry_failed=%t/declared=%s/process=%s/task=%t", c.telemetryFailed, c.declared, c.ps, c.task)
		require.False(t, seen[key], "duplicate case %s", key)
		seen[key] = true
		require.Equal(t, c.want, Operational(c.telemetryFailed, c.declared, c.ps, c.task), key)
	}
	require.Len(t, seen, 2*3*3*2, "every combination is in the table")
}

func TestMatchInstance(t *testing.T) {
	t.Parallel()
	started := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	tol := StartToleranceDefault
	cases := []struct {
		name string
		l    Lookup
		want ProcessState
	}{
		{"no process holds the pid", Lookup{}, ProcessNotRunning},
		{"created before registering", Lookup{Found: true, CreatedAt: started.Add(-time.Hour)}, ProcessRunning},
		{"created at registration", Lookup{Found: true, CreatedAt: started}, ProcessRunning},
		{"within the tolerance", Lookup{Found: true, CreatedAt: started.Add(tol)}, ProcessRunning},
		{"pid reused after registration", Lookup{Found: true, CreatedAt: started.Add(tol + time.Millisecond)}, ProcessNotRunning},
	}
	for _, c := range cases {
		require.Equal(t, c.want, MatchInstance(c.l, started, tol), c.name)
	}
}

// countingFinder answers from a map and counts the questions.
type countingFinder struct {
	answers map[int]Lookup
	err     error
	calls   int
}

func (f *countingFinder) Find(_ context.Context, pid int) (Lookup, error) {
	f.calls++
	if f.err != nil {
		return Lookup{}, f.err
	}
	return f.answers[pid], nil
}

// DESIGN F4: hits and misses are reused for 7.5s, errors are not; no sleeps.
func TestCachedFinder(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	hit := Lookup{Found: true, CreatedAt: clk.Now().Add(-time.Minute)}
	f := &countingFinder{answers: map[int]Lookup{10: hit}}
	c := newCachedFinder(f, clk, DiscoveryCacheTTLDefault)
	ctx := t.Context()

	for range 3 {
		l, err := c.Find(ctx, 10)
		require.NoError(t, err)
		require.Equal(t, hit, l)
		l, err = c.Find(ctx, 11)
		require.NoError(t, err)
		require.False(t, l.Found)
	}
	require.Equal(t, 2, f.calls, "one lookup per pid, hit (10) and miss (11)")

	// The OS changes; the cache does not see it until the TTL passes.
	f.answers = map[int]Lookup{11: hit}
	clk.Advance(DiscoveryCacheTTLDefault - time.Millisecond)
	l, err := c.Find(ctx, 10)
	require.NoError(t, err)
	require.True(t, l.Found, "a hit is reused just under 7.5s")
	l, err = c.Find(ctx, 11)
	require.NoError(t, err)
	require.False(t, l.Found, "a miss is reused just under 7.5s")
	require.Equal(t, 2, f.calls)

	clk.Advance(time.Millisecond)
	l, err = c.Find(ctx, 10)
	require.NoError(t, err)
	require.False(t, l.Found, "at 7.5s the hit expired")
	l, err = c.Find(ctx, 11)
	require.NoError(t, err)
	require.True(t, l.Found, "at 7.5s the miss expired")
	require.Equal(t, 4, f.calls)

	// Errors are not cached.
	clk.Advance(DiscoveryCacheTTLDefault)
	f.err = errors.New("access denied")
	_, err = c.Find(ctx, 12)
	require.ErrorContains(t, err, "access denied")
	_, err = c.Find(ctx, 12)
	require.Error(t, err)
	require.Equal(t, 6, f.calls)
	f.err = nil
	_, err = c.Find(ctx, 12)
	require.NoError(t, err)
	require.Equal(t, 7, f.calls)
}

// A real lookup of this test process and of a pid nobody holds.
func TestOSFinder(t *testing.T) {
	t.Parallel()
	l, err := OSFinder{}.Find(t.Context(), os.Getpid())
	require.NoError(t, err)
	require.True(t, l.Found)
	require.WithinDuration(t, time.Now(), l.CreatedAt, time.Hour)
	require.False(t, l.CreatedAt.After(time.Now().Add(time.Second)))

	l, err = OSFinder{}.Find(t.Context(), 0)
	require.NoError(t, err)
	require.False(t, l.Found)
}

// --- Service, over fakes ---

type fakeRegistry struct {
	agents []*vigiltype.Agent
	err    error
}

func (f *fakeRegistry) List(context.Context) ([]*vigiltype.Agent, error) { return f.agents, f.err }

type fakeLiveness map[string]*vigiltype.Process

func (f fakeLiveness) Latest(_ context.Context, kind string) (*vigiltype.Process, error) {
	if p, ok := f[kind]; ok {
		if p == nil {
			return nil, errors.New("database is locked")
		}
		return p, nil
	}
	return nil, fmt.Errorf("no process of kind %q: %w", kind, vigiltype.ErrNotFound)
}

type fakeTasks struct {
	running map[string][]*vigiltype.Task
	err     error
}

func (f *fakeTasks) RunningTasks(_ context.Context, instanceID string) ([]*vigiltype.Task, error) {
	return f.running[instanceID], f.err
}

type fakeEvents struct {
	latest map[string]*vigiltype.ProcessEvent
	err    error
}

func (f *fakeEvents) LatestEvent(_ context.Context, agent string) (*vigiltype.ProcessEvent, error) {
	return f.latest[agent], f.err
}

type testBundle struct {
	clock    *clock.Fake
	registry *fakeRegistry
	liveness fakeLiveness
	tasks    *fakeTasks
	events   *fakeEvents
	finder   *countingFinder
	svc      *Service
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	b := &testBundle{
		clock:    clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)),
		registry: &fakeRegistry{},
		liveness: fakeLiveness{},
		tasks:    &fakeTasks{running: map[string][]*vigiltype.Task{}},
		events:   &fakeEvents{latest: map[string]*vigiltype.ProcessEvent{}},
		finder:   &countingFinder{answers: map[int]Lookup{}},
	}
	var err error
	b.svc, err = New(Config{
		Registry: b.registry, Liveness: b.liveness, Tasks: b.tasks, Events: b.events,
		Finder: b.finder, Clock: b.clock, Hostname: "here", SelfPID: 4242,
	})
	require.NoError(t, err)
	return b
}

func (b *testBundle) agent(name string, st vigiltype.AgentStatus) {
	b.registry.agents = append(b.registry.agents, &vigiltype.Agent{Name: name, Status: st})
}

func (b *testBundle) instance(kind, host string, pid int, status vigiltype.ProcessStatus) *vigiltype.Process {
	p := &vigiltype.Process{
		InstanceID: "inst-" + kind, ProcessKind: kind, Hostname: host, PID: pid,
		StartedAt: b.clock.Now(), Status: status,
	}
	b.liveness[kind] = p
	return p
}

func rowsByName(t *testing.T, s *Snapshot) map[string]*Agent {
	t.Helper()
	m := map[string]*Agent{}
	for _, r := range s.Agents[1:] {
		m[r.Agent] = r
	}
	return m
}

func TestTake(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.agent("local-working", vigiltype.AgentActive)
	b.instance("local-working", "here", 100, vigiltype.ProcessStopped) // the OS decides, not liveness
	b.finder.answers[100] = Lookup{Found: true, CreatedAt: b.clock.Now().Add(-time.Second)}
	owner := "inst-local-working"
	b.tasks.running[owner] = []*vigiltype.Task{{TaskID: 7, TaskType: "crawl", LeaseOwner: &owner}}

	b.agent("local-reused", vigiltype.AgentActive)
	b.instance("local-reused", "here", 101, vigiltype.ProcessAlive)
	b.finder.answers[101] = Lookup{Found: true, CreatedAt: b.clock.Now().Add(time.Minute)}

	b.agent("local-gone", vigiltype.AgentActive)
	b.instance("local-gone", "here", 102, vigiltype.ProcessAlive)

	b.agent("remote-alive", vigiltype.AgentActive)
	b.instance("remote-alive", "elsewhere", 100, vigiltype.ProcessAlive)
	b.agent("remote-stopped", vigiltype.AgentActive)
	b.instance("remote-stopped", "elsewhere", 100, vigiltype.ProcessStopped)

	b.agent("never", vigiltype.AgentActive)
	b.agent("declared-stopped", vigiltype.AgentStopped)
	b.instance("declared-stopped", "elsewhere", 5, vigiltype.ProcessAlive)
	b.agent("store-fails", vigiltype.AgentActive)
	b.liveness["store-fails"] = nil
	b.agent("vigil", vigiltype.AgentActive) // same name as the self row: no dedup

	exit := 1
	b.events.latest["local-gone"] = &vigiltype.ProcessEvent{EventID: 3, Agent: "local-gone", Kind: vigiltype.EventExit, ExitCode: &exit}

	b.clock.Advance(1500 * time.Microsecond) // taken_at keeps the stores' millisecond precision
	snap, err := b.svc.Take(t.Context())
	require.NoError(t, err)
	require.Equal(t, b.clock.Now().Truncate(time.Millisecond), snap.TakenAt)
	require.NotEqual(t, b.clock.Now(), snap.TakenAt)
	require.Len(t, snap.Agents, 1+len(b.registry.agents))

	self := snap.Agents[0]
	require.Equal(t, "vigil", self.Agent)
	require.Equal(t, SourceSelf, self.Source)
	require.Equal(t, DeclaredSelfSupervising, self.DeclaredStatus)
	require.Equal(t, ProcessRunning, self.ProcessState)
	require.Equal(t, StateIdle, self.OperationalState)
	require.Equal(t, 4242, self.PID)

	rows := rowsByName(t, snap)
	check := func(name string, ps ProcessState, signal string, st OperationalState) {
		t.Helper()
		r := rows[name]
		require.NotNil(t, r, name)
		require.Equal(t, ps, r.ProcessState, name)
		require.Equal(t, signal, r.ProcessSignal, name)
		require.Equal(t, st, r.OperationalState, name)
	}
	check("local-working", ProcessRunning, SignalOS, StateWorking)
	require.Equal(t, []TaskRef{{TaskID: 7, TaskType: "crawl"}}, rows["local-working"].RunningTasks)
	check("local-reused", ProcessNotRunning, SignalOS, StateDown)
	check("local-gone", ProcessNotRunning, SignalOS, StateDown)
	require.Equal(t, int64(3), rows["local-gone"].LatestProcessEvent.EventID)
	check("remote-alive", ProcessRunning, SignalLiveness, StateIdle)
	check("remote-stopped", ProcessNotRunning, SignalLiveness, StateDown)
	check("never", ProcessNotRunning, SignalNone, StateDown)
	require.Nil(t, rows["never"].InstanceID)
	check("declared-stopped", ProcessRunning, SignalLiveness, StateStopped)
	check("store-fails", ProcessUnknown, SignalNone, StateTelemetryMissing)
	require.Equal(t, []string{"read newest instance: database is locked"}, rows["store-fails"].TelemetryErrors)
	check("vigil", ProcessNotRunning, SignalNone, StateDown)
	require.Equal(t, SourceRegistry, rows["vigil"].Source)
	require.Empty(t, rows["local-working"].TelemetryErrors)
	require.NotNil(t, rows["local-working"].TelemetryErrors, "an empty list, not null")
}

// A failed telemetry read is listed and wins over every other state (F3);
// a failed OS lookup makes process_state unknown, and down.
func TestTakeReadFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.agent("a", vigiltype.AgentStopped)
	b.instance("a", "here", 100, vigiltype.ProcessAlive)
	b.tasks.err = errors.New("tasks table unreadable")
	b.events.err = errors.New("events table unreadable")

	snap, err := b.svc.Take(t.Context())
	require.NoError(t, err)
	r := snap.Agents[1]
	require.Equal(t, StateTelemetryMissing, r.OperationalState)
	require.Equal(t, string(vigiltype.AgentStopped), r.DeclaredStatus, "the declared intent survives")
	require.Equal(t, []string{
		"read running tasks: tasks table unreadable",
		"read latest process event: events table unreadable",
	}, r.TelemetryErrors)

	b.tasks.err, b.events.err = nil, nil
	b.registry.agents[0].Status = vigiltype.AgentActive
	b.finder.err = errors.New("permission denied")
	b.clock.Advance(DiscoveryCacheTTLDefault) // the first snapshot's miss expires
	snap, err = b.svc.Take(t.Context())
	require.NoError(t, err)
	r = snap.Agents[1]
	require.Equal(t, ProcessUnknown, r.ProcessState)
	require.Equal(t, "permission denied", r.ProcessError)
	require.Equal(t, StateDown, r.OperationalState, "unknown is down")
	require.Empty(t, r.TelemetryErrors)

	b.registry.err = errors.New("agents table unreadable")
	_, err = b.svc.Take(t.Context())
	require.ErrorContains(t, err, "agents table unreadable")
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	_, err := New(Config{})
	require.ErrorContains(t, err, "required")
}
