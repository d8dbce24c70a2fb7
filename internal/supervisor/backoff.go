package supervisor

import (
	"cmp"
	"errors"
	"fmt"
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
)

// BackoffPolicy says how long the supervisor waits before restarting an agent
// (DESIGN S2). A zero field takes its default.
type BackoffPolicy struct {
	// Min is the first delay after a fast failure and the delay after a
	// healthy run. Default BackoffMinDefault (5s, DESIGN S2).
	Min time.Duration
	// FastFailure is the threshold: a run shorter than this doubles the
	// delay, a run at least this long resets it to Min. Default
	// FastFailureDefault (30s, DESIGN S2).
	FastFailure time.Duration
	// Max caps the delay. Default BackoffMaxDefault (300s, DESIGN S2).
	Max time.Duration
}

// withDefaults fills zero fields with the DESIGN S2 defaults.
func (p BackoffPolicy) withDefaults() BackoffPolicy {
	return BackoffPolicy{
		Min:         cmp.Or(p.Min, BackoffMinDefault),
		FastFailure: cmp.Or(p.FastFailure, FastFailureDefault),
		Max:         cmp.Or(p.Max, BackoffMaxDefault),
	}
}

// validate reports negative durations and Min > Max, naming the field under
// the path at (e.g. "Backoff"). It expects defaults filled.
func (p BackoffPolicy) validate(at string) error {
	var errs []error
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"Min", p.Min}, {"FastFailure", p.FastFailure}, {"Max", p.Max}} {
		if f.d < 0 {
			errs = append(errs, fmt.Errorf("%s.%s: must not be negative, got %s", at, f.name, f.d))
		}
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
	// streak is the delay chosen for the latest of an unbroken run of fast
	// failures; 0 when there is none (at the start, or after a healthy run).
	streak time.Duration
}

// NewBackoffTracker returns a tracker for policy, with zero fields defaulted.
// A Max below Min is treated as Min.
func NewBackoffTracker(policy BackoffPolicy) *BackoffTracker {
	p := policy.withDefaults()
	p.Max = max(p.Max, p.Min)
	return &BackoffTracker{policy: p}
}

// Next records that a run lasted runDuration (0 for a launch failure) and
// returns how long to wait before the next start:
//   - a run of at least FastFailure is healthy: wait Min, and forget earlier
//     fast failures;
//   - a shorter run is a fast failure: the first of a streak waits Min, each
//     following one doubles the previous delay, capped at Max.
//
// So a process failing from the start waits Min, 2×Min, 4×Min, … Max, Max.
func (b *BackoffTracker) Next(runDuration time.Duration) time.Duration {
	p := b.policy
	switch {
	case runDuration >= p.FastFailure:
		b.streak = 0
		return p.Min
	case b.streak == 0:
		b.streak = p.Min
	case b.streak > p.Max/2: // doubling would pass the cap (or overflow)
		b.streak = p.Max
	default:
		b.streak = 2 * b.streak
	}
	return b.streak
}

// Reset forgets past fast failures, as a healthy run does.
func (b *BackoffTracker) Reset() { b.streak = 0 }
