package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// exerciseTaskStall covers stall kills (DESIGN S4): listing an agent's
// tasks running past the stall threshold, and taking one back by
// compare-and-swap on its epoch.
func exerciseTaskStall(ctx context.Context, t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("ListStalled", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		for _, p := range []store.ProcessRegisterParams{
			{InstanceID: "a1", ProcessKind: "agent-a"},
			{InstanceID: "a2", ProcessKind: "agent-a"},
			{InstanceID: "b1", ProcessKind: "agent-b"},
		} {
			p.LivenessIntervalS = 3600
			b.register(t, p)
		}
		cut := at(30 * time.Minute)

		// Started later, enqueued first: the order is by started_at, not id.
		late := b.enqueue(t, store.TaskEnqueueParams{TaskType: "late"})
		early1 := b.enqueue(t, store.TaskEnqueueParams{TaskType: "early1"})
		early2 := b.enqueue(t, store.TaskEnqueueParams{TaskType: "early2"})
		other := b.enqueue(t, store.TaskEnqueueParams{TaskType: "other"})
		b.claim(t, "a2", at(2*time.Second), "late")
		b.claim(t, "a1", t0, "early1")
		b.claim(t, "a2", t0, "early2")
		b.claim(t, "b1", t0, "other") // another agent's

		// Not candidates: started at or after the cut, not running, or
		// held by another kind now.
		b.enqueue(t, store.TaskEnqueueParams{TaskType: "atcut"})
		b.claim(t, "a1", cut, "atcut")
		b.enqueue(t, store.TaskEnqueueParams{TaskType: "after"})
		b.claim(t, "a1", cut.Add(time.Minute), "after")
		b.enqueue(t, store.TaskEnqueueParams{TaskType: "done"})
		done := b.claim(t, "a1", t0, "done")
		_, err := b.s.TaskComplete(ctx, store.TaskCompleteParams{TaskLease: leaseOf(done), Now: t0})
		require.NoError(t, err)
		b.enqueue(t, store.TaskEnqueueParams{TaskType: "idle"})
		b.enqueue(t, store.TaskEnqueueParams{TaskType: "released"})
		released := b.claim(t, "a1", t0, "released")
		_, err = b.s.TaskRelease(ctx, store.TaskReleaseParams{TaskLease: leaseOf(released), Now: t0})
		require.NoError(t, err)
		b.enqueue(t, store.TaskEnqueueParams{TaskType: "moved"})
		moved := b.claim(t, "a1", t0, "moved")
		_, err = b.s.TaskReclaimStalled(ctx, store.TaskReclaimStalledParams{
			TaskID: moved.TaskID, Epoch: moved.LeaseEpoch, Reason: "stalled", Now: t0,
		})
		require.NoError(t, err)
		b.claim(t, "b1", t0, "moved")

		list := func(t *testing.T, p store.TaskListStalledParams) []int64 {
			t.Helper()
			tasks, err := b.s.TaskListStalled(ctx, p)
			require.NoError(t, err)
			for _, task := range tasks {
				require.Equal(t, vigiltype.TaskRunning, task.Status)
			}
			return taskIDs(tasks)
		}
		for _, tt := range []struct {
			name   string
			params store.TaskListStalledParams
			want   []int64
		}{
			{"Kind", store.TaskListStalledParams{Kind: "agent-a", StartedBefore: cut}, []int64{early1.TaskID, early2.TaskID, late.TaskID}},
			// The cut is kept at millisecond precision and is exclusive.
			{"CutTruncated", store.TaskListStalledParams{Kind: "agent-a", StartedBefore: cut.Add(999 * time.Microsecond)}, []int64{early1.TaskID, early2.TaskID, late.TaskID}},
			{"CutAfterStart", store.TaskListStalledParams{Kind: "agent-a", StartedBefore: at(2*time.Second + time.Millisecond)}, []int64{early1.TaskID, early2.TaskID, late.TaskID}},
			{"CutAtStart", store.TaskListStalledParams{Kind: "agent-a", StartedBefore: at(2 * time.Second)}, []int64{early1.TaskID, early2.TaskID}},
			{"Limit", store.TaskListStalledParams{Kind: "agent-a", StartedBefore: cut, Limit: 2}, []int64{early1.TaskID, early2.TaskID}},
			{"OtherKind", store.TaskListStalledParams{Kind: "agent-b", StartedBefore: cut}, []int64{other.TaskID, moved.TaskID}},
			{"UnknownKind", store.TaskListStalledParams{Kind: "nobody", StartedBefore: cut}, nil},
			{"NothingBefore", store.TaskListStalledParams{Kind: "agent-a", StartedBefore: t0}, nil},
		} {
			t.Run(tt.name, func(t *testing.T) {
				require.Equal(t, tt.want, list(t, tt.params))
			})
		}

		// Listing is a read: the candidates are returned as stored.
		tasks, err := b.s.TaskListStalled(ctx, store.TaskListStalledParams{Kind: "agent-a", StartedBefore: cut})
		require.NoError(t, err)
		for _, task := range tasks {
			requireTaskEqual(t, b.getTask(t, task.TaskID), task)
		}
	})

	t.Run("ReclaimStalled", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", ProcessKind: "agent", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{})
		claimed := b.claim(t, "w", t0)
		b.requireCurrentTask(t, "w", claimed.TaskID, "email")

		// Neither the lease nor the holder has lapsed: only the stall
		// check takes it back. The reason is stored as given.
		now := at(31 * time.Minute)
		const reason = "stall_kill: running 31m0s, past stall_after 30m0s (agent's \"agent\")"
		task, err := b.s.TaskReclaimStalled(ctx, store.TaskReclaimStalledParams{
			TaskID: claimed.TaskID, Epoch: claimed.LeaseEpoch, Reason: reason,
			Now: now.Add(999 * time.Microsecond), // kept as now
		})
		require.NoError(t, err)
		want := *claimed
		want.Status = vigiltype.TaskScheduled
		want.Reclaims = 1
		want.RunAfter = now
		want.StartedAt = nil
		want.LeaseOwner = nil
		want.LeaseExpiresAt = nil
		want.LastError = ptr(reason)
		want.UpdatedAt = now
		requireTaskEqual(t, &want, task)
		requireTaskEqual(t, &want, b.getTask(t, claimed.TaskID))
		b.requireCurrentTask(t, "w", 0, "")
		stalled, err := b.s.TaskListStalled(ctx, store.TaskListStalledParams{Kind: "agent", StartedBefore: now})
		require.NoError(t, err)
		require.Empty(t, stalled)

		// The old holder is fenced off; the task is claimable again at a
		// higher epoch.
		_, err = b.s.TaskHeartbeat(ctx, store.TaskHeartbeatParams{
			TaskLease: leaseOf(claimed), LeaseTimeout: defaultLease, SchemaVersion: 1, Now: now,
		})
		require.ErrorIs(t, err, vigiltype.ErrStaleEpoch)
		again := b.claim(t, "w", now)
		require.Equal(t, claimed.TaskID, again.TaskID)
		require.EqualValues(t, 2, again.LeaseEpoch)
		b.requireCurrentTask(t, "w", again.TaskID, "email")
	})

	t.Run("ReclaimStalledLostRace", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", ProcessKind: "agent", LivenessIntervalS: 3600})
		now := at(time.Hour)
		reclaimStalled := func(taskID, epoch int64) error {
			_, err := b.s.TaskReclaimStalled(ctx, store.TaskReclaimStalledParams{
				TaskID: taskID, Epoch: epoch, Reason: "stalled", Now: now,
			})
			return err
		}

		// Re-claimed in between (the epoch moved): the old epoch is stale
		// and the new lease is left as it is.
		b.enqueue(t, store.TaskEnqueueParams{TaskType: "moved"})
		first := b.claim(t, "w", t0, "moved")
		_, err := b.s.TaskRelease(ctx, store.TaskReleaseParams{TaskLease: leaseOf(first), Now: t0})
		require.NoError(t, err)
		second := b.claim(t, "w", at(time.Second), "moved")
		require.EqualValues(t, 2, second.LeaseEpoch)
		err = reclaimStalled(first.TaskID, first.LeaseEpoch)
		require.ErrorIs(t, err, vigiltype.ErrStaleEpoch)
		require.ErrorContains(t, err, fmt.Sprintf("task %d: ", first.TaskID))
		requireTaskEqual(t, second, b.getTask(t, second.TaskID))
		b.requireCurrentTask(t, "w", second.TaskID, "moved")
		// A later epoch than the current one is stale too.
		require.ErrorIs(t, reclaimStalled(second.TaskID, second.LeaseEpoch+1), vigiltype.ErrStaleEpoch)
		requireTaskEqual(t, second, b.getTask(t, second.TaskID))

		// Completed in between: stale, the result stays.
		b.enqueue(t, store.TaskEnqueueParams{TaskType: "done"})
		done := b.claim(t, "w", t0, "done")
		completed, err := b.s.TaskComplete(ctx, store.TaskCompleteParams{
			TaskLease: leaseOf(done), Result: json.RawMessage(`{"ok": true}`), Now: at(time.Second),
		})
		require.NoError(t, err)
		require.ErrorIs(t, reclaimStalled(done.TaskID, done.LeaseEpoch), vigiltype.ErrStaleEpoch)
		requireTaskEqual(t, completed, b.getTask(t, done.TaskID))

		// Never claimed (scheduled at epoch 0): stale.
		idle := b.enqueue(t, store.TaskEnqueueParams{TaskType: "idle"})
		require.ErrorIs(t, reclaimStalled(idle.TaskID, 0), vigiltype.ErrStaleEpoch)
		requireTaskEqual(t, idle, b.getTask(t, idle.TaskID))

		// Missing.
		err = reclaimStalled(999999, 1)
		require.ErrorIs(t, err, vigiltype.ErrNotFound)
		require.ErrorContains(t, err, "task 999999: ")
	})

	t.Run("ReclaimStalledDeadLetter", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", ProcessKind: "agent", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{MaxReclaims: 1})

		// Reclaim 1 of max 1 (by the lease sweeper): back to scheduled.
		b.claim(t, "w", t0)
		require.Len(t, b.reclaim(t, at(defaultLease+time.Millisecond)), 1)

		// Reclaim 2 of max 1 (by the stall check): dead letter, the run's
		// started_at and run_after kept, the reason after the count.
		start := at(time.Hour)
		claimed := b.claim(t, "w", start)
		require.EqualValues(t, 2, claimed.LeaseEpoch)
		now := start.Add(31 * time.Minute)
		task, err := b.s.TaskReclaimStalled(ctx, store.TaskReclaimStalledParams{
			TaskID: claimed.TaskID, Epoch: claimed.LeaseEpoch, Reason: "stalled", Now: now,
		})
		require.NoError(t, err)
		want := *claimed
		want.Status = vigiltype.TaskDeadLetter
		want.Reclaims = 2
		want.LeaseOwner = nil
		want.LeaseExpiresAt = nil
		want.UpdatedAt = now
		want.LastError = ptr("dead-lettered: reclaimed 2 times (max_reclaims 1): stalled")
		requireTaskEqual(t, &want, task)
		requireTaskEqual(t, &want, b.getTask(t, claimed.TaskID))
		b.requireCurrentTask(t, "w", 0, "")
		require.Nil(t, b.tryClaim(t, "w", at(2*time.Hour)))

		// max_reclaims 0: the first reclaim dead-letters.
		zero, err := b.s.TaskEnqueue(ctx, store.TaskEnqueueParams{
			TaskType: "zero", MaxAttempts: 1, MaxReclaims: 0, RunAfter: t0, Now: t0,
		})
		require.NoError(t, err)
		held := b.claim(t, "w", t0, "zero")
		task, err = b.s.TaskReclaimStalled(ctx, store.TaskReclaimStalledParams{
			TaskID: zero.TaskID, Epoch: held.LeaseEpoch, Reason: "stalled", Now: now,
		})
		require.NoError(t, err)
		require.Equal(t, vigiltype.TaskDeadLetter, task.Status)
		require.Equal(t, ptr("dead-lettered: reclaimed 1 times (max_reclaims 0): stalled"), task.LastError)
	})

	t.Run("ReclaimStalledClearsOnlyItsCurrentTask", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		// w holds two tasks; its current one is the later claim. Taking
		// back the other leaves the current one alone.
		b.register(t, store.ProcessRegisterParams{InstanceID: "w", ProcessKind: "agent", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{TaskType: "a"})
		b.enqueue(t, store.TaskEnqueueParams{TaskType: "b"})
		a := b.claim(t, "w", t0, "a")
		bTask := b.claim(t, "w", t0, "b")
		b.requireCurrentTask(t, "w", bTask.TaskID, "b")

		_, err := b.s.TaskReclaimStalled(ctx, store.TaskReclaimStalledParams{
			TaskID: a.TaskID, Epoch: a.LeaseEpoch, Reason: "stalled", Now: at(time.Hour),
		})
		require.NoError(t, err)
		b.requireCurrentTask(t, "w", bTask.TaskID, "b")
		requireTaskEqual(t, bTask, b.getTask(t, bTask.TaskID))

		_, err = b.s.TaskReclaimStalled(ctx, store.TaskReclaimStalledParams{
			TaskID: bTask.TaskID, Epoch: bTask.LeaseEpoch, Reason: "stalled", Now: at(time.Hour),
		})
		require.NoError(t, err)
		b.requireCurrentTask(t, "w", 0, "")
	})

	t.Run("ConcurrentReclaimStalled", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		// Several stall checks and the holder's completion racing for one
		// lease: exactly one write wins, every other is refused as stale.
		const racers = 8
		b.register(t, store.ProcessRegisterParams{InstanceID: "w", ProcessKind: "agent", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{})
		claimed := b.claim(t, "w", t0)
		now := at(time.Hour)
		errs := make([]error, racers+1)
		var wg sync.WaitGroup
		for i := range racers {
			wg.Go(func() {
				_, errs[i] = b.s.TaskReclaimStalled(ctx, store.TaskReclaimStalledParams{
					TaskID: claimed.TaskID, Epoch: claimed.LeaseEpoch, Reason: "stalled", Now: now,
				})
			})
		}
		wg.Go(func() {
			_, errs[racers] = b.s.TaskComplete(ctx, store.TaskCompleteParams{TaskLease: leaseOf(claimed), Now: now})
		})
		wg.Wait()

		won := 0
		for _, err := range errs {
			if err == nil {
				won++
				continue
			}
			require.ErrorIs(t, err, vigiltype.ErrStaleEpoch)
		}
		require.Equal(t, 1, won)
		task := b.getTask(t, claimed.TaskID)
		if errs[racers] == nil {
			require.Equal(t, vigiltype.TaskCompleted, task.Status)
			require.Zero(t, task.Reclaims)
		} else {
			require.Equal(t, vigiltype.TaskScheduled, task.Status)
			require.Equal(t, 1, task.Reclaims)
		}
		b.requireCurrentTask(t, "w", 0, "")
	})
}
