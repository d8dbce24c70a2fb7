package storetest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// claimBatch claims up to n tasks of types (default "email") for
// instanceID at now with the default lease window.
func (b *testBundle) claimBatch(t *testing.T, instanceID string, now time.Time, n int, types ...string) []*vigiltype.Task {
	t.Helper()
	if len(types) == 0 {
		types = []string{"email"}
	}
	tasks, err := b.s.TaskClaimBatch(b.ctx, store.TaskClaimBatchParams{
		InstanceID: instanceID, Types: types, Max: n, LeaseTimeout: defaultLease, Now: now,
	})
	require.NoError(t, err)
	require.NotNil(t, tasks, "an empty batch is an empty slice, not nil")
	return tasks
}

// exerciseClaimBatch pins TaskClaimBatch (issue #6, batch claims): up to Max
// tasks in claim order, each claimed exactly as a single claim claims one
// (its own epoch bumped once), never the same task to two concurrent
// batches, and an invalid Max refused before anything is written.
func exerciseClaimBatch(ctx context.Context, t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("EachTaskClaimedAsASingleClaim", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		newer := b.enqueue(t, store.TaskEnqueueParams{RunAfter: at(time.Second)})
		own := b.enqueue(t, store.TaskEnqueueParams{TaskType: "report", LeaseTimeout: 1500 * time.Millisecond})
		older := b.enqueue(t, store.TaskEnqueueParams{})
		b.enqueue(t, store.TaskEnqueueParams{RunAfter: at(time.Hour)}) // not due
		b.enqueue(t, store.TaskEnqueueParams{TaskType: "other"})       // not asked for

		now := at(2 * time.Second)
		got := b.claimBatch(t, "w", now, 10, "email", "report")
		require.Len(t, got, 3)
		// Claim order: run_after, then task id.
		for i, want := range []*vigiltype.Task{own, older, newer} {
			require.Equal(t, want.TaskID, got[i].TaskID, "task %d of the batch", i)
			w := *want
			w.Status = vigiltype.TaskRunning
			w.LeaseOwner = ptr("w")
			w.LeaseEpoch = 1
			w.StartedAt = ptr(now)
			w.LastHeartbeatAt = ptr(now)
			w.LastActivityAt = ptr(now)
			w.LeaseExpiresAt = ptr(now.Add(defaultLease))
			if want.TaskID == own.TaskID {
				w.LeaseExpiresAt = ptr(now.Add(1500 * time.Millisecond))
			}
			w.UpdatedAt = now
			requireTaskEqual(t, &w, got[i])
			requireTaskEqual(t, &w, b.getTask(t, want.TaskID))
		}
		// The last task taken is the instance's current task.
		b.requireCurrentTask(t, "w", newer.TaskID, "email")
		require.Empty(t, b.claimBatch(t, "w", now, 10, "email", "report"))
	})

	t.Run("AtMostMax", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		var ids []int64
		for i := range 7 {
			typ := []string{"a", "b"}[i%2]
			ids = append(ids, b.enqueue(t, store.TaskEnqueueParams{TaskType: typ, RunAfter: at(time.Duration(i) * time.Second)}).TaskID)
		}
		now := at(time.Minute)
		var got []int64
		for _, n := range []int{3, 3, 3} {
			batch := b.claimBatch(t, "w", now, n, "b", "a")
			require.LessOrEqual(t, len(batch), n)
			for _, task := range batch {
				require.Equal(t, int64(1), task.LeaseEpoch)
				got = append(got, task.TaskID)
			}
		}
		require.Equal(t, ids, got, "three batches of up to 3 take all 7 in claim order")
	})

	t.Run("MaxOneIsASingleClaim", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		b.register(t, store.ProcessRegisterParams{InstanceID: "single", LivenessIntervalS: 3600})
		first := b.enqueue(t, store.TaskEnqueueParams{})
		b.enqueue(t, store.TaskEnqueueParams{})
		got := b.claimBatch(t, "w", t0, 1)
		require.Len(t, got, 1)
		require.Equal(t, first.TaskID, got[0].TaskID)

		// The same task, claimed again after a release, with TaskClaim
		// instead: the two claims differ only in owner and epoch.
		_, err := b.s.TaskRelease(ctx, store.TaskReleaseParams{TaskLease: leaseOf(got[0]), Now: t0})
		require.NoError(t, err)
		single := b.claim(t, "single", t0)
		require.Equal(t, first.TaskID, single.TaskID)
		want := *got[0]
		want.LeaseOwner = ptr("single")
		want.LeaseEpoch = 2
		requireTaskEqual(t, &want, single)
	})

	t.Run("ReclaimedTaskBumpsEpochOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		task := b.enqueue(t, store.TaskEnqueueParams{})
		claimed := b.claim(t, "w", t0)
		_, err := b.s.TaskRelease(ctx, store.TaskReleaseParams{TaskLease: leaseOf(claimed), Now: t0})
		require.NoError(t, err)
		got := b.claimBatch(t, "w", at(time.Second), 5)
		require.Len(t, got, 1)
		require.Equal(t, task.TaskID, got[0].TaskID)
		require.Equal(t, int64(2), got[0].LeaseEpoch)
	})

	t.Run("InvalidRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		task := b.enqueue(t, store.TaskEnqueueParams{})
		for _, n := range []int{0, -1, store.TaskClaimBatchMax + 1} {
			_, err := b.s.TaskClaimBatch(ctx, store.TaskClaimBatchParams{
				InstanceID: "w", Types: []string{"email"}, Max: n, LeaseTimeout: defaultLease, Now: t0,
			})
			require.ErrorIs(t, err, vigiltype.ErrInvalid, "max %d", n)
			var fe *vigiltype.FieldError
			require.ErrorAs(t, err, &fe)
			require.Equal(t, "max_tasks", fe.Field)
		}
		_, err := b.s.TaskClaimBatch(ctx, store.TaskClaimBatchParams{
			InstanceID: "w", Max: 5, LeaseTimeout: defaultLease, Now: t0,
		})
		require.ErrorIs(t, err, vigiltype.ErrInvalid, "no types")
		requireTaskEqual(t, task, b.getTask(t, task.TaskID))
		b.requireCurrentTask(t, "w", 0, "")
	})

	t.Run("RefusedForMissingOrStoppedInstance", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		task := b.enqueue(t, store.TaskEnqueueParams{})
		claim := func(id string, now time.Time) error {
			_, err := b.s.TaskClaimBatch(ctx, store.TaskClaimBatchParams{
				InstanceID: id, Types: []string{"email"}, Max: 10, LeaseTimeout: defaultLease, Now: now,
			})
			return err
		}
		require.ErrorIs(t, claim("nobody", t0), vigiltype.ErrNotFound)
		b.register(t, store.ProcessRegisterParams{InstanceID: "exited"})
		b.exit(t, "exited", t0)
		require.ErrorIs(t, claim("exited", t0), vigiltype.ErrInstanceExited)
		b.register(t, store.ProcessRegisterParams{InstanceID: "silent", LivenessIntervalS: 1})
		require.ErrorIs(t, claim("silent", at(3*time.Second+time.Millisecond)), vigiltype.ErrInstanceStopped)
		requireTaskEqual(t, task, b.getTask(t, task.TaskID))
	})

	t.Run("ConcurrentBatchesNeverShare", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		const (
			claimers = 6
			tasks    = 300
		)
		for i := range claimers {
			b.register(t, store.ProcessRegisterParams{InstanceID: fmt.Sprintf("w%d", i), LivenessIntervalS: 3600})
		}
		for i := range tasks {
			b.enqueue(t, store.TaskEnqueueParams{TaskType: []string{"a", "b", "c"}[i%3]})
		}
		now := at(time.Second)
		got := make([][]*vigiltype.Task, claimers)
		errs := make([]error, claimers)
		var wg sync.WaitGroup
		for i := range claimers {
			wg.Go(func() {
				for {
					batch, err := b.s.TaskClaimBatch(ctx, store.TaskClaimBatchParams{
						InstanceID: fmt.Sprintf("w%d", i), Types: []string{"a", "b", "c"}, Max: 1 + i*4,
						LeaseTimeout: defaultLease, Now: now,
					})
					if err != nil {
						errs[i] = err
						return
					}
					if len(batch) == 0 {
						return
					}
					if len(batch) > 1+i*4 {
						errs[i] = fmt.Errorf("batch of %d, max %d", len(batch), 1+i*4)
						return
					}
					got[i] = append(got[i], batch...)
				}
			})
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		seen := make(map[int64]string, tasks)
		for i, list := range got {
			owner := fmt.Sprintf("w%d", i)
			for _, task := range list {
				prev, dup := seen[task.TaskID]
				require.False(t, dup, "task %d claimed by %s and %s", task.TaskID, prev, owner)
				seen[task.TaskID] = owner
				require.Equal(t, int64(1), task.LeaseEpoch)
				require.Equal(t, ptr(owner), task.LeaseOwner)
			}
		}
		require.Len(t, seen, tasks)
		for id, owner := range seen {
			stored := b.getTask(t, id)
			require.Equal(t, int64(1), stored.LeaseEpoch, "task %d", id)
			require.Equal(t, ptr(owner), stored.LeaseOwner, "task %d", id)
			require.Equal(t, vigiltype.TaskRunning, stored.Status)
		}
	})
}
