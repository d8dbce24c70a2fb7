package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// exerciseHeartbeatBatch covers ProcessHeartbeatBatch, the group commit of
// liveness heartbeats: each item answered as ProcessHeartbeat would answer
// it, one write per instance at its latest Now.
func exerciseHeartbeatBatch(ctx context.Context, t *testing.T, newStore func(t *testing.T) store.Store) {
	beat := func(id string, d time.Duration) store.ProcessHeartbeatParams {
		return store.ProcessHeartbeatParams{InstanceID: id, TokenHash: tokenHash(id), Now: at(d)}
	}

	t.Run("WritesEachLikeProcessHeartbeat", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "a", LivenessIntervalS: 10})
		b.register(t, store.ProcessRegisterParams{InstanceID: "b", LivenessIntervalS: 1.5})
		// A twin of b that gets the same heartbeat through ProcessHeartbeat.
		b.register(t, store.ProcessRegisterParams{InstanceID: "twin", LivenessIntervalS: 1.5})

		res, err := b.s.ProcessHeartbeatBatch(ctx, []store.ProcessHeartbeatParams{
			beat("a", 40*time.Second),
			beat("b", time.Second+1234567*time.Nanosecond), // kept to the millisecond
		})
		require.NoError(t, err)
		require.Len(t, res, 2)
		for _, r := range res {
			require.NoError(t, r.Err)
		}
		require.Equal(t, at(40*time.Second), res[0].Process.LastHeartbeatAt)
		require.Equal(t, vigiltype.ProcessAlive, res[0].Process.Status)
		require.Equal(t, b.get(t, "a", at(40*time.Second)), res[0].Process, "the row as written")
		b.requireStatus(t, "a", at(70*time.Second), vigiltype.ProcessAlive)
		b.requireStatus(t, "a", at(70*time.Second+time.Millisecond), vigiltype.ProcessStopped)

		twin, err := b.s.ProcessHeartbeat(ctx, beat("twin", time.Second+1234567*time.Nanosecond))
		require.NoError(t, err)
		got := *res[1].Process
		got.InstanceID = "twin"
		require.Equal(t, twin, &got, "the same answer as ProcessHeartbeat")
		// 3 × 1.5s after the heartbeat at 1.001s.
		b.requireStatus(t, "b", at(5501*time.Millisecond), vigiltype.ProcessAlive)
		b.requireStatus(t, "b", at(5502*time.Millisecond), vigiltype.ProcessStopped)
	})

	t.Run("LastValueWinsPerInstance", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "a"})
		b.register(t, store.ProcessRegisterParams{InstanceID: "b"})
		res, err := b.s.ProcessHeartbeatBatch(ctx, []store.ProcessHeartbeatParams{
			beat("a", 10*time.Second),
			beat("b", 5*time.Second),
			beat("a", 12*time.Second),
			beat("a", 11*time.Second), // later in the batch, earlier in time: the latest time wins
		})
		require.NoError(t, err)
		require.Len(t, res, 4)
		for _, i := range []int{0, 2, 3} {
			require.NoError(t, res[i].Err)
			require.Equal(t, at(12*time.Second), res[i].Process.LastHeartbeatAt, "item %d", i)
		}
		require.Equal(t, at(5*time.Second), res[1].Process.LastHeartbeatAt)
		require.Equal(t, at(12*time.Second), b.get(t, "a", at(12*time.Second)).LastHeartbeatAt)
		require.NotSame(t, res[0].Process, res[2].Process, "each item gets its own copy")
	})

	t.Run("RefusalsAreEachItemsOwn", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "ok"})
		b.register(t, store.ProcessRegisterParams{InstanceID: "wrong-token"})
		b.register(t, store.ProcessRegisterParams{InstanceID: "exited"})
		exited := b.exit(t, "exited", at(time.Second))
		before := b.get(t, "wrong-token", t0)

		wrong := beat("wrong-token", 10*time.Second)
		wrong.TokenHash = "wrong"
		exitedWrong := beat("exited", 10*time.Second)
		exitedWrong.TokenHash = "wrong"
		okWrong := beat("ok", 10*time.Second)
		okWrong.TokenHash = "wrong"
		res, err := b.s.ProcessHeartbeatBatch(ctx, []store.ProcessHeartbeatParams{
			beat("missing", 10*time.Second),
			wrong,
			beat("exited", 10*time.Second),
			exitedWrong, // the token is checked before the exit
			beat("ok", 10*time.Second),
			okWrong, // the same instance with a wrong token: refused alone
		})
		require.NoError(t, err)
		require.Len(t, res, 6)
		require.ErrorIs(t, res[0].Err, vigiltype.ErrNotFound)
		require.ErrorContains(t, res[0].Err, "missing")
		require.ErrorIs(t, res[1].Err, vigiltype.ErrInvalidToken)
		require.ErrorIs(t, res[2].Err, vigiltype.ErrInstanceExited)
		require.ErrorIs(t, res[3].Err, vigiltype.ErrInvalidToken)
		require.NoError(t, res[4].Err)
		require.Equal(t, at(10*time.Second), res[4].Process.LastHeartbeatAt)
		require.ErrorIs(t, res[5].Err, vigiltype.ErrInvalidToken)
		for i, r := range res {
			if r.Err != nil {
				require.Nil(t, r.Process, "item %d", i)
			}
		}
		require.Equal(t, before, b.get(t, "wrong-token", t0), "a refused heartbeat writes nothing")
		require.Equal(t, exited, b.get(t, "exited", at(time.Second)))
	})

	t.Run("Empty", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		res, err := b.s.ProcessHeartbeatBatch(ctx, nil)
		require.NoError(t, err)
		require.Empty(t, res)
	})

	t.Run("Large", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		var items []store.ProcessHeartbeatParams
		for i := range 300 {
			id := fmt.Sprintf("inst-%03d", i)
			b.register(t, store.ProcessRegisterParams{InstanceID: id})
			items = append(items, beat(id, time.Duration(i)*time.Millisecond))
		}
		res, err := b.s.ProcessHeartbeatBatch(ctx, items)
		require.NoError(t, err)
		require.Len(t, res, len(items))
		for i, r := range res {
			require.NoError(t, r.Err)
			require.Equal(t, items[i].InstanceID, r.Process.InstanceID)
			require.Equal(t, items[i].Now, r.Process.LastHeartbeatAt)
		}
	})
}
