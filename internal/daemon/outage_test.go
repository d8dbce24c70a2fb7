package daemon_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/clock"
	"github.com/vigil-fleet/vigil/internal/lease"
	"github.com/vigil-fleet/vigil/internal/liveness"
	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// waitUntil polls cond every 10ms for up to 15s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// holderThenStop runs a server on a fresh SQLite file with clk and the
// store pulse on, registers an instance (2s liveness interval) that claims
// a task enqueued with p, and stops the server. It returns the options to
// start the next server on the same file.
func holderThenStop(t *testing.T, clk *clock.Fake, p lease.EnqueueParams) ([]testserver.Option, *liveness.Registered, *vigiltype.Task) {
	t.Helper()
	ctx := context.Background()
	opts := []testserver.Option{
		testserver.WithDB(filepath.Join(t.TempDir(), "vigil.db")), testserver.WithClock(clk),
		testserver.WithPulseGap(3 * time.Second), testserver.WithSweepInterval(10 * time.Millisecond),
	}
	first := testserver.Start(t, opts...)
	reg, err := first.Liveness.Register(ctx, liveness.RegisterParams{ProcessKind: "worker", Hostname: "h", PID: 1, LivenessIntervalS: 2})
	require.NoError(t, err)
	task, err := first.Lease.Enqueue(ctx, p)
	require.NoError(t, err)
	claimed, err := first.Lease.Claim(ctx, reg.InstanceID, reg.InstanceToken, []string{p.TaskType})
	require.NoError(t, err)
	require.Equal(t, task.TaskID, claimed.TaskID)
	require.NoError(t, first.Stop())
	return opts, reg, task
}

// A server that was down (here: stopped, then started again on the same
// SQLite file ten minutes later) is an outage to the instances it serves:
// none could heartbeat, so none is judged stopped, and no lease is
// reclaimed, until each has had a full alive window after the restart
// (DESIGN L8, issue #12 case 1 on SQLite). On the old code the restarted
// server showed the instance stopped and reclaimed its task at once.
func TestServerDowntimeIsAnOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := clock.NewFake(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	opts, reg, task := holderThenStop(t, clk, lease.EnqueueParams{TaskType: "sleep"})

	clk.Advance(10 * time.Minute)
	second := testserver.Start(t, opts...)
	waitUntil(t, "the restarted server's first pulse", func() bool {
		p, err := second.Liveness.Get(ctx, reg.InstanceID)
		require.NoError(t, err)
		return p.GraceUntil != nil
	})
	p, err := second.Liveness.Get(ctx, reg.InstanceID)
	require.NoError(t, err)
	require.Equal(t, vigiltype.ProcessAlive, p.Status)
	require.Contains(t, p.StatusReason, "store outage grace")
	require.Equal(t, clk.Now().Add(6*time.Second), *p.GraceUntil, "a full alive window from the restart")
	// Several reclaim passes run in the grace: the task stays with its holder.
	passes := 0
	waitUntil(t, "reclaim passes", func() bool {
		n, err := second.Lease.Reclaim(ctx)
		require.NoError(t, err)
		require.Zero(t, n)
		passes++
		return passes >= 5
	})
	got, err := second.Lease.Get(ctx, task.TaskID)
	require.NoError(t, err)
	require.Equal(t, vigiltype.TaskRunning, got.Status)
	require.Zero(t, got.Reclaims)

	// A heartbeat in the grace ends it as an ordinary one.
	_, err = second.Liveness.Heartbeat(ctx, reg.InstanceID, reg.InstanceToken)
	require.NoError(t, err)
	p, err = second.Liveness.Get(ctx, reg.InstanceID)
	require.NoError(t, err)
	require.Nil(t, p.GraceUntil)
	require.Empty(t, p.StatusReason)

	// Silent past its window with the store up (a pass, and so a pulse,
	// every second): stopped and reclaimed.
	for range 7 {
		clk.Advance(time.Second)
		_, err := second.Lease.Reclaim(ctx)
		require.NoError(t, err)
	}
	p, err = second.Liveness.Get(ctx, reg.InstanceID)
	require.NoError(t, err)
	require.Equal(t, vigiltype.ProcessStopped, p.Status)
	require.Nil(t, p.GraceUntil)
	got, err = second.Lease.Get(ctx, task.TaskID)
	require.NoError(t, err)
	require.Equal(t, vigiltype.TaskScheduled, got.Status)
	require.Equal(t, 1, got.Reclaims)
}

// A liveness row dated in the future (a server clock stepped back an hour,
// or a restore from a host whose clock ran ahead) does not keep a silent
// instance alive for the hour: it gets one alive window from when the
// restarted server saw it, with a reason, then shows stopped, its lease is
// reclaimed and prune removes it (DESIGN L9, issue #12 case 2). On the old
// code it stayed alive ("heartbeat 0ms ago") for the hour and prune kept it.
func TestFutureDatedInstanceIsNotHeardFrom(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := clock.NewFake(time.Date(2026, 12, 1, 13, 0, 0, 0, time.UTC))
	opts, reg, task := holderThenStop(t, clk, lease.EnqueueParams{TaskType: "sleep", LeaseTimeoutS: 10})

	clk.Set(clk.Now().Add(-time.Hour)) // the clock stepped back
	second := testserver.Start(t, opts...)
	p, err := second.Liveness.Get(ctx, reg.InstanceID)
	require.NoError(t, err)
	require.Contains(t, p.StatusReason, "ahead of the server's clock")
	require.NotNil(t, p.GraceUntil)
	require.Equal(t, clk.Now().Add(6*time.Second), *p.GraceUntil, "one alive window from now, not the hour")

	// A pass (and so a pulse) every second: judged once its window ends.
	for range 11 {
		clk.Advance(time.Second)
		_, err := second.Lease.Reclaim(ctx)
		require.NoError(t, err)
	}
	p, err = second.Liveness.Get(ctx, reg.InstanceID)
	require.NoError(t, err)
	require.Equal(t, vigiltype.ProcessStopped, p.Status)
	got, err := second.Lease.Get(ctx, task.TaskID)
	require.NoError(t, err)
	require.Equal(t, vigiltype.TaskScheduled, got.Status, "its lease taken back")
	n, err := second.Liveness.Prune(ctx, 24*time.Hour)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}
