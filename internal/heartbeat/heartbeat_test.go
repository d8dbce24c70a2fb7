package heartbeat

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/clock"
	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// helperEnv makes the test binary act as a stand-in process (see TestMain):
// "wait" blocks until SIGTERM, then exits 0.
const helperEnv = "HEARTBEAT_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "wait" {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM)
		<-ch
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fakeClient records the loop's writes.
type fakeClient struct {
	mu       sync.Mutex
	liveness int
	posts    []time.Time // the activity as the server would place it
	ages     []time.Duration
	leaseErr error
	liveErr  error
	serverAt func() time.Time // the server's clock, which places an age
	legacy   bool             // a server that predates activity_age_ms
}

func (f *fakeClient) ProcessHeartbeat(context.Context, vigilclient.Instance) (*vigiltype.Process, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.liveness++
	return nil, f.liveErr
}

func (f *fakeClient) TaskHeartbeatV2(_ context.Context, _ vigilclient.Lease, at time.Time) (*vigiltype.Task, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.leaseErr != nil {
		return nil, f.leaseErr
	}
	f.posts = append(f.posts, at)
	return nil, nil
}

func (f *fakeClient) TaskHeartbeatAge(_ context.Context, _ vigilclient.Lease, age time.Duration) (*vigiltype.Task, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.legacy {
		return nil, vigiltype.Invalid("activity_age_ms", "unknown field")
	}
	if f.leaseErr != nil {
		return nil, f.leaseErr
	}
	f.ages = append(f.ages, age)
	f.posts = append(f.posts, f.serverAt().Add(-age))
	return nil, nil
}

func (f *fakeClient) counts() (int, []time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.liveness, append([]time.Time(nil), f.posts...)
}

type testBundle struct {
	state  State
	client *fakeClient
	clock  *clock.Fake
	parent *parentFlag
	loop   *Loop
}

type parentFlag struct {
	mu    sync.Mutex
	alive bool
}

func (p *parentFlag) set(v bool) { p.mu.Lock(); p.alive = v; p.mu.Unlock() }
func (p *parentFlag) get(ProcRef) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.alive
}

var t0 = time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)

func setup(t *testing.T, mod ...func(*Config)) *testBundle {
	t.Helper()
	st, err := Open(t.TempDir())
	require.NoError(t, err)
	b := &testBundle{state: st, client: &fakeClient{}, clock: clock.NewFake(t0), parent: &parentFlag{alive: true}}
	b.client.serverAt = b.clock.Now // the server's clock agrees with the host's unless a test skews it
	cfg := Config{
		State:       st,
		Client:      b.client,
		Lease:       vigilclient.Lease{Instance: vigilclient.Instance{ID: "i1", Token: "tok"}, TaskID: 7, Epoch: 2},
		Liveness:    true,
		Parent:      ProcRef{PID: 1, StartTime: 1},
		Interval:    240 * time.Second,
		Staleness:   900 * time.Second,
		LeaseWindow: 30 * time.Minute,
		Clock:       b.clock,
		ParentAlive: b.parent.get,
	}
	for _, f := range mod {
		f(&cfg)
	}
	b.loop, err = NewLoop(cfg)
	require.NoError(t, err)
	return b
}

func (b *testBundle) touch(t *testing.T, at time.Time) {
	t.Helper()
	require.NoError(t, b.state.TouchActivity(at))
}

func TestActivity(t *testing.T) {
	t.Parallel()
	const stale, tol = 900 * time.Second, time.Second
	for name, tc := range map[string]struct {
		mtime  time.Time
		exists bool
		want   Action
	}{
		"missing":          {time.Time{}, false, ActionSkipNoActivity},
		"fresh":            {t0.Add(-time.Minute), true, ""},
		"at the bound":     {t0.Add(-stale), true, ""},
		"past the bound":   {t0.Add(-stale - time.Second), true, ActionSkipStale},
		"future":           {t0.Add(time.Hour), true, ActionSkipFuture},
		"within tolerance": {t0.Add(500 * time.Millisecond), true, ""},
	} {
		t.Run(name, func(t *testing.T) {
			require.Equal(t, tc.want, Activity(t0, tc.mtime, tc.exists, stale, tol))
		})
	}
}

func TestTick(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("fresh activity posts its mtime and liveness", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.touch(t, t0.Add(-time.Minute))
		res := b.loop.Tick(ctx)
		require.Equal(t, ActionPosted, res.Action)
		live, posts := b.client.counts()
		require.Equal(t, 1, live)
		require.Len(t, posts, 1)
		require.True(t, posts[0].Equal(t0.Add(-time.Minute)), posts[0])
	})

	// DESIGN T7, issue #14: the activity goes as its age on this host's
	// clock, so a host clock 10 minutes off either way does not move the
	// activity the server records; a server that predates activity_age_ms
	// gets activity_at.
	t.Run("the activity is sent as its age, whatever the host clock", func(t *testing.T) {
		t.Parallel()
		for _, skew := range []time.Duration{10 * time.Minute, -10 * time.Minute} {
			b := setup(t, func(c *Config) { c.NotBefore = t0.Add(-time.Hour) })
			b.client.serverAt = func() time.Time { return b.clock.Now().Add(-skew) } // the host clock runs skew ahead
			b.touch(t, t0.Add(-time.Minute))
			require.Equal(t, ActionPosted, b.loop.Tick(ctx).Action)
			_, posts := b.client.counts()
			require.Equal(t, []time.Duration{time.Minute}, b.client.ages)
			require.True(t, posts[0].Equal(t0.Add(-skew-time.Minute)), "one minute before the server's now: %s", posts[0])
		}
		b := setup(t)
		b.client.legacy = true
		b.touch(t, t0.Add(-time.Minute))
		require.Equal(t, ActionPosted, b.loop.Tick(ctx).Action)
		_, posts := b.client.counts()
		require.Len(t, posts, 1)
		require.True(t, posts[0].Equal(t0.Add(-time.Minute)), "activity_at for a legacy server")
	})

	t.Run("stale activity skips the post, liveness still sent; a touch resumes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.touch(t, t0.Add(-16*time.Minute))
		require.Equal(t, ActionSkipStale, b.loop.Tick(ctx).Action)
		require.Equal(t, ActionSkipStale, b.loop.Tick(ctx).Action)
		live, posts := b.client.counts()
		require.Equal(t, 2, live)
		require.Empty(t, posts)

		b.clock.Advance(time.Minute)
		b.touch(t, b.clock.Now())
		require.Equal(t, ActionPosted, b.loop.Tick(ctx).Action)
		_, posts = b.client.counts()
		require.Len(t, posts, 1)
		require.True(t, posts[0].Equal(t0.Add(time.Minute)))
	})

	t.Run("no activity file skips", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.Equal(t, ActionSkipNoActivity, b.loop.Tick(ctx).Action)
	})

	t.Run("future mtime is not fresh", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.touch(t, t0.Add(time.Hour))
		require.Equal(t, ActionSkipFuture, b.loop.Tick(ctx).Action)
		_, posts := b.client.counts()
		require.Empty(t, posts)
	})

	t.Run("parent gone stops before any write", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.touch(t, t0)
		b.parent.set(false)
		require.Equal(t, ActionStopParentGone, b.loop.Tick(ctx).Action)
		live, posts := b.client.counts()
		require.Zero(t, live)
		require.Empty(t, posts)
	})

	t.Run("409 stale epoch stops", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.touch(t, t0)
		b.client.leaseErr = &vigilclient.APIError{Status: 409, Code: vigilclient.CodeStaleEpoch}
		res := b.loop.Tick(ctx)
		require.Equal(t, ActionStopLeaseLost, res.Action)
		require.ErrorIs(t, res.Err, vigiltype.ErrStaleEpoch)
	})

	t.Run("write failures past the lease window stop with an error", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.client.liveErr = errors.New("connection refused")
		require.Equal(t, ActionWriteFailed, b.loop.Tick(ctx).Action)
		b.clock.Advance(29 * time.Minute)
		require.Equal(t, ActionWriteFailed, b.loop.Tick(ctx).Action)
		b.clock.Advance(time.Minute)
		res := b.loop.Tick(ctx)
		require.Equal(t, ActionStopWriteFailed, res.Action)
		require.Error(t, res.Err)
	})

	t.Run("a success resets the failure window", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.client.liveErr = errors.New("connection refused")
		require.Equal(t, ActionWriteFailed, b.loop.Tick(ctx).Action)
		b.clock.Advance(20 * time.Minute)
		b.client.mu.Lock()
		b.client.liveErr = nil
		b.client.mu.Unlock()
		require.Equal(t, ActionSkipNoActivity, b.loop.Tick(ctx).Action)
		b.client.mu.Lock()
		b.client.liveErr = errors.New("connection refused")
		b.client.mu.Unlock()
		b.clock.Advance(20 * time.Minute)
		require.Equal(t, ActionWriteFailed, b.loop.Tick(ctx).Action)
	})
}

func TestRunExitsWhenParentGoes(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Interval = 5 * time.Millisecond; c.Clock = nil })
	require.NoError(t, b.state.WriteProcRef(PIDFile, ProcRef{PID: os.Getpid()}))
	require.NoError(t, b.state.TouchActivity(time.Now()))
	done := make(chan error, 1)
	go func() { done <- b.loop.Run(context.Background()) }()
	require.Eventually(t, func() bool { _, p := b.client.counts(); return len(p) >= 2 }, 5*time.Second, time.Millisecond)
	b.parent.set(false)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after the parent went away")
	}
	_, err := os.Stat(b.state.Path(PIDFile))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestStateFiles(t *testing.T) {
	t.Parallel()
	st, err := Open(t.TempDir())
	require.NoError(t, err)
	inst := InstanceState{InstanceID: "i", InstanceToken: "secret", OwnerPID: 4, OwnerStartTime: 9}
	require.NoError(t, st.WriteInstance(inst))
	fi, err := os.Stat(st.Path(InstanceFile))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	got, err := st.ReadInstance()
	require.NoError(t, err)
	require.Equal(t, inst, got)

	_, err = st.ReadTask()
	require.ErrorIs(t, err, ErrNoState)
	require.NoError(t, st.WriteTask(TaskState{TaskID: 3, LeaseEpoch: 2}))
	task, err := st.ReadTask()
	require.NoError(t, err)
	require.Equal(t, int64(3), task.TaskID)

	require.NoError(t, st.WriteProcRef(ParentPIDFile, ProcRef{PID: 12, StartTime: 34}))
	ref, err := st.ReadProcRef(ParentPIDFile)
	require.NoError(t, err)
	require.Equal(t, ProcRef{PID: 12, StartTime: 34}, ref)

	_, ok, err := st.Activity()
	require.NoError(t, err)
	require.False(t, ok)
	require.NoError(t, st.TouchActivity(t0))
	mt, ok, err := st.Activity()
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, mt.Equal(t0))
}

func TestSameProcessAlive(t *testing.T) {
	t.Parallel()
	ref := ProcRef{PID: 100, StartTime: 5000}
	require.True(t, SameProcessAlive(ref, Observation{Exists: true, StartTime: 5000}))
	require.False(t, SameProcessAlive(ref, Observation{}), "pid free")
	require.False(t, SameProcessAlive(ref, Observation{Exists: true, Zombie: true, StartTime: 5000}), "zombie")
	require.False(t, SameProcessAlive(ref, Observation{Exists: true, StartTime: 7777}), "pid reused by another process")
	require.True(t, SameProcessAlive(ref, Observation{Exists: true}), "EPERM: exists, start unknown")
	require.True(t, SameProcessAlive(ProcRef{PID: 100}, Observation{Exists: true, StartTime: 7777}), "start not captured")
}

func TestParseStat(t *testing.T) {
	t.Parallel()
	// comm with spaces and parentheses; field 22 is 987654.
	line := "42 (a (weird) name) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 50 18446744073709551615"
	state, start, err := parseStat([]byte(line))
	require.NoError(t, err)
	require.Equal(t, byte('S'), state)
	require.Equal(t, uint64(987654), start)
	_, _, err = parseStat([]byte("42 (x) S 1"))
	require.Error(t, err)
}

func TestParseLoopArgs(t *testing.T) {
	t.Parallel()
	wd, parent, ok := ParseLoopArgs([]string{"/bin/vigil", "heartbeat", "loop", "--workdir=/w", "--parent-pid", "12", "--parent-start=99"})
	require.True(t, ok)
	require.Equal(t, "/w", wd)
	require.Equal(t, ProcRef{PID: 12, StartTime: 99}, parent)
	_, _, ok = ParseLoopArgs([]string{"vim", "heartbeat", "notes", "--workdir=/w", "--parent-pid=1"})
	require.False(t, ok)
	_, _, ok = ParseLoopArgs([]string{"vigil", "heartbeat", "loop", "--workdir=/w"})
	require.False(t, ok)
}

func TestJudge(t *testing.T) {
	t.Parallel()
	lp := LoopProcess{PID: 5, Workdir: "/w", Parent: ProcRef{PID: 4}}
	require.False(t, Judge(lp, true).Terminate)
	require.True(t, Judge(lp, false).Terminate)
	lp.WorkdirGone = true
	v := Judge(lp, true)
	require.True(t, v.Terminate)
	require.Contains(t, v.Reason, "gone")
	require.True(t, UnderRoots("/a/b/c", []string{"/x", "/a/b"}))
	require.True(t, UnderRoots("/a/b", []string{"/a/b"}))
	require.False(t, UnderRoots("/a/bc", []string{"/a/b"}))
	require.True(t, UnderRoots("/anything", nil))
}

// startHelper starts the test binary as a process that waits for SIGTERM,
// with extra argv (visible in /proc/PID/cmdline), and kills it at cleanup.
func startHelper(t *testing.T, dir string, argv ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := &exec.Cmd{Path: exe, Args: append([]string{exe}, argv...), Dir: dir, Env: append(os.Environ(), helperEnv+"=wait")}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}
