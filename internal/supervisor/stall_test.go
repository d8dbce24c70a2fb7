//go:build linux

package supervisor

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// stallTasks is a StallSource over a fixed set of stalled tasks per kind;
// it records the reclaims asked of it.
type stallTasks struct {
	mu        sync.Mutex
	byKind    map[string][]*vigiltype.Task
	readErr   error
	reclaimed []int64
}

func (s *stallTasks) Stalled(_ context.Context, kind string, _ time.Duration) ([]*vigiltype.Task, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.readErr != nil {
		return nil, s.readErr
	}
	return s.byKind[kind], nil
}

func (s *stallTasks) ReclaimStalled(_ context.Context, taskID, epoch int64, _ string) (*vigiltype.Task, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reclaimed = append(s.reclaimed, taskID)
	// The task is no longer stalled: the next check finds nothing.
	for kind, tasks := range s.byKind {
		for j, t := range tasks {
			if t.TaskID == taskID {
				s.byKind[kind] = append(tasks[:j:j], tasks[j+1:]...)
				if t.LeaseEpoch != epoch {
					return nil, vigiltype.ErrStaleEpoch
				}
			}
		}
	}
	return &vigiltype.Task{TaskID: taskID}, nil
}

func (s *stallTasks) reclaims() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int64(nil), s.reclaimed...)
}

func stalledTask(id int64) *vigiltype.Task {
	started := time.Now().Add(-time.Hour)
	return &vigiltype.Task{TaskID: id, LeaseEpoch: 1, Status: vigiltype.TaskRunning, StartedAt: &started}
}

// DESIGN S4: an agent holding tasks past stall_after is killed and
// restarted, one stall_kill event is recorded, and every such task is taken
// back; an agent without stalled tasks is left alone.
func TestSupervisorStallKill(t *testing.T) {
	source := &stallTasks{byKind: map[string][]*vigiltype.Task{"wedged": {stalledTask(7), stalledTask(8)}}}
	events := newEventLog()
	b := setup(t, Config{
		Agents: []Agent{
			{Name: "wedged", Command: []string{"sleep", "1000"}},
			{Name: "healthy", Command: []string{"sleep", "1000"}},
		},
		Backoff: BackoffPolicy{Min: 10 * time.Millisecond, FastFailure: time.Hour, Max: 10 * time.Millisecond, Jitter: JitterOff},
		Events:  events,
		Stall:   &StallConfig{Source: source, After: time.Minute, Every: 20 * time.Millisecond},
	})
	b.run(t)
	firstPIDs := map[int]bool{recv(t, b.sup.testSignals.started.ch, "start"): true, recv(t, b.sup.testSignals.started.ch, "start"): true}

	require.Equal(t, 1, waitStallCheck(t, b, func(n int) bool { return n > 0 }), "one agent killed")
	require.Contains(t, recv(t, b.sup.testSignals.exited.ch, "the kill"), "stall kill: ")
	restarted := recv(t, b.sup.testSignals.started.ch, "the restart")
	require.False(t, firstPIDs[restarted], "a new process")
	b.stop(t)

	require.ElementsMatch(t, []int64{7, 8}, source.reclaims())
	var stallKills []Event
	for _, e := range events.all() {
		require.NotEqual(t, vigiltype.EventExit, e.Kind, "a stall kill is not also reported as an exit")
		if e.Kind == vigiltype.EventStallKill {
			stallKills = append(stallKills, e)
		}
	}
	require.Len(t, stallKills, 1)
	require.Equal(t, "wedged", stallKills[0].Agent)
	require.Equal(t, []int64{7, 8}, stallKills[0].Detail["task_ids"])
	for _, st := range b.sup.Status() {
		if st.Name == "healthy" {
			require.Zero(t, st.Restarts, "the healthy agent was left alone")
		}
	}
}

// While an approval is pending, or when the check or the task read fails,
// nothing is killed (fail open).
func TestSupervisorStallKillSuppressed(t *testing.T) {
	for name, c := range map[string]struct {
		pending func(context.Context) (bool, error)
		readErr error
	}{
		"approval pending": {pending: func(context.Context) (bool, error) { return true, nil }},
		"approval check fails": {pending: func(context.Context) (bool, error) {
			return false, errors.New("approvals store unreachable")
		}},
		"task read fails": {readErr: errors.New("server unreachable")},
	} {
		t.Run(name, func(t *testing.T) {
			source := &stallTasks{byKind: map[string][]*vigiltype.Task{"wedged": {stalledTask(7)}}, readErr: c.readErr}
			events := newEventLog()
			b := setup(t, Config{
				Agents: []Agent{{Name: "wedged", Command: []string{"sleep", "1000"}}},
				Events: events,
				Stall:  &StallConfig{Source: source, After: time.Minute, Every: 10 * time.Millisecond, PendingApproval: c.pending},
			})
			b.run(t)
			recv(t, b.sup.testSignals.started.ch, "start")
			for range 5 {
				require.Equal(t, 0, recv(t, b.sup.testSignals.stallChecked.ch, "stall check"))
			}
			b.stop(t)
			require.Empty(t, source.reclaims())
			require.Empty(t, events.all())
			require.Zero(t, b.sup.Status()[0].Restarts)
		})
	}
}

func TestPendingApprovalCommand(t *testing.T) {
	t.Parallel()
	check := func(line string, timeout time.Duration) (bool, error) {
		return PendingApprovalCommand(ApprovalArgv(line), timeout)(t.Context())
	}
	pending, err := check("true", 0)
	require.NoError(t, err)
	require.True(t, pending, "exit 0 means pending")
	pending, err = check("false", 0)
	require.NoError(t, err)
	require.False(t, pending, "exit 1 means none pending")

	// Every other outcome is a failed read, which fails open (issue #14:
	// through sh -c a missing command exited 127 and counted as "none
	// pending", so the stall kill went ahead; a hanging one had no timeout).
	for _, tc := range []struct{ line, want string }{
		{"/nonexistent/check", "no such file"},
		{"/nonexistent/check --flag", "no such file"},
		{"true; exit 127", "exit status 127"},
		{"true; exit 2", "exit status 2"},
		{"kill -9 $$", "signal: killed"},
		{"sleep 30", "still running after 200ms"},
	} {
		pending, err := check(tc.line, 200*time.Millisecond)
		require.ErrorContains(t, err, tc.want, tc.line)
		require.False(t, pending, tc.line)
	}
}

func TestApprovalArgv(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"/usr/local/bin/approvals", "--pending"}, ApprovalArgv("  /usr/local/bin/approvals  --pending "))
	require.Equal(t, []string{"check"}, ApprovalArgv("check"))
	for _, line := range []string{"test -f /tmp/x && true", "grep -q x file | wc", "echo $HOME", `check "a b"`, "ls *.lock", "exit 1"} {
		want := []string{"sh", "-c", line}
		if line == "exit 1" {
			want = []string{"exit", "1"} // a plain argv: exec reports the missing program, a failed check
		}
		require.Equal(t, want, ApprovalArgv(line), line)
	}
}

// waitStallCheck waits for a stall check whose kill count satisfies ok.
func waitStallCheck(t *testing.T, b *testBundle, ok func(int) bool) int {
	t.Helper()
	for {
		if n := recv(t, b.sup.testSignals.stallChecked.ch, "stall check"); ok(n) {
			return n
		}
	}
}

func TestKillBudget(t *testing.T) {
	b := killBudget{n: 2, window: 10 * time.Minute}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	require.True(t, b.take(t0))
	require.True(t, b.take(t0.Add(time.Minute)))
	require.False(t, b.take(t0.Add(2*time.Minute)), "a third kill within the window is over budget")
	require.False(t, b.take(t0.Add(9*time.Minute)))
	require.True(t, b.take(t0.Add(10*time.Minute)), "the first kill left the window")
	require.False(t, b.take(t0.Add(10*time.Minute)))
	require.True(t, b.take(t0.Add(11*time.Minute)))
}

// Past the fleet-wide budget a stall is recorded as deferred (once), not
// killed, so one shared upstream hang does not take the fleet down.
func TestSupervisorStallKillBudget(t *testing.T) {
	source := &stallTasks{byKind: map[string][]*vigiltype.Task{
		"a": {stalledTask(1)}, "b": {stalledTask(2)}, "c": {stalledTask(3)},
	}}
	events := newEventLog()
	b := setup(t, Config{
		Agents: []Agent{
			{Name: "a", Command: []string{"sleep", "1000"}},
			{Name: "b", Command: []string{"sleep", "1000"}},
			{Name: "c", Command: []string{"sleep", "1000"}},
		},
		Backoff: BackoffPolicy{Min: time.Hour, FastFailure: time.Hour, Max: time.Hour, Jitter: JitterOff},
		Events:  events,
		Stall:   &StallConfig{Source: source, After: time.Minute, Every: 10 * time.Millisecond, Budget: 2, Window: time.Hour},
	})
	b.run(t)
	for range 3 {
		recv(t, b.sup.testSignals.started.ch, "start")
	}
	// A check may run while only some agents have started: count the
	// kills over checks until the budget's two are made.
	killed := 0
	for killed < 2 {
		killed += recv(t, b.sup.testSignals.stallChecked.ch, "stall check")
	}
	require.Equal(t, 2, killed, "two kills, the budget")
	for range 5 { // later checks kill nothing more
		require.Equal(t, 0, recv(t, b.sup.testSignals.stallChecked.ch, "stall check"))
	}
	b.stop(t)

	var kills, deferred int
	for _, e := range events.all() {
		if e.Kind != vigiltype.EventStallKill {
			continue
		}
		if e.Detail["deferred"] == true {
			deferred++
		} else {
			kills++
		}
	}
	require.Equal(t, 2, kills)
	require.Equal(t, 1, deferred, "the third stall is recorded deferred, once")
	require.Len(t, source.reclaims(), 2)
}

// Only tasks held by this supervisor's own current process count: a
// process of the same kind on another host, or one this supervisor did not
// launch, is never blamed (and never killed for).
func TestSupervisorStallKillOnlyItsOwnProcess(t *testing.T) {
	owner := func(id string) *vigiltype.Task {
		task := stalledTask(map[string]int64{"mine": 7, "elsewhere": 8, "stranger": 9}[id])
		task.LeaseOwner = &id
		return task
	}
	source := &stallTasks{byKind: map[string][]*vigiltype.Task{"w": {owner("mine"), owner("elsewhere"), owner("stranger")}}}
	var leader atomic.Int64
	b := setup(t, Config{
		Agents:  []Agent{{Name: "w", Command: []string{"sleep", "1000"}}},
		Backoff: BackoffPolicy{Min: time.Hour, FastFailure: time.Hour, Max: time.Hour, Jitter: JitterOff},
		Stall: &StallConfig{Source: source, After: time.Minute, Every: 10 * time.Millisecond, Host: "here",
			Holder: func(_ context.Context, id string) (*vigiltype.Process, error) {
				switch id {
				case "mine":
					return &vigiltype.Process{Hostname: "here", PID: int(leader.Load())}, nil
				case "elsewhere":
					return &vigiltype.Process{Hostname: "there", PID: int(leader.Load())}, nil
				default:
					return &vigiltype.Process{Hostname: "here", PID: os.Getpid()}, nil
				}
			}},
	})
	leader.Store(-1)
	b.run(t)
	leader.Store(int64(recv(t, b.sup.testSignals.started.ch, "start")))
	require.Equal(t, 1, waitStallCheck(t, b, func(n int) bool { return n > 0 }))
	b.stop(t)
	require.Equal(t, []int64{7}, source.reclaims(), "only the task its own process held")
}
