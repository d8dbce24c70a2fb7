package vigilclient

import (
	"time"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// The agent runtime's decisions, as plain functions of explicit times so
// they are tested without goroutines or a clock (STYLE §5). All times are
// local: deadlines are built by adding durations to time.Now() values taken
// when a request was sent, so they keep Go's monotonic reading and a wall
// clock jump cannot move them. Server timestamps are only ever subtracted
// from each other (a window), never compared with the local clock.

// leaseWindow is the lease window the server granted in its answer to a
// claim or a lease heartbeat: lease_expires_at - last_heartbeat_at, both
// stamped by the server's clock in one write. When the answer lacks them it
// falls back to the task's own lease_timeout_s; ok is false when neither is
// known (the server's --lease-timeout applies and was not reported).
func leaseWindow(t *vigiltype.Task) (window time.Duration, ok bool) {
	if t == nil {
		return 0, false
	}
	if t.LeaseExpiresAt != nil && t.LastHeartbeatAt != nil {
		if w := t.LeaseExpiresAt.Sub(*t.LastHeartbeatAt); w > 0 {
			return w, true
		}
	}
	if t.LeaseTimeoutS > 0 {
		return time.Duration(t.LeaseTimeoutS * float64(time.Second)), true
	}
	return 0, false
}

// leaseDeadline is the local instant after which the lease must be taken as
// lost unless renewed again: the local time the last successful renewal
// (or the claim) was sent, plus the window the server granted. Using the
// send time, not the receive time, errs early: the server stamped the
// renewal after it was sent, so its own expiry is never before this.
func leaseDeadline(renewalSent time.Time, window time.Duration) time.Time {
	return renewalSent.Add(window)
}

// leaseExpired reports whether the lease deadline has passed at now.
func leaseExpired(now, deadline time.Time) bool { return !now.Before(deadline) }

// aliveWindow is how long the server keeps an instance alive after a
// liveness heartbeat: AliveWindowFactor × interval, rounded as the server
// rounds it (DESIGN L3).
func aliveWindow(livenessInterval time.Duration) time.Duration {
	return vigiltype.AliveWindow(livenessInterval.Seconds())
}

// fenceNeeded reports whether an instance whose last accepted liveness
// heartbeat was sent at lastAccepted must stop working at now: the alive
// window has passed, so the server may show it stopped and reclaim its
// task, and it must not keep running unseen. Like leaseDeadline it counts
// from the send time, so it fences no later than the server stops it.
func fenceNeeded(now, lastAccepted time.Time, window time.Duration) bool {
	return !now.Before(lastAccepted.Add(window))
}

// callTimeout bounds one periodic call (a liveness or lease heartbeat) made
// every interval: 4/5 of the interval, but never less than
// callTimeoutFloor nor more than callTimeoutMax. Each periodic call runs in
// a goroutine of its own, so a call that outlives the next tick delays
// nothing; what decides that a lease or the instance is lost is the
// deadline counted from the last accepted call (leaseDeadline,
// fenceNeeded), never one call's timeout. The floor keeps a short interval
// (50ms in tests, a few hundred ms in a tight deployment) from abandoning
// every call on a loaded machine, where one HTTP round trip can take longer
// than the interval itself (issue #12: every renewal of a 500ms lease timed
// out at 40ms under -race).
func callTimeout(interval time.Duration) time.Duration {
	return min(max(interval*4/5, callTimeoutFloor), callTimeoutMax)
}

// callTimeoutFloor is the least time a periodic call is given: a loaded
// machine's round trip fits in it.
const callTimeoutFloor = 5 * time.Second

// callTimeoutMax bounds every single request the agent runtime makes.
const callTimeoutMax = 10 * time.Second

// A finished result is kept until the server accepts or refuses it (DESIGN
// T8): a complete or fail that cannot reach the server, or is answered 5xx
// (503 unavailable included), is sent again — it is idempotent for the
// holder, so a retry whose first try landed gets 200 — for as long as the
// lease may still be valid. 2xx, 409 (stale_epoch, outcome_conflict) and any
// other 4xx are final.

// outcomeBackoff is the wait before retry n (1-based) of an outcome call:
// 250ms doubling, at most outcomeBackoffMax.
func outcomeBackoff(n int) time.Duration {
	if n > 8 {
		return outcomeBackoffMax
	}
	return min(250*time.Millisecond<<(n-1), outcomeBackoffMax)
}

// outcomeBackoffMax caps the wait between two tries of an outcome call.
const outcomeBackoffMax = 4 * time.Second

// leaseSurelyOver is the local instant after which the lease surely has
// expired on the server: the window the server granted, counted from when
// the answer to the last accepted renewal (or the claim) was received. The
// server stamped that renewal before it answered, so its expiry is no
// later than this. (leaseDeadline, counted from the send time, is the
// early bound the handler is cancelled at; this is the late bound a
// finished result is kept until.) Until then the server may still accept
// the result: its reclaimer may not have run even after it.
func leaseSurelyOver(renewalReceived time.Time, window time.Duration) time.Time {
	return renewalReceived.Add(window)
}

// leaseWindowUnknown stands in for a lease window the server did not
// report: the server's default --lease-timeout (DESIGN T3).
const leaseWindowUnknown = 5 * time.Minute

// outcomeGiveUp reports whether an outcome call that failed transiently at
// now should not be sent again: the lease is surely over (keepUntil), or
// the agent is stopping and its drain budget (stopBy) has passed.
func outcomeGiveUp(now, keepUntil, stopBy time.Time) bool {
	return !now.Before(keepUntil) || (!stopBy.IsZero() && !now.Before(stopBy))
}

// releaseRetryBudget bounds the retries of a release: a release gives a
// task back early and is not needed for correctness (the lease lapses).
const releaseRetryBudget = 4 * time.Second

// registerBackoff is the wait before registration attempt n+1 after n
// transient failures: 1s doubling, capped at the liveness interval (and at
// most a minute), so an agent started before its server waits for it.
func registerBackoff(n int, livenessInterval time.Duration) time.Duration {
	limit := min(livenessInterval, time.Minute)
	if n > 16 {
		return limit
	}
	return min(time.Second<<(n-1), limit)
}
