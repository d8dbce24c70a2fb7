package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/store"
)

// exerciseClaimPick pins which task a claim of several types takes (issue
// #6 made the backends pick per type along the claim index): the oldest by
// run_after, then task id, across all the types, whatever their order or
// repetitions in Types and however many there are.
func exerciseClaimPick(ctx context.Context, t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("OldestAcrossTypes", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		a2 := b.enqueue(t, store.TaskEnqueueParams{TaskType: "a", RunAfter: at(2 * time.Second)})
		b1 := b.enqueue(t, store.TaskEnqueueParams{TaskType: "b", RunAfter: at(time.Second)})
		c1 := b.enqueue(t, store.TaskEnqueueParams{TaskType: "c", RunAfter: at(time.Second)})
		a0 := b.enqueue(t, store.TaskEnqueueParams{TaskType: "a", RunAfter: t0})
		later := b.enqueue(t, store.TaskEnqueueParams{TaskType: "b", RunAfter: at(time.Hour)})

		now := at(3 * time.Second)
		types := []string{"c", "b", "a", "c", "x"}
		require.Equal(t, a0.TaskID, b.claim(t, "w", now, types...).TaskID)
		require.Equal(t, b1.TaskID, b.claim(t, "w", now, types...).TaskID)
		require.Equal(t, c1.TaskID, b.claim(t, "w", now, types...).TaskID)
		require.Equal(t, a2.TaskID, b.claim(t, "w", now, types...).TaskID)
		require.Nil(t, b.tryClaim(t, "w", now, types...))
		require.Equal(t, later.TaskID, b.claim(t, "w", at(time.Hour), types...).TaskID)
	})

	t.Run("ManyTypes", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		types := make([]string, 100)
		for i := range types {
			types[i] = fmt.Sprintf("type-%03d", i)
		}
		newer := b.enqueue(t, store.TaskEnqueueParams{TaskType: types[3], RunAfter: at(time.Second)})
		older := b.enqueue(t, store.TaskEnqueueParams{TaskType: types[97], RunAfter: t0})
		now := at(time.Minute)
		require.Equal(t, older.TaskID, b.claim(t, "w", now, types...).TaskID)
		require.Equal(t, newer.TaskID, b.claim(t, "w", now, types...).TaskID)
		require.Nil(t, b.tryClaim(t, "w", now, types...))
	})
}
