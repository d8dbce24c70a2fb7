package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// pulseGap is the gap the pulse tests count as an outage.
const pulseGap = 2 * time.Second

func (b *testBundle) pulse(t *testing.T, now time.Time) *store.StorePulseResult {
	t.Helper()
	res, err := b.s.StorePulse(b.ctx, store.StorePulseParams{Now: now, Gap: pulseGap})
	require.NoError(t, err)
	return res
}

func exercisePulse(ctx context.Context, t *testing.T, newStore func(t *testing.T) store.Store) {
	// DESIGN L8: an instance alive when the store went away is not judged
	// stopped, nor its lease reclaimed, until it has had a full alive
	// window of writable store; the reads say so.
	t.Run("OutageGivesAFullWindow", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)
		require.Zero(t, *b.pulse(t, at(0)), "the first pulse only records")
		live := b.register(t, store.ProcessRegisterParams{LivenessIntervalS: 2, Now: at(0)}) // window 6s
		dead := b.register(t, store.ProcessRegisterParams{LivenessIntervalS: 1, Now: at(-10 * time.Second)})
		gone := b.register(t, store.ProcessRegisterParams{LivenessIntervalS: 2, Now: at(0)})
		b.exit(t, gone.InstanceID, at(time.Second))
		b.enqueue(t, store.TaskEnqueueParams{})
		task := b.claim(t, live.InstanceID, at(time.Second))
		require.Equal(t, vigiltype.ProcessStopped, b.get(t, dead.InstanceID, at(0)).Status)

		// The store is away from 0s to 10s: no pulse, no heartbeat.
		res := b.pulse(t, at(10*time.Second))
		require.Equal(t, at(0), res.OutageFrom)
		require.Equal(t, at(10*time.Second), res.OutageTo)
		require.Equal(t, int64(1), res.GraceProcesses, "only the instance alive at the last pulse")
		require.Equal(t, int64(1), res.GraceLeases, "the lease, too, gets its full window from the store's return")

		p := b.get(t, live.InstanceID, at(15*time.Second))
		require.Equal(t, vigiltype.ProcessAlive, p.Status, "a full window after the store came back")
		require.NotNil(t, p.GraceUntil)
		require.Equal(t, at(16*time.Second), *p.GraceUntil)
		require.Contains(t, p.StatusReason, "store outage grace")
		require.Equal(t, vigiltype.ProcessStopped, b.get(t, dead.InstanceID, at(15*time.Second)).Status, "dead before the outage")
		require.Equal(t, vigiltype.ProcessStopped, b.get(t, gone.InstanceID, at(15*time.Second)).Status)
		alive, err := b.s.ProcessList(b.ctx, store.ProcessListParams{Status: vigiltype.ProcessAlive, Now: at(15 * time.Second)})
		require.NoError(t, err)
		require.Len(t, alive, 1, "the status filter agrees")
		require.Empty(t, b.reclaim(t, at(15*time.Second)), "its lease is not reclaimed in the grace")

		// A heartbeat ends the grace; without one it ends with the window.
		require.Equal(t, vigiltype.ProcessStopped, b.get(t, live.InstanceID, at(16*time.Second+time.Millisecond)).Status)
		got := b.reclaim(t, at(16*time.Second+time.Millisecond))
		require.Len(t, got, 1)
		require.Equal(t, task.TaskID, got[0].TaskID)
	})

	t.Run("OutageRestartsLeaseWindows", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)
		b.pulse(t, at(0))
		proc := b.register(t, store.ProcessRegisterParams{LivenessIntervalS: 600, Now: at(0)})
		b.enqueue(t, store.TaskEnqueueParams{})
		task, err := b.s.TaskClaim(b.ctx, store.TaskClaimParams{
			InstanceID: proc.InstanceID, Types: []string{"email"}, LeaseTimeout: 4 * time.Second, Now: at(0),
		})
		require.NoError(t, err)
		require.NotNil(t, task)
		// The lease ran out at 4s, inside a 1s–20s outage; the reclaim
		// pass's own pulse finds the gap first.
		got, err := b.s.TaskReclaim(b.ctx, store.TaskReclaimParams{
			Now: at(20 * time.Second), Pulse: &store.StorePulseParams{Gap: pulseGap},
		})
		require.NoError(t, err)
		require.Empty(t, got, "not reclaimed for renewals the outage kept out")
		cur := b.getTask(t, task.TaskID)
		require.Equal(t, vigiltype.TaskRunning, cur.Status)
		require.Equal(t, at(24*time.Second), *cur.LeaseExpiresAt, "a full lease window from the store's return")
		// Silent past that window with the store up: reclaimed as ever.
		for s := 21; s <= 24; s++ {
			b.pulse(t, at(time.Duration(s)*time.Second))
		}
		got, err = b.s.TaskReclaim(b.ctx, store.TaskReclaimParams{
			Now: at(24*time.Second + time.Millisecond), Pulse: &store.StorePulseParams{Gap: pulseGap},
		})
		require.NoError(t, err)
		require.Len(t, got, 1)
	})

	t.Run("NoGapNoGrace", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)
		proc := b.register(t, store.ProcessRegisterParams{LivenessIntervalS: 1, Now: at(0)})
		for i := range 5 {
			require.Zero(t, *b.pulse(t, at(time.Duration(i)*time.Second)))
		}
		require.Equal(t, vigiltype.ProcessStopped, b.get(t, proc.InstanceID, at(4*time.Second)).Status,
			"a store written every second gives no grace")
	})

	// A server that answered 503 since its last pulse forces the grace
	// however short the gap: a heartbeat it refused may have been lost.
	t.Run("ForcedPulseGivesGraceForAShortGap", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)
		b.pulse(t, at(0))
		proc := b.register(t, store.ProcessRegisterParams{LivenessIntervalS: 0.5, Now: at(0)}) // window 1.5s
		res, err := b.s.StorePulse(b.ctx, store.StorePulseParams{Now: at(time.Second), Gap: pulseGap, Force: true})
		require.NoError(t, err)
		require.Equal(t, int64(1), res.GraceProcesses)
		require.Equal(t, at(0), res.OutageFrom)
		p := b.get(t, proc.InstanceID, at(2*time.Second))
		require.Equal(t, vigiltype.ProcessAlive, p.Status)
		require.Equal(t, at(2500*time.Millisecond), *p.GraceUntil)
	})

	// DESIGN L9: a heartbeat dated in the future does not keep an
	// instance alive for the time it was dated for: one alive window from
	// when the pulse saw it, no more. A live holder (its server's clock
	// stepped back) heartbeats within that window and keeps its task —
	// its lease is not cut (attacker finding: cutting it put a second
	// runner on the task); a dead one is then judged, its lease taken
	// back, and prune can remove it.
	t.Run("FutureRowsKeepOneWindow", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)
		dead := b.register(t, store.ProcessRegisterParams{LivenessIntervalS: 2, Now: at(time.Hour)})
		live := b.register(t, store.ProcessRegisterParams{LivenessIntervalS: 2, Now: at(time.Hour)})
		b.enqueue(t, store.TaskEnqueueParams{})
		b.enqueue(t, store.TaskEnqueueParams{})
		deadTask := b.claim(t, dead.InstanceID, at(time.Hour))
		liveTask := b.claim(t, live.InstanceID, at(time.Hour))
		ok := b.register(t, store.ProcessRegisterParams{LivenessIntervalS: 2, Now: at(3 * time.Second)})

		p := b.get(t, dead.InstanceID, at(0))
		require.Contains(t, p.StatusReason, "ahead of the server's clock")
		require.Equal(t, vigiltype.ProcessAlive, b.get(t, ok.InstanceID, at(0)).Status, "within the tolerance")

		res, err := b.s.StorePulse(b.ctx, store.StorePulseParams{Now: at(0), Gap: pulseGap, CheckFuture: true})
		require.NoError(t, err)
		require.Equal(t, int64(2), res.FutureProcesses)
		require.Equal(t, int64(2), res.FutureLeases)
		p = b.get(t, dead.InstanceID, at(0))
		require.Equal(t, vigiltype.ProcessAlive, p.Status)
		require.Equal(t, at(6*time.Second), *p.GraceUntil, "one alive window from now, not an hour")
		require.Contains(t, p.StatusReason, "judged by its heartbeats after")
		require.Equal(t, at(5*time.Minute), *b.getTask(t, deadTask.TaskID).LeaseExpiresAt, "one lease window from now")
		require.Empty(t, b.reclaim(t, at(0)), "no lease is cut: its holder may be alive")

		// The live holder heartbeats on the server's clock and carries on.
		_, err = b.s.ProcessHeartbeat(b.ctx, store.ProcessHeartbeatParams{
			InstanceID: live.InstanceID, TokenHash: tokenHash(live.InstanceID), Now: at(2 * time.Second),
		})
		require.NoError(t, err)
		b.heartbeat(t, store.TaskHeartbeatParams{TaskLease: leaseOf(liveTask), LeaseTimeout: defaultLease, SchemaVersion: 1, Now: at(2 * time.Second)})

		res, err = b.s.StorePulse(b.ctx, store.StorePulseParams{Now: at(time.Second), Gap: pulseGap, CheckFuture: true})
		require.NoError(t, err)
		require.Zero(t, res.FutureProcesses, "judged once")

		later := at(6*time.Second + time.Millisecond)
		require.Equal(t, vigiltype.ProcessStopped, b.get(t, dead.InstanceID, later).Status)
		require.Equal(t, vigiltype.ProcessAlive, b.get(t, live.InstanceID, later).Status)
		got := b.reclaim(t, later)
		require.Equal(t, []int64{deadTask.TaskID}, taskIDs(got), "only the dead holder's task")

		n, err := b.s.ProcessPrune(b.ctx, store.ProcessPruneParams{Before: at(-24 * time.Hour), Now: later})
		require.NoError(t, err)
		require.Equal(t, int64(1), n, "prune removes the stopped future-dated row, not the live one")
		_, err = b.s.ProcessGet(b.ctx, dead.InstanceID, later)
		require.ErrorIs(t, err, vigiltype.ErrNotFound)
	})

	// A grace written while the clock ran ahead (a jump forward, then
	// back) is cut to one window from now too (attacker finding: it kept
	// a dead instance alive for the length of the jump).
	t.Run("GraceDatedAheadIsCut", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)
		proc := b.register(t, store.ProcessRegisterParams{LivenessIntervalS: 2, Now: at(0)})
		b.pulse(t, at(0))
		b.pulse(t, at(time.Hour)) // the clock jumped forward: a gap, a grace to 1h+6s
		b.pulse(t, at(10*time.Second))
		p := b.get(t, proc.InstanceID, at(10*time.Second))
		require.Equal(t, at(16*time.Second), *p.GraceUntil)
		require.Equal(t, vigiltype.ProcessStopped, b.get(t, proc.InstanceID, at(16*time.Second+time.Millisecond)).Status)
	})

	// A server clock stepped back past the tolerance triggers the check
	// without being asked.
	t.Run("ClockStepBackChecksFuture", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)
		b.pulse(t, at(time.Hour))
		b.register(t, store.ProcessRegisterParams{LivenessIntervalS: 2, Now: at(time.Hour)})
		res := b.pulse(t, at(0))
		require.Equal(t, int64(1), res.FutureProcesses)
	})
}
