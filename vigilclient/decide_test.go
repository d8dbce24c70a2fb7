package vigilclient

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigiltype"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func tp(t time.Time) *time.Time { return &t }

func TestLeaseWindow(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name   string
		task   *vigiltype.Task
		want   time.Duration
		wantOK bool
	}{
		{"nil task", nil, 0, false},
		{"from server times", &vigiltype.Task{LastHeartbeatAt: tp(t0), LeaseExpiresAt: tp(t0.Add(5 * time.Minute))}, 5 * time.Minute, true},
		{"server times win over lease_timeout_s", &vigiltype.Task{LastHeartbeatAt: tp(t0), LeaseExpiresAt: tp(t0.Add(90 * time.Second)), LeaseTimeoutS: 10}, 90 * time.Second, true},
		{"falls back to lease_timeout_s", &vigiltype.Task{LeaseTimeoutS: 1.5}, 1500 * time.Millisecond, true},
		{"expiry not after heartbeat falls back", &vigiltype.Task{LastHeartbeatAt: tp(t0), LeaseExpiresAt: tp(t0), LeaseTimeoutS: 2}, 2 * time.Second, true},
		{"unknown", &vigiltype.Task{LastHeartbeatAt: tp(t0)}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, ok := leaseWindow(tc.task)
			require.Equal(t, tc.wantOK, ok)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestLeaseDeadline(t *testing.T) {
	t.Parallel()

	// The server's own clock is an hour off: only its window counts.
	serverNow := t0.Add(time.Hour)
	task := &vigiltype.Task{LastHeartbeatAt: tp(serverNow), LeaseExpiresAt: tp(serverNow.Add(30 * time.Second))}
	window, ok := leaseWindow(task)
	require.True(t, ok)

	sent := t0
	deadline := leaseDeadline(sent, window)
	require.Equal(t, t0.Add(30*time.Second), deadline)

	require.False(t, leaseExpired(t0, deadline))
	require.False(t, leaseExpired(deadline.Add(-time.Millisecond), deadline))
	require.True(t, leaseExpired(deadline, deadline), "expired at the deadline itself")
	require.True(t, leaseExpired(deadline.Add(time.Second), deadline))
}

func TestLeaseDeadlineKeepsMonotonicClock(t *testing.T) {
	t.Parallel()

	now := time.Now() // carries a monotonic reading
	deadline := leaseDeadline(now, time.Minute)
	// A wall-clock jump (modelled by stripping the monotonic reading and
	// moving the wall time) does not move a monotonic comparison.
	require.Equal(t, time.Minute, deadline.Sub(now))
	require.False(t, leaseExpired(now, deadline))
}

func TestFenceNeeded(t *testing.T) {
	t.Parallel()

	window := aliveWindow(30 * time.Second)
	require.Equal(t, 90*time.Second, window, "3 × liveness interval (DESIGN L3)")

	last := t0
	require.False(t, fenceNeeded(t0, last, window))
	require.False(t, fenceNeeded(t0.Add(89*time.Second), last, window))
	require.False(t, fenceNeeded(t0.Add(window-time.Millisecond), last, window))
	require.True(t, fenceNeeded(t0.Add(window), last, window), "fenced no later than the server shows stopped")
	require.True(t, fenceNeeded(t0.Add(10*time.Minute), last, window))

	require.Equal(t, 300*time.Millisecond, aliveWindow(100*time.Millisecond))
}

func TestCallTimeout(t *testing.T) {
	t.Parallel()

	require.Equal(t, 8*time.Second, callTimeout(10*time.Second))
	require.Equal(t, callTimeoutMax, callTimeout(30*time.Second))
	// A short interval does not make a short call: a loaded machine's
	// round trip must fit (issue #12, 40ms for a 50ms interval).
	for _, iv := range []time.Duration{time.Millisecond, 50 * time.Millisecond, time.Second, 2 * time.Second} {
		require.Equal(t, callTimeoutFloor, callTimeout(iv))
	}
	require.GreaterOrEqual(t, callTimeoutFloor, 2*time.Second)
	for _, iv := range []time.Duration{time.Millisecond, time.Second, LivenessIntervalDefault, HeartbeatIntervalDefault, time.Hour} {
		require.LessOrEqual(t, callTimeout(iv), callTimeoutMax)
	}
}

func TestOutcomeBackoff(t *testing.T) {
	t.Parallel()

	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second}
	for n := 1; n <= len(want); n++ {
		require.Equal(t, want[n-1], outcomeBackoff(n))
	}
	require.Equal(t, outcomeBackoffMax, outcomeBackoff(1000), "no overflow")
}

// A finished result is kept while the lease may be valid (issue #12 case
// 1: never dropped after ~4s), and not past it, nor past the drain budget
// of a stopping agent.
func TestOutcomeGiveUp(t *testing.T) {
	t.Parallel()

	received := time.Unix(1000, 0)
	keepUntil := leaseSurelyOver(received, time.Minute)
	require.Equal(t, received.Add(time.Minute), keepUntil)
	require.False(t, outcomeGiveUp(received.Add(10*time.Second), keepUntil, time.Time{}), "past the old ~4s budget, lease valid")
	require.False(t, outcomeGiveUp(keepUntil.Add(-time.Millisecond), keepUntil, time.Time{}))
	require.True(t, outcomeGiveUp(keepUntil, keepUntil, time.Time{}))
	stopBy := received.Add(20 * time.Second)
	require.False(t, outcomeGiveUp(stopBy.Add(-time.Millisecond), keepUntil, stopBy))
	require.True(t, outcomeGiveUp(stopBy, keepUntil, stopBy), "stopping: the drain budget ends the retries")
}

func TestRegisterBackoff(t *testing.T) {
	t.Parallel()

	require.Equal(t, time.Second, registerBackoff(1, 30*time.Second))
	require.Equal(t, 2*time.Second, registerBackoff(2, 30*time.Second))
	require.Equal(t, 16*time.Second, registerBackoff(5, 30*time.Second))
	require.Equal(t, 30*time.Second, registerBackoff(6, 30*time.Second), "capped at the liveness interval")
	require.Equal(t, time.Minute, registerBackoff(40, time.Hour), "never more than a minute")
	require.Equal(t, 200*time.Millisecond, registerBackoff(1, 200*time.Millisecond))
}
