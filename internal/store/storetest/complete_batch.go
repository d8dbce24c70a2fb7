package storetest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// completedAs is claimed as TaskComplete leaves it when completed at now
// with result.
func completedAs(claimed *vigiltype.Task, result json.RawMessage, now time.Time) *vigiltype.Task {
	want := *claimed
	want.Status = vigiltype.TaskCompleted
	want.Result = result
	want.CompletedBy = claimed.LeaseOwner
	want.CompletedAt = ptr(now)
	want.LeaseOwner = nil
	want.LeaseExpiresAt = nil
	want.UpdatedAt = now
	return &want
}

// exerciseCompleteBatch pins TaskCompleteBatch: every item checked and
// written exactly as TaskComplete, each with its own outcome in request
// order, so that a stale, unknown or invalid item fails alone.
func exerciseCompleteBatch(ctx context.Context, t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("EachItemItsOwnOutcome", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		b.register(t, store.ProcessRegisterParams{InstanceID: "other", LivenessIntervalS: 3600})
		for range 5 {
			b.enqueue(t, store.TaskEnqueueParams{})
		}
		held := b.claimBatch(t, "w", t0, 4)
		require.Len(t, held, 4)
		theirs := b.claim(t, "other", t0)

		now := at(time.Second)
		stale := leaseOf(held[1])
		stale.Epoch++
		notHeld := leaseOf(theirs)
		notHeld.InstanceID = "w"
		items := []store.TaskCompleteParams{
			{TaskLease: leaseOf(held[3]), Result: json.RawMessage(`{"ok": 3}`), Now: now}, // good, out of id order
			{TaskLease: stale, Result: json.RawMessage(`1`), Now: now},                    // stale epoch
			{TaskLease: store.TaskLease{TaskID: held[3].TaskID + 1000, Epoch: 1, InstanceID: "w"}, Now: now},
			{TaskLease: notHeld, Now: now},                                        // another instance's lease
			{TaskLease: leaseOf(held[2]), Result: json.RawMessage(`{`), Now: now}, // invalid JSON
			{TaskLease: leaseOf(held[0]), Now: now},                               // good, no result
			{TaskLease: leaseOf(held[3]), Result: json.RawMessage(`2`), Now: now}, // already completed above, with another result
		}
		results, err := b.s.TaskCompleteBatch(ctx, items)
		require.NoError(t, err)
		require.Len(t, results, len(items))

		requireTaskEqual(t, completedAs(held[3], json.RawMessage(`{"ok": 3}`), now), results[0].Task)
		require.NoError(t, results[0].Err)
		require.ErrorIs(t, results[1].Err, vigiltype.ErrStaleEpoch)
		require.ErrorIs(t, results[2].Err, vigiltype.ErrNotFound)
		require.ErrorIs(t, results[3].Err, vigiltype.ErrStaleEpoch)
		require.ErrorIs(t, results[4].Err, vigiltype.ErrInvalid)
		requireTaskEqual(t, completedAs(held[0], nil, now), results[5].Task)
		require.NoError(t, results[5].Err)
		require.ErrorIs(t, results[6].Err, vigiltype.ErrOutcomeConflict)
		for _, i := range []int{1, 2, 3, 4, 6} {
			require.Nil(t, results[i].Task, "item %d", i)
		}

		// What was written is what the good items' results say; the
		// refused items' tasks are as they were.
		requireTaskEqual(t, results[0].Task, b.getTask(t, held[3].TaskID))
		requireTaskEqual(t, results[5].Task, b.getTask(t, held[0].TaskID))
		requireTaskEqual(t, held[1], b.getTask(t, held[1].TaskID))
		requireTaskEqual(t, held[2], b.getTask(t, held[2].TaskID))
		requireTaskEqual(t, theirs, b.getTask(t, theirs.TaskID))
		// The holder's current task (the batch claim's last) was completed,
		// so it is cleared, as TaskComplete clears it; the other's stays.
		b.requireCurrentTask(t, "w", 0, "")
		b.requireCurrentTask(t, "other", theirs.TaskID, "email")

		// The refused leases are still held and complete on their own.
		_, err = b.s.TaskComplete(ctx, store.TaskCompleteParams{TaskLease: leaseOf(held[1]), Now: now})
		require.NoError(t, err)
	})

	t.Run("SameAsSingleComplete", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{})
		b.enqueue(t, store.TaskEnqueueParams{})
		held := b.claimBatch(t, "w", t0, 2)
		require.Len(t, held, 2)
		now := at(2 * time.Second)
		single, err := b.s.TaskComplete(ctx, store.TaskCompleteParams{TaskLease: leaseOf(held[0]), Result: json.RawMessage(`[1,2]`), Now: now})
		require.NoError(t, err)
		results, err := b.s.TaskCompleteBatch(ctx, []store.TaskCompleteParams{{TaskLease: leaseOf(held[1]), Result: json.RawMessage(`[1,2]`), Now: now}})
		require.NoError(t, err)
		require.Len(t, results, 1)
		require.NoError(t, results[0].Err)
		got := *results[0].Task
		got.TaskID, got.LeaseEpoch, got.CreatedAt = single.TaskID, single.LeaseEpoch, single.CreatedAt
		requireTaskEqual(t, single, &got)
	})

	t.Run("Empty", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)
		results, err := b.s.TaskCompleteBatch(ctx, nil)
		require.NoError(t, err)
		require.Empty(t, results)
	})
}
