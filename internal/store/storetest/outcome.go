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

// exerciseRepeatedOutcome pins DESIGN T8: a complete or fail repeated by
// the holder at the epoch its lease ended with (its first answer was lost)
// answers with the stored task and writes nothing; the same call with a
// different result or error text is ErrOutcomeConflict naming the field;
// anyone else, or another epoch, is still ErrStaleEpoch.
func exerciseRepeatedOutcome(ctx context.Context, t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("CompleteRepeated", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		b.register(t, store.ProcessRegisterParams{InstanceID: "other", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{})
		claimed := b.claim(t, "w", t0)
		lease := leaseOf(claimed)

		first, err := b.s.TaskComplete(ctx, store.TaskCompleteParams{
			TaskLease: lease, Result: json.RawMessage(`{"a": 1, "b": [1, 2.5, "x"], "c": null}`), Now: at(time.Second),
		})
		require.NoError(t, err)

		// The same result, spelled differently (key order, white space),
		// later: the stored task, unchanged.
		again, err := b.s.TaskComplete(ctx, store.TaskCompleteParams{
			TaskLease: lease, Result: json.RawMessage(`{"c":null,"b":[1,2.5,"x"],"a":1}`), Now: at(5 * time.Second),
		})
		require.NoError(t, err)
		requireTaskEqual(t, first, again)
		requireTaskEqual(t, first, b.getTask(t, claimed.TaskID))

		// A different result is refused naming the field; nothing changes.
		for _, other := range []string{`{"a": 2, "b": [1, 2.5, "x"], "c": null}`, `{"a": 1.0, "b": [1, 2.5, "x"], "c": null}`, `null`} {
			_, err = b.s.TaskComplete(ctx, store.TaskCompleteParams{
				TaskLease: lease, Result: json.RawMessage(other), Now: at(6 * time.Second),
			})
			require.ErrorIs(t, err, vigiltype.ErrOutcomeConflict, other)
			require.NotErrorIs(t, err, vigiltype.ErrStaleEpoch)
			var oe *vigiltype.OutcomeConflictError
			require.ErrorAs(t, err, &oe)
			require.Equal(t, "result", oe.Field)
			requireTaskEqual(t, first, b.getTask(t, claimed.TaskID))
		}

		// Another instance, or another epoch, is stale as before.
		for _, stale := range []store.TaskLease{
			{TaskID: lease.TaskID, Epoch: lease.Epoch, InstanceID: "other"},
			{TaskID: lease.TaskID, Epoch: lease.Epoch + 1, InstanceID: "w"},
			{TaskID: lease.TaskID, Epoch: lease.Epoch - 1, InstanceID: "w"},
		} {
			_, err = b.s.TaskComplete(ctx, store.TaskCompleteParams{
				TaskLease: stale, Result: json.RawMessage(`{"a": 1, "b": [1, 2.5, "x"], "c": null}`), Now: at(6 * time.Second),
			})
			require.ErrorIs(t, err, vigiltype.ErrStaleEpoch, "%+v", stale)
		}

		// A lease that ended with a fail is not completed by a repeat.
		_, err = b.s.TaskFail(ctx, store.TaskFailParams{TaskLease: lease, Error: "boom", RetryAt: at(time.Hour), Now: at(7 * time.Second)})
		require.ErrorIs(t, err, vigiltype.ErrStaleEpoch)
	})

	t.Run("CompleteRepeatedNull", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{})
		claimed := b.claim(t, "w", t0)
		lease := leaseOf(claimed)

		// No result (NULL) and a JSON null are the same value.
		first, err := b.s.TaskComplete(ctx, store.TaskCompleteParams{TaskLease: lease, Now: at(time.Second)})
		require.NoError(t, err)
		for _, same := range []json.RawMessage{nil, json.RawMessage(`null`)} {
			again, err := b.s.TaskComplete(ctx, store.TaskCompleteParams{TaskLease: lease, Result: same, Now: at(2 * time.Second)})
			require.NoError(t, err)
			requireTaskEqual(t, first, again)
		}
		_, err = b.s.TaskComplete(ctx, store.TaskCompleteParams{TaskLease: lease, Result: json.RawMessage(`{}`), Now: at(2 * time.Second)})
		require.ErrorIs(t, err, vigiltype.ErrOutcomeConflict)
	})

	t.Run("FailRepeated", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		b.register(t, store.ProcessRegisterParams{InstanceID: "other", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{MaxAttempts: 2})
		claimed := b.claim(t, "w", t0)
		lease := leaseOf(claimed)

		first, err := b.s.TaskFail(ctx, store.TaskFailParams{
			TaskLease: lease, Error: "boom", RetryAt: at(time.Minute), Now: at(time.Second),
		})
		require.NoError(t, err)
		require.Equal(t, 1, first.Attempts)

		// The same fail again, later and with another retry time: the stored
		// task, the attempt counted once.
		again, err := b.s.TaskFail(ctx, store.TaskFailParams{
			TaskLease: lease, Error: "boom", RetryAt: at(2 * time.Minute), Now: at(5 * time.Second),
		})
		require.NoError(t, err)
		requireTaskEqual(t, first, again)
		requireTaskEqual(t, first, b.getTask(t, claimed.TaskID))

		// Another text is refused naming the field.
		_, err = b.s.TaskFail(ctx, store.TaskFailParams{
			TaskLease: lease, Error: "bang", RetryAt: at(time.Minute), Now: at(6 * time.Second),
		})
		require.ErrorIs(t, err, vigiltype.ErrOutcomeConflict)
		var oe *vigiltype.OutcomeConflictError
		require.ErrorAs(t, err, &oe)
		require.Equal(t, "error", oe.Field)
		requireTaskEqual(t, first, b.getTask(t, claimed.TaskID))

		// Another instance, or another epoch, is stale; so is a complete of
		// a lease that ended with a fail.
		for _, stale := range []store.TaskLease{
			{TaskID: lease.TaskID, Epoch: lease.Epoch, InstanceID: "other"},
			{TaskID: lease.TaskID, Epoch: lease.Epoch + 1, InstanceID: "w"},
		} {
			_, err = b.s.TaskFail(ctx, store.TaskFailParams{TaskLease: stale, Error: "boom", RetryAt: at(time.Minute), Now: at(6 * time.Second)})
			require.ErrorIs(t, err, vigiltype.ErrStaleEpoch, "%+v", stale)
		}
		_, err = b.s.TaskComplete(ctx, store.TaskCompleteParams{TaskLease: lease, Now: at(6 * time.Second)})
		require.ErrorIs(t, err, vigiltype.ErrStaleEpoch)

		// The next claim starts a new lease: the old epoch is stale, and the
		// new one's fail that dead-letters the task repeats alike.
		second := b.claim(t, "w", at(time.Minute))
		require.EqualValues(t, lease.Epoch+1, second.LeaseEpoch)
		_, err = b.s.TaskFail(ctx, store.TaskFailParams{TaskLease: lease, Error: "boom", RetryAt: at(time.Hour), Now: at(61 * time.Second)})
		require.ErrorIs(t, err, vigiltype.ErrStaleEpoch)
		dead, err := b.s.TaskFail(ctx, store.TaskFailParams{
			TaskLease: leaseOf(second), Error: "boom again", RetryAt: at(time.Hour), Now: at(62 * time.Second),
		})
		require.NoError(t, err)
		require.Equal(t, vigiltype.TaskDeadLetter, dead.Status)
		again, err = b.s.TaskFail(ctx, store.TaskFailParams{
			TaskLease: leaseOf(second), Error: "boom again", RetryAt: at(time.Hour), Now: at(63 * time.Second),
		})
		require.NoError(t, err)
		requireTaskEqual(t, dead, again)
		require.Equal(t, 2, again.Attempts)
	})

	t.Run("FailAfterReleaseIsStale", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		// A fail at one epoch is not mistaken for a repeat at a later epoch
		// of the same holder that ended otherwise (released, reclaimed),
		// though its last_error still holds the earlier text.
		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{})
		first := b.claim(t, "w", t0)
		_, err := b.s.TaskFail(ctx, store.TaskFailParams{TaskLease: leaseOf(first), Error: "boom", RetryAt: t0, Now: t0})
		require.NoError(t, err)
		second := b.claim(t, "w", at(time.Second))
		_, err = b.s.TaskRelease(ctx, store.TaskReleaseParams{TaskLease: leaseOf(second), Now: at(2 * time.Second)})
		require.NoError(t, err)
		released := b.getTask(t, second.TaskID)
		require.Equal(t, ptr("boom"), released.LastError)
		_, err = b.s.TaskFail(ctx, store.TaskFailParams{TaskLease: leaseOf(second), Error: "boom", RetryAt: t0, Now: at(3 * time.Second)})
		require.ErrorIs(t, err, vigiltype.ErrStaleEpoch)
		requireTaskEqual(t, released, b.getTask(t, second.TaskID))
	})

	t.Run("BatchRepeated", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{})
		b.enqueue(t, store.TaskEnqueueParams{})
		held := b.claimBatch(t, "w", t0, 2)
		require.Len(t, held, 2)
		now := at(time.Second)
		items := []store.TaskCompleteParams{
			{TaskLease: leaseOf(held[0]), Result: json.RawMessage(`{"n": 0}`), Now: now},
			{TaskLease: leaseOf(held[1]), Result: json.RawMessage(`{"n": 1}`), Now: now},
		}
		first, err := b.s.TaskCompleteBatch(ctx, items)
		require.NoError(t, err)

		// The whole batch again (its answer was lost), and one item with
		// another result.
		later := at(3 * time.Second)
		items[0].Now, items[1].Now = later, later
		items = append(items, store.TaskCompleteParams{TaskLease: leaseOf(held[1]), Result: json.RawMessage(`{"n": 2}`), Now: later})
		again, err := b.s.TaskCompleteBatch(ctx, items)
		require.NoError(t, err)
		require.Len(t, again, 3)
		require.NoError(t, again[0].Err)
		require.NoError(t, again[1].Err)
		requireTaskEqual(t, first[0].Task, again[0].Task)
		requireTaskEqual(t, first[1].Task, again[1].Task)
		require.Nil(t, again[2].Task)
		require.ErrorIs(t, again[2].Err, vigiltype.ErrOutcomeConflict)
		requireTaskEqual(t, first[1].Task, b.getTask(t, held[1].TaskID))
	})
}
