package supervisor

import (
	"cmp"
	"errors"
	"fmt"
	"time"
)

// Flapping defaults.
const (
	// FlapExitsDefault is how many exits within FlapWindowDefault make an
	// agent flapping: 5.
	FlapExitsDefault = 5
	// FlapWindowDefault is the window FlapExitsDefault exits are counted
	// in: 10 minutes.
	FlapWindowDefault = 10 * time.Minute
)

// FlapPolicy says when an agent is flapping: it ended Exits times within
// Window, however long each run lasted — so a crash loop whose runs outlast
// BackoffPolicy.FastFailure (a 31s crash loop, say), and which backoff
// therefore never slows down, is still visible. A zero field takes its
// default.
type FlapPolicy struct {
	// Exits is how many exits (launch failures included) within Window make
	// the agent flapping. At least 2. Default FlapExitsDefault (5).
	Exits int
	// Window is the sliding window exits are counted in. Default
	// FlapWindowDefault (10m).
	Window time.Duration
}

func (p FlapPolicy) withDefaults() FlapPolicy {
	return FlapPolicy{Exits: cmp.Or(p.Exits, FlapExitsDefault), Window: cmp.Or(p.Window, FlapWindowDefault)}
}

// validate reports bad values, naming the field under the path at. It
// expects defaults filled.
func (p FlapPolicy) validate(at string) error {
	var errs []error
	if p.Exits < 2 {
		errs = append(errs, fmt.Errorf("%s.Exits: must be at least 2, got %d", at, p.Exits))
	}
	if p.Window <= 0 {
		errs = append(errs, fmt.Errorf("%s.Window: must be positive, got %s", at, p.Window))
	}
	return errors.Join(errs...)
}

// FlapDetector decides when one agent starts flapping. Like BackoffTracker
// it is a plain value: no clock (the caller passes the time of each exit),
// no goroutines, not safe for concurrent use.
//
// An episode starts at the exit that makes Exits exits within Window, and
// lasts while every further exit still finds Exits exits within Window
// (counting itself); the first exit that does not ends it, so a later burst
// is a new episode. Exit reports true once per episode, at its start.
type FlapDetector struct {
	policy   FlapPolicy
	exits    []time.Time // within the window of the latest exit, oldest first
	flapping bool
}

// NewFlapDetector returns a detector for policy, zero fields defaulted.
func NewFlapDetector(policy FlapPolicy) *FlapDetector {
	return &FlapDetector{policy: policy.withDefaults()}
}

// Exit records an exit at now and reports whether it starts a flapping
// episode; count is the number of exits within the window ending at now.
// Times are expected not to go backwards (use the monotonic clock).
func (d *FlapDetector) Exit(now time.Time) (starts bool, count int) {
	cutoff := now.Add(-d.policy.Window)
	keep := d.exits[:0]
	for _, t := range d.exits {
		if t.After(cutoff) {
			keep = append(keep, t)
		}
	}
	d.exits = append(keep, now)
	count = len(d.exits)
	if count < d.policy.Exits {
		d.flapping = false
		return false, count
	}
	if d.flapping {
		return false, count
	}
	d.flapping = true
	return true, count
}

// Flapping reports whether the latest exit was part of a flapping episode.
func (d *FlapDetector) Flapping() bool { return d.flapping }
