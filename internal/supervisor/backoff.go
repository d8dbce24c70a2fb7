package supervisor

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Restart backoff defaults (DESIGN S2, §9).
const (
	// BackoffMinDefault is the delay before the first restart after a fast
	// failure, and the delay after any healthy run: 5s (DESIGN S2).
	BackoffMinDefault = 5 * time.Second
	// FastFailureDefault is the run time under which an exit counts as a fast
	// failure and doubles the next delay: 30s (DESIGN S2).
	FastFailureDefault = 30 * time.Second
	// BackoffMaxDefault caps the restart delay: 300s (DESIGN S2).
	BackoffMaxDefault = 300 * time.Second
	// BackoffResetDefault: a run at least this long resets the delay to
	// Min (DESIGN S2: "back to 5s after a run ≥ 30s").
	BackoffResetDefault = 30 * time.Second
	// JitterDefault spreads each restart delay over a band 20% of its width,
	// so that a fleet failing together does not restart in lockstep.
	JitterDefault = 0.2
	// JitterOff, as BackoffPolicy.Jitter, turns jitter off: every delay is
	// exactly the DESIGN S2 sequence.
	JitterOff = -1.0
)

// BackoffPolicy says how long the supervisor waits before restarting an agent
// (DESIGN S2). A zero field takes its default.
type BackoffPolicy struct {
	// Min is the first delay after a fast failure and the delay after a
	// healthy run. Default BackoffMinDefault (5s, DESIGN S2).
	Min time.Duration
	// FastFailure is the threshold: a run shorter than this doubles the
	// delay. Default FastFailureDefault (30s, DESIGN S2).
	FastFailure time.Duration
	// Reset is the run length that resets the delay to Min; a run between
	// FastFailure and Reset keeps the current delay. At least FastFailure.
	// Default: FastFailure (30s by default, DESIGN S2: BackoffResetDefault).
	Reset time.Duration
	// Max caps the delay. Default BackoffMaxDefault (300s, DESIGN S2).
	Max time.Duration
	// Jitter is the width of the band each delay d is drawn from, as a
	// fraction of d: [d, d+Jitter·d], shifted down to end at Max when it
	// would pass it (so delays at the cap spread too), and never below Min.
	// In [0, 1]; 0 takes JitterDefault (0.2); JitterOff (-1) disables it.
	// Only a tracker with a random source applies it.
	Jitter float64
}

// withDefaults fills zero fields with the DESIGN S2 defaults.
func (p BackoffPolicy) withDefaults() BackoffPolicy {
	return BackoffPolicy{
		Min:         cmp.Or(p.Min, BackoffMinDefault),
		FastFailure: cmp.Or(p.FastFailure, FastFailureDefault),
		Reset:       cmp.Or(p.Reset, p.FastFailure, FastFailureDefault),
		Max:         cmp.Or(p.Max, BackoffMaxDefault),
		Jitter:      cmp.Or(p.Jitter, JitterDefault),
	}
}

// validate reports negative durations and Min > Max, naming the field under
// the path at (e.g. "Backoff"). It expects defaults filled.
func (p BackoffPolicy) validate(at string) error {
	var errs []error
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"Min", p.Min}, {"FastFailure", p.FastFailure}, {"Reset", p.Reset}, {"Max", p.Max}} {
		if f.d < 0 {
			errs = append(errs, fmt.Errorf("%s.%s: must not be negative, got %s", at, f.name, f.d))
		}
	}
	if p.Jitter != JitterOff && (p.Jitter < 0 || p.Jitter > 1) {
		errs = append(errs, fmt.Errorf("%s.Jitter: must be between 0 and 1 (or JitterOff), got %g", at, p.Jitter))
	}
	if p.Reset < p.FastFailure {
		errs = append(errs, fmt.Errorf("%s.Reset: %s must not be below %s.FastFailure (%s)", at, p.Reset, at, p.FastFailure))
	}
	if p.Min > p.Max {
		errs = append(errs, fmt.Errorf("%s.Min: %s must not exceed %s.Max (%s)", at, p.Min, at, p.Max))
	}
	return errors.Join(errs...)
}

// BackoffTracker decides restart delays for one agent (DESIGN S2). It is a
// plain value: not safe for concurrent use, no clock, no goroutines. Create it
// with NewBackoffTracker.
type BackoffTracker struct {
	policy BackoffPolicy
	rnd    *rand.Rand // nil: no jitter
	// streak is the delay chosen for the latest of an unbroken run of fast
	// failures; 0 when there is none (at the start, or after a healthy run).
	streak time.Duration
}

// NewBackoffTracker returns a tracker for policy, with zero fields defaulted.
// A Max below Min is treated as Min. rnd is the source of jitter
// (BackoffPolicy.Jitter); nil means none: Next then returns exactly the
// DESIGN S2 sequence. The tracker draws from rnd on every Next, so a seeded
// source makes it deterministic.
func NewBackoffTracker(policy BackoffPolicy, rnd *rand.Rand) *BackoffTracker {
	p := policy.withDefaults()
	p.Max = max(p.Max, p.Min)
	return &BackoffTracker{policy: p, rnd: rnd}
}

// Next records that a run lasted runDuration (0 for a launch failure) and
// returns how long to wait before the next start:
//   - a run of at least Reset is healthy: wait Min, and forget earlier
//     fast failures;
//   - a run between FastFailure and Reset keeps the current delay;
//   - a shorter run is a fast failure: the first of a streak waits Min, each
//     following one doubles the previous delay, capped at Max.
//
// So a process failing from the start waits Min, 2×Min, 4×Min, … Max, Max;
// with a random source, each delay is then drawn from its jitter band
// (JitterBand). Jitter never feeds back: the doubling is on the un-jittered
// delay.
func (b *BackoffTracker) Next(runDuration time.Duration) time.Duration {
	p := b.policy
	switch {
	case runDuration >= p.Reset:
		b.streak = 0
		return b.jitter(p.Min)
	case runDuration >= p.FastFailure:
		return b.jitter(cmp.Or(b.streak, p.Min))
	case b.streak == 0:
		b.streak = p.Min
	case b.streak > p.Max/2: // doubling would pass the cap (or overflow)
		b.streak = p.Max
	default:
		b.streak = 2 * b.streak
	}
	return b.jitter(b.streak)
}

// jitter draws a delay from d's jitter band, or returns d without a source.
func (b *BackoffTracker) jitter(d time.Duration) time.Duration {
	lo, hi := b.policy.JitterBand(d)
	if b.rnd == nil || hi <= lo {
		return d
	}
	return lo + time.Duration(b.rnd.Int64N(int64(hi-lo)+1))
}

// JitterBand is the range [lo, hi] a jittered delay for the un-jittered
// delay d is drawn from: [d, d+Jitter·d], shifted down so that hi is at most
// Max, and lo raised to at least Min. With JitterOff it is [d, d]. It
// expects defaults filled (as a tracker's policy is).
func (p BackoffPolicy) JitterBand(d time.Duration) (lo, hi time.Duration) {
	if p.Jitter <= 0 {
		return d, d
	}
	width := time.Duration(float64(d) * p.Jitter)
	hi = d + width
	if hi > p.Max || hi < d { // past the cap, or overflowed
		hi = max(p.Max, d)
	}
	lo = max(hi-width, p.Min)
	return min(lo, hi), hi
}

// Reset forgets past fast failures, as a healthy run does.
func (b *BackoffTracker) Reset() { b.streak = 0 }
