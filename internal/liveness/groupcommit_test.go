package liveness

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/vigil-fleet/vigil/internal/clock"
	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/internal/store/sqlitestore"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeStore records heartbeat writes; every other store method panics. A
// batch waits for a receive on gate when gate is not nil.
type fakeStore struct {
	store.Store

	gate     chan struct{}
	batchErr error

	mu      sync.Mutex
	batches [][]string // instance ids of each batch, in batch order
	direct  []string   // instance ids written one by one
}

func (f *fakeStore) answer(p store.ProcessHeartbeatParams) store.ProcessHeartbeatResult {
	if p.InstanceID == "unknown" {
		return store.ProcessHeartbeatResult{Err: vigiltype.ErrNotFound}
	}
	return store.ProcessHeartbeatResult{Process: &vigiltype.Process{InstanceID: p.InstanceID, LastHeartbeatAt: p.Now}}
}

func (f *fakeStore) ProcessHeartbeatBatch(ctx context.Context, items []store.ProcessHeartbeatParams) ([]store.ProcessHeartbeatResult, error) {
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = it.InstanceID
	}
	f.mu.Lock()
	f.batches = append(f.batches, ids)
	f.mu.Unlock()
	if f.gate != nil {
		<-f.gate
	}
	if f.batchErr != nil {
		return nil, f.batchErr
	}
	out := make([]store.ProcessHeartbeatResult, len(items))
	for i, it := range items {
		out[i] = f.answer(it)
	}
	return out, nil
}

func (f *fakeStore) ProcessHeartbeat(ctx context.Context, p store.ProcessHeartbeatParams) (*vigiltype.Process, error) {
	f.mu.Lock()
	f.direct = append(f.direct, p.InstanceID)
	f.mu.Unlock()
	r := f.answer(p)
	return r.Process, r.Err
}

func (f *fakeStore) written() (batches [][]string, direct []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.batches {
		b = slices.Clone(b)
		slices.Sort(b) // concurrent senders queue in any order
		batches = append(batches, b)
	}
	return batches, slices.Clone(f.direct)
}

// testBundle is a service with group commit over a fakeStore, in a
// synctest bubble.
type testBundle struct {
	st  *fakeStore
	svc *Service
	clk *clock.Fake
}

func setup(t *testing.T, st *fakeStore, cfg GroupCommitConfig) *testBundle {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC))
	svc := New(st, clk)
	require.NoError(t, svc.EnableGroupCommit(cfg))
	svc.Start(t.Context())
	t.Cleanup(svc.Stop)
	return &testBundle{st: st, svc: svc, clk: clk}
}

// beat sends a heartbeat from a goroutine of its own; its answer arrives on
// the returned channel.
func (b *testBundle) beat(id string) <-chan error {
	done := make(chan error, 1)
	go func() {
		p, err := b.svc.Heartbeat(context.Background(), id, "token")
		if err == nil && p.InstanceID != id {
			err = errors.New("answered with " + p.InstanceID + "'s row")
		}
		done <- err
	}()
	return done
}

func TestGroupCommitBatchesWhatArrivesDuringACommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, &fakeStore{gate: make(chan struct{})}, GroupCommitConfig{})

		first := b.beat("a")
		synctest.Wait() // a's batch is committing
		var later []<-chan error
		for _, id := range []string{"b", "c", "unknown", "d"} {
			later = append(later, b.beat(id))
		}
		synctest.Wait()
		select {
		case <-first:
			t.Fatal("answered before its commit")
		default:
		}

		b.st.gate <- struct{}{} // a's commit ends
		require.NoError(t, <-first)
		synctest.Wait() // the queued four are committing together
		for _, c := range later {
			select {
			case <-c:
				t.Fatal("answered before its commit")
			default:
			}
		}
		b.st.gate <- struct{}{}
		require.NoError(t, <-later[0])
		require.NoError(t, <-later[1])
		require.ErrorIs(t, <-later[2], vigiltype.ErrNotFound, "each request gets its own answer")
		require.NoError(t, <-later[3])

		batches, direct := b.st.written()
		require.Equal(t, [][]string{{"a"}, {"b", "c", "d", "unknown"}}, batches)
		require.Empty(t, direct)
	})
}

func TestGroupCommitLinger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, &fakeStore{}, GroupCommitConfig{Linger: 5 * time.Millisecond})

		start := time.Now()
		a := b.beat("a")
		time.Sleep(2 * time.Millisecond) // synctest's clock: no real wait
		bb := b.beat("b")
		require.NoError(t, <-a)
		require.Equal(t, 5*time.Millisecond, time.Since(start), "answered at the end of the linger")
		require.NoError(t, <-bb)
		c := b.beat("c")
		require.NoError(t, <-c)

		batches, _ := b.st.written()
		require.Equal(t, [][]string{{"a", "b"}, {"c"}}, batches)
	})
}

func TestGroupCommitMaxBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, &fakeStore{gate: make(chan struct{})}, GroupCommitConfig{MaxBatch: 2})

		first := b.beat("a")
		synctest.Wait()
		var later []<-chan error
		for _, id := range []string{"b", "c", "d"} {
			later = append(later, b.beat(id))
		}
		synctest.Wait()
		for range 3 {
			b.st.gate <- struct{}{}
		}
		require.NoError(t, <-first)
		for _, c := range later {
			require.NoError(t, <-c)
		}
		batches, _ := b.st.written()
		require.Len(t, batches, 3)
		require.Len(t, batches[1], 2, "at most MaxBatch")
		require.Len(t, batches[2], 1)
	})
}

func TestGroupCommitFailedBatchIsWrittenOneByOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, &fakeStore{batchErr: errors.New("deadlock detected")}, GroupCommitConfig{Linger: time.Millisecond})

		a, unknown := b.beat("a"), b.beat("unknown")
		require.NoError(t, <-a)
		require.ErrorIs(t, <-unknown, vigiltype.ErrNotFound)
		batches, direct := b.st.written()
		require.Equal(t, [][]string{{"a", "unknown"}}, batches)
		slices.Sort(direct)
		require.Equal(t, []string{"a", "unknown"}, direct)
	})
}

func TestGroupCommitStopCommitsWhatIsQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, &fakeStore{gate: make(chan struct{})}, GroupCommitConfig{})

		first := b.beat("a")
		synctest.Wait()
		queued := b.beat("b")
		synctest.Wait()
		stopped := make(chan struct{})
		go func() { b.svc.Stop(); close(stopped) }()
		synctest.Wait()
		b.st.gate <- struct{}{}
		b.st.gate <- struct{}{}
		require.NoError(t, <-first)
		require.NoError(t, <-queued, "a heartbeat queued at Stop is committed")
		<-stopped
		b.svc.Stop() // idempotent

		// After Stop each heartbeat is its own write.
		b.st.gate = nil
		require.NoError(t, <-b.beat("c"))
		batches, direct := b.st.written()
		require.Equal(t, [][]string{{"a"}, {"b"}}, batches)
		require.Equal(t, []string{"c"}, direct)
	})
}

func TestGroupCommitStampsArrivalTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, &fakeStore{}, GroupCommitConfig{Linger: 10 * time.Millisecond})

		want := b.clk.Now()
		p, err := b.svc.Heartbeat(context.Background(), "a", "token")
		require.NoError(t, err)
		require.Equal(t, want, p.LastHeartbeatAt, "the service's clock at arrival")
	})
}

func TestGroupCommitWaiterGoesAway(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, &fakeStore{gate: make(chan struct{})}, GroupCommitConfig{})

		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := b.svc.Heartbeat(ctx, "a", "token")
			done <- err
		}()
		synctest.Wait()
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		b.st.gate <- struct{}{} // the commit still ends; its answer has no reader
	})
}

func TestNotStartedWritesOneByOne(t *testing.T) {
	st := &fakeStore{}
	svc := New(st, nil)
	require.NoError(t, svc.EnableGroupCommit(GroupCommitConfig{}))
	_, err := svc.Heartbeat(t.Context(), "a", "token")
	require.NoError(t, err)
	svc.Stop() // safe on a service never started
	batches, direct := st.written()
	require.Empty(t, batches)
	require.Equal(t, []string{"a"}, direct)
}

func TestGroupCommitConfig(t *testing.T) {
	t.Parallel()
	cfg, err := GroupCommitConfig{}.withDefaults()
	require.NoError(t, err)
	require.Equal(t, GroupCommitConfig{
		MaxBatch: GroupCommitMaxBatchDefault, Shards: GroupCommitShardsDefault, FlushTimeout: GroupCommitFlushTimeoutDefault,
	}, cfg)
	for _, bad := range []GroupCommitConfig{{MaxBatch: -1}, {Shards: -1}, {Linger: -1}, {Linger: time.Second}} {
		_, err := bad.withDefaults()
		require.Error(t, err, "%+v", bad)
	}
	svc := New(&fakeStore{}, nil)
	require.NoError(t, svc.EnableGroupCommit(GroupCommitConfig{}))
	require.Error(t, svc.EnableGroupCommit(GroupCommitConfig{}), "twice")
}

func TestShardOf(t *testing.T) {
	t.Parallel()
	require.Equal(t, 0, shardOf("anything", 1))
	seen := map[int]bool{}
	for _, id := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		s := shardOf(id, 4)
		require.Equal(t, s, shardOf(id, 4), "an instance always uses one shard")
		require.True(t, s >= 0 && s < 4)
		seen[s] = true
	}
	require.Greater(t, len(seen), 1, "instances spread over shards")
}

func TestBeatQueueTake(t *testing.T) {
	t.Parallel()
	q := &beatQueue{wake: make(chan struct{}, 1)}
	now := func() time.Time { return time.Time{} }
	for _, id := range []string{"a", "b", "c"} {
		_, ok := q.push(store.ProcessHeartbeatParams{InstanceID: id}, now)
		require.True(t, ok)
	}
	ids := func(b []*pendingBeat) (out []string) {
		for _, pb := range b {
			out = append(out, pb.params.InstanceID)
		}
		return out
	}
	require.Equal(t, []string{"a", "b"}, ids(q.take(2)), "oldest first, at most max")
	require.Equal(t, []string{"c"}, ids(q.take(2)))
	require.Empty(t, q.take(2))
	q.close()
	_, ok := q.push(store.ProcessHeartbeatParams{InstanceID: "d"}, now)
	require.False(t, ok, "a closed queue takes nothing")
}

// TestGroupCommitOnSQLite runs concurrent heartbeats through the real
// SQLite store: each request gets its own answer, refusals included.
func TestGroupCommitOnSQLite(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "vigil.db"))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Close()) })
	svc := New(st, nil)
	require.NoError(t, svc.EnableGroupCommit(GroupCommitConfig{Linger: time.Millisecond}))
	svc.Start(ctx)
	t.Cleanup(svc.Stop)

	reg := func() *Registered {
		r, err := svc.Register(ctx, RegisterParams{ProcessKind: "worker", Hostname: "h", PID: 1, LivenessIntervalS: 30})
		require.NoError(t, err)
		return r
	}
	var alive []*Registered
	for range 20 {
		alive = append(alive, reg())
	}
	exited := reg()
	_, err = svc.Exit(ctx, exited.InstanceID, exited.InstanceToken)
	require.NoError(t, err)

	type call struct {
		id, token string
		want      error
	}
	var calls []call
	for _, r := range alive {
		calls = append(calls, call{r.InstanceID, r.InstanceToken, nil}, call{r.InstanceID, r.InstanceToken, nil})
	}
	calls = append(calls,
		call{"no-such-instance", "t", vigiltype.ErrNotFound},
		call{alive[0].InstanceID, "wrong", vigiltype.ErrInvalidToken},
		call{exited.InstanceID, exited.InstanceToken, vigiltype.ErrInstanceExited},
	)
	var wg sync.WaitGroup
	errs := make([]error, len(calls))
	procs := make([]*vigiltype.Process, len(calls))
	for i, c := range calls {
		wg.Go(func() { procs[i], errs[i] = svc.Heartbeat(ctx, c.id, c.token) })
	}
	wg.Wait()
	for i, c := range calls {
		if c.want != nil {
			require.ErrorIs(t, errs[i], c.want, "call %d", i)
			require.Nil(t, procs[i])
			continue
		}
		require.NoError(t, errs[i], "call %d", i)
		require.Equal(t, c.id, procs[i].InstanceID)
		require.Equal(t, vigiltype.ProcessAlive, procs[i].Status)
		got, err := svc.Get(ctx, c.id)
		require.NoError(t, err)
		require.False(t, got.LastHeartbeatAt.Before(procs[i].LastHeartbeatAt), "committed before the answer")
	}
}
