package storetest

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// exerciseProcess covers the processes table: registration, liveness
// heartbeats, computed status, exit, listing and pruning (DESIGN L1-L7).
func exerciseProcess(ctx context.Context, t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("RegisterAndGet", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		// Times are kept to the millisecond: 1.234567ms is stored as 1ms.
		now := t0.Add(1234567 * time.Nanosecond)
		proc := b.register(t, store.ProcessRegisterParams{
			InstanceID: "inst-1", ProcessKind: "critic", Hostname: "box1", PID: 77, LivenessIntervalS: 30, Now: now,
		})
		want := &vigiltype.Process{
			InstanceID:        "inst-1",
			ProcessKind:       "critic",
			Hostname:          "box1",
			PID:               77,
			LivenessIntervalS: 30,
			StartedAt:         at(time.Millisecond),
			LastHeartbeatAt:   at(time.Millisecond),
			Status:            vigiltype.ProcessAlive,
		}
		require.Equal(t, want, proc)
		require.Equal(t, want, b.get(t, "inst-1", now))

		_, err := b.s.ProcessGet(ctx, "no-such-instance", now)
		require.ErrorIs(t, err, vigiltype.ErrNotFound)
	})

	t.Run("RegisterDuplicateRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		first := b.register(t, store.ProcessRegisterParams{InstanceID: "inst-1", ProcessKind: "critic"})
		_, err := b.s.ProcessRegister(ctx, store.ProcessRegisterParams{
			InstanceID: "inst-1", TokenHash: "other-hash", ProcessKind: "other", Hostname: "h", PID: 1,
			LivenessIntervalS: 5, Now: at(time.Second),
		})
		require.Error(t, err)
		require.Equal(t, first, b.get(t, "inst-1", t0))
		require.NoError(t, b.s.ProcessCheckToken(ctx, "inst-1", tokenHash("inst-1")))
	})

	t.Run("CheckToken", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "inst-1"})
		require.NoError(t, b.s.ProcessCheckToken(ctx, "inst-1", tokenHash("inst-1")))
		require.ErrorIs(t, b.s.ProcessCheckToken(ctx, "inst-1", "wrong"), vigiltype.ErrInvalidToken)
		require.ErrorIs(t, b.s.ProcessCheckToken(ctx, "inst-2", tokenHash("inst-2")), vigiltype.ErrNotFound)
	})

	t.Run("AliveWindow", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		// Alive while now - last_heartbeat_at <= 3 × interval, stopped 1ms
		// later; ProcessGet and the list's status filter agree.
		b.register(t, store.ProcessRegisterParams{InstanceID: "ten", LivenessIntervalS: 10})
		b.requireStatus(t, "ten", at(30*time.Second), vigiltype.ProcessAlive)
		b.requireStatus(t, "ten", at(30*time.Second+time.Millisecond), vigiltype.ProcessStopped)

		// A heartbeat (even after the window passed) moves the window.
		proc, err := b.s.ProcessHeartbeat(ctx, store.ProcessHeartbeatParams{
			InstanceID: "ten", TokenHash: tokenHash("ten"), Now: at(40 * time.Second),
		})
		require.NoError(t, err)
		require.Equal(t, at(40*time.Second), proc.LastHeartbeatAt)
		require.Equal(t, t0, proc.StartedAt)
		require.Equal(t, vigiltype.ProcessAlive, proc.Status)
		b.requireStatus(t, "ten", at(70*time.Second), vigiltype.ProcessAlive)
		b.requireStatus(t, "ten", at(70*time.Second+time.Millisecond), vigiltype.ProcessStopped)

		// Fractional intervals keep millisecond windows: 3 × 1.5s = 4.5s,
		// also after a heartbeat recomputes it.
		b.register(t, store.ProcessRegisterParams{InstanceID: "frac", LivenessIntervalS: 1.5})
		b.requireStatus(t, "frac", at(4500*time.Millisecond), vigiltype.ProcessAlive)
		b.requireStatus(t, "frac", at(4501*time.Millisecond), vigiltype.ProcessStopped)
		_, err = b.s.ProcessHeartbeat(ctx, store.ProcessHeartbeatParams{
			InstanceID: "frac", TokenHash: tokenHash("frac"), Now: at(time.Second),
		})
		require.NoError(t, err)
		b.requireStatus(t, "frac", at(5500*time.Millisecond), vigiltype.ProcessAlive)
		b.requireStatus(t, "frac", at(5501*time.Millisecond), vigiltype.ProcessStopped)

		// A sub-millisecond now is compared at millisecond precision.
		b.requireStatus(t, "frac", at(5500*time.Millisecond+999*time.Microsecond), vigiltype.ProcessAlive)
	})

	t.Run("HeartbeatRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "inst-1"})
		heartbeat := func(id, hash string) error {
			_, err := b.s.ProcessHeartbeat(ctx, store.ProcessHeartbeatParams{
				InstanceID: id, TokenHash: hash, Now: at(10 * time.Second),
			})
			return err
		}
		before := b.get(t, "inst-1", t0)
		require.ErrorIs(t, heartbeat("inst-1", "wrong"), vigiltype.ErrInvalidToken)
		require.ErrorIs(t, heartbeat("inst-2", tokenHash("inst-2")), vigiltype.ErrNotFound)
		require.Equal(t, before, b.get(t, "inst-1", t0))

		exited := b.exit(t, "inst-1", at(time.Second))
		require.ErrorIs(t, heartbeat("inst-1", tokenHash("inst-1")), vigiltype.ErrInstanceExited)
		// The token is checked before the exit.
		require.ErrorIs(t, heartbeat("inst-1", "wrong"), vigiltype.ErrInvalidToken)
		require.Equal(t, exited, b.get(t, "inst-1", at(time.Second)))
	})

	t.Run("MarkExited", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "inst-1", LivenessIntervalS: 30})
		task := b.enqueue(t, store.TaskEnqueueParams{})
		b.claim(t, "inst-1", t0)
		b.requireCurrentTask(t, "inst-1", task.TaskID, task.TaskType)

		// Stopped at once, well inside the alive window; current task cleared.
		proc := b.exit(t, "inst-1", at(time.Second))
		require.Equal(t, ptr(at(time.Second)), proc.ExitedAt)
		require.Equal(t, vigiltype.ProcessStopped, proc.Status)
		require.Nil(t, proc.CurrentTaskID)
		require.Nil(t, proc.CurrentTaskType)
		require.Equal(t, proc, b.get(t, "inst-1", at(time.Second)))
		list, err := b.s.ProcessList(ctx, store.ProcessListParams{Status: vigiltype.ProcessAlive, Now: at(time.Second)})
		require.NoError(t, err)
		require.Empty(t, list)

		// Idempotent: marking again is fine and keeps the first exit time.
		again := b.exit(t, "inst-1", at(5*time.Second))
		require.Equal(t, ptr(at(time.Second)), again.ExitedAt)

		_, err = b.s.ProcessMarkExited(ctx, store.ProcessMarkExitedParams{
			InstanceID: "inst-1", TokenHash: "wrong", Now: at(6 * time.Second),
		})
		require.ErrorIs(t, err, vigiltype.ErrInvalidToken)
		_, err = b.s.ProcessMarkExited(ctx, store.ProcessMarkExitedParams{
			InstanceID: "inst-2", TokenHash: tokenHash("inst-2"), Now: at(6 * time.Second),
		})
		require.ErrorIs(t, err, vigiltype.ErrNotFound)
	})

	t.Run("Latest", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "c-1", ProcessKind: "critic", Now: t0})
		b.register(t, store.ProcessRegisterParams{InstanceID: "c-0", ProcessKind: "critic", Now: at(time.Second)})
		// Same start: the higher instance id is the newer in listing order.
		b.register(t, store.ProcessRegisterParams{InstanceID: "c-2", ProcessKind: "critic", Now: at(time.Second)})
		b.register(t, store.ProcessRegisterParams{InstanceID: "e-1", ProcessKind: "enrichment", Now: at(2 * time.Second)})

		proc, err := b.s.ProcessLatest(ctx, "critic", at(time.Second))
		require.NoError(t, err)
		require.Equal(t, "c-2", proc.InstanceID)
		require.Equal(t, vigiltype.ProcessAlive, proc.Status)

		// The status is computed at the given now.
		proc, err = b.s.ProcessLatest(ctx, "critic", at(time.Hour))
		require.NoError(t, err)
		require.Equal(t, "c-2", proc.InstanceID)
		require.Equal(t, vigiltype.ProcessStopped, proc.Status)

		proc, err = b.s.ProcessLatest(ctx, "enrichment", at(2*time.Second))
		require.NoError(t, err)
		require.Equal(t, "e-1", proc.InstanceID)

		_, err = b.s.ProcessLatest(ctx, "no-such-kind", t0)
		require.ErrorIs(t, err, vigiltype.ErrNotFound)
	})

	t.Run("ListFilters", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "a", ProcessKind: "critic", Hostname: "box1", Now: t0})
		b.register(t, store.ProcessRegisterParams{InstanceID: "b", ProcessKind: "critic", Hostname: "box2", Now: at(time.Second)})
		b.register(t, store.ProcessRegisterParams{InstanceID: "c", ProcessKind: "enrich", Hostname: "box1", Now: at(2 * time.Second)})
		b.register(t, store.ProcessRegisterParams{InstanceID: "d", ProcessKind: "enrich", Hostname: "box2", Now: at(3 * time.Second)})
		b.exit(t, "d", at(3*time.Second))
		// Stopped by its alive window (3s) at now = t0 + 10s.
		b.register(t, store.ProcessRegisterParams{InstanceID: "e", ProcessKind: "critic", Hostname: "box1", LivenessIntervalS: 1, Now: t0})
		now := at(10 * time.Second)

		for _, tt := range []struct {
			name   string
			params store.ProcessListParams
			want   []string
		}{
			{"All", store.ProcessListParams{}, []string{"d", "c", "b", "e", "a"}},
			{"Kind", store.ProcessListParams{Kind: "critic"}, []string{"b", "e", "a"}},
			{"Host", store.ProcessListParams{Host: "box1"}, []string{"c", "e", "a"}},
			{"Alive", store.ProcessListParams{Status: vigiltype.ProcessAlive}, []string{"c", "b", "a"}},
			{"Stopped", store.ProcessListParams{Status: vigiltype.ProcessStopped}, []string{"d", "e"}},
			{"KindAndStatus", store.ProcessListParams{Kind: "critic", Status: vigiltype.ProcessStopped}, []string{"e"}},
			{"KindAndHost", store.ProcessListParams{Kind: "critic", Host: "box2"}, []string{"b"}},
			{"Limit", store.ProcessListParams{Limit: 2}, []string{"d", "c"}},
			{"UnknownKind", store.ProcessListParams{Kind: "nobody"}, nil},
		} {
			t.Run(tt.name, func(t *testing.T) {
				tt.params.Now = now
				procs, err := b.s.ProcessList(ctx, tt.params)
				require.NoError(t, err)
				require.Equal(t, tt.want, instanceIDs(procs))
				for _, p := range procs {
					require.Equal(t, p.ComputeStatus(now), p.Status, p.InstanceID)
				}
			})
		}
	})

	t.Run("ListPagination", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		// Several instances share a started_at: the cursor must break ties
		// on instance_id without skipping or repeating any.
		var all []*vigiltype.Process
		for _, offset := range []int{0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 4} {
			all = append(all, b.register(t, store.ProcessRegisterParams{
				InstanceID: uuid.NewString(), Now: at(time.Duration(offset) * time.Second),
			}))
		}
		slices.SortFunc(all, func(x, y *vigiltype.Process) int {
			return cmp.Or(y.StartedAt.Compare(x.StartedAt), strings.Compare(y.InstanceID, x.InstanceID))
		})
		want := instanceIDs(all)

		// Limit 0 lists everything.
		procs, err := b.s.ProcessList(ctx, store.ProcessListParams{Now: t0})
		require.NoError(t, err)
		require.Equal(t, want, instanceIDs(procs))

		var got []string
		var after *store.ProcessCursor
		for page := 0; ; page++ {
			require.Less(t, page, 10, "pagination does not end")
			procs, err := b.s.ProcessList(ctx, store.ProcessListParams{After: after, Limit: 3, Now: t0})
			require.NoError(t, err)
			if len(procs) == 0 {
				break
			}
			require.LessOrEqual(t, len(procs), 3)
			got = append(got, instanceIDs(procs)...)
			last := procs[len(procs)-1]
			after = &store.ProcessCursor{StartedAt: last.StartedAt, InstanceID: last.InstanceID}
		}
		require.Equal(t, want, got)
	})

	t.Run("Counts", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)
		none, err := b.s.ProcessCounts(ctx, t0)
		require.NoError(t, err)
		require.Empty(t, none)

		b.register(t, store.ProcessRegisterParams{ProcessKind: "critic"})
		b.register(t, store.ProcessRegisterParams{ProcessKind: "critic"})
		b.register(t, store.ProcessRegisterParams{InstanceID: "gone", ProcessKind: "critic"})
		b.exit(t, "gone", t0)
		b.register(t, store.ProcessRegisterParams{ProcessKind: "worker", LivenessIntervalS: 1})
		// 3 s later: the worker (1 s interval) is past its alive window.
		counts, err := b.s.ProcessCounts(ctx, at(3*time.Second+time.Millisecond))
		require.NoError(t, err)
		require.Equal(t, []store.ProcessCount{
			{Kind: "critic", Status: vigiltype.ProcessAlive, Count: 2},
			{Kind: "critic", Status: vigiltype.ProcessStopped, Count: 1},
			{Kind: "worker", Status: vigiltype.ProcessStopped, Count: 1},
		}, counts)
	})

	t.Run("Prune", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		now := at(10 * 24 * time.Hour)
		before := now.Add(-7 * 24 * time.Hour)

		// Deleted: stopped, last heartbeat before Before, holding no task.
		b.register(t, store.ProcessRegisterParams{InstanceID: "old-exited"})
		b.exit(t, "old-exited", t0)
		b.register(t, store.ProcessRegisterParams{InstanceID: "old-stopped"})

		// Kept: stopped but heard from recently.
		b.register(t, store.ProcessRegisterParams{InstanceID: "recent-stopped"})
		_, err := b.s.ProcessHeartbeat(ctx, store.ProcessHeartbeatParams{
			InstanceID: "recent-stopped", TokenHash: tokenHash("recent-stopped"), Now: now.Add(-24 * time.Hour),
		})
		require.NoError(t, err)
		// Kept: old heartbeat but still alive (a 30-day interval).
		b.register(t, store.ProcessRegisterParams{InstanceID: "old-alive", LivenessIntervalS: 30 * 24 * 3600})
		// Kept: stopped and old, but still holding a running task.
		b.register(t, store.ProcessRegisterParams{InstanceID: "holder"})
		b.enqueue(t, store.TaskEnqueueParams{})
		task := b.claim(t, "holder", t0)

		n, err := b.s.ProcessPrune(ctx, store.ProcessPruneParams{Before: before, Now: now})
		require.NoError(t, err)
		require.EqualValues(t, 2, n)
		procs, err := b.s.ProcessList(ctx, store.ProcessListParams{Now: now})
		require.NoError(t, err)
		require.ElementsMatch(t, []string{"recent-stopped", "old-alive", "holder"}, instanceIDs(procs))

		n, err = b.s.ProcessPrune(ctx, store.ProcessPruneParams{Before: before, Now: now})
		require.NoError(t, err)
		require.Zero(t, n)

		// Once its task is done, the holder goes too.
		_, err = b.s.TaskComplete(ctx, store.TaskCompleteParams{TaskLease: leaseOf(task), Now: now})
		require.NoError(t, err)
		n, err = b.s.ProcessPrune(ctx, store.ProcessPruneParams{Before: before, Now: now})
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		_, err = b.s.ProcessGet(ctx, "holder", now)
		require.ErrorIs(t, err, vigiltype.ErrNotFound)
	})

	t.Run("ListOrderIsByteOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		// Ties on started_at break on instance_id compared byte by byte
		// (upper case before lower, '-' before '_' before letters), not by
		// a database's linguistic collation; the cursor and ProcessLatest
		// agree with the listing.
		ids := []string{"b", "B", "a_b", "a-b", "ab", "a", "Z", "a b"}
		for _, id := range ids {
			b.register(t, store.ProcessRegisterParams{InstanceID: id, ProcessKind: "k"})
		}
		want := slices.Clone(ids)
		slices.SortFunc(want, func(x, y string) int { return strings.Compare(y, x) })

		procs, err := b.s.ProcessList(ctx, store.ProcessListParams{Now: t0})
		require.NoError(t, err)
		require.Equal(t, want, instanceIDs(procs))

		var got []string
		var after *store.ProcessCursor
		for page := 0; ; page++ {
			require.Less(t, page, 10, "pagination does not end")
			procs, err := b.s.ProcessList(ctx, store.ProcessListParams{After: after, Limit: 3, Now: t0})
			require.NoError(t, err)
			if len(procs) == 0 {
				break
			}
			got = append(got, instanceIDs(procs)...)
			last := procs[len(procs)-1]
			after = &store.ProcessCursor{StartedAt: last.StartedAt, InstanceID: last.InstanceID}
		}
		require.Equal(t, want, got)

		latest, err := b.s.ProcessLatest(ctx, "k", t0)
		require.NoError(t, err)
		require.Equal(t, want[0], latest.InstanceID)
	})
}

// requireStatus checks an instance's status at now, both as ProcessGet
// computes it and as ProcessList's status filter selects it.
func (b *testBundle) requireStatus(t *testing.T, instanceID string, now time.Time, want vigiltype.ProcessStatus) {
	t.Helper()
	require.Equal(t, want, b.get(t, instanceID, now).Status, "ProcessGet at %s", now)
	for _, status := range []vigiltype.ProcessStatus{vigiltype.ProcessAlive, vigiltype.ProcessStopped} {
		procs, err := b.s.ProcessList(b.ctx, store.ProcessListParams{Status: status, Now: now})
		require.NoError(t, err)
		require.Equal(t, status == want, slices.Contains(instanceIDs(procs), instanceID),
			"ProcessList status=%s at %s", status, now)
	}
}

// instanceIDs returns the instance ids of procs in order.
func instanceIDs(procs []*vigiltype.Process) []string {
	var ids []string
	for _, p := range procs {
		ids = append(ids, p.InstanceID)
	}
	return ids
}
