package liveness

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/vigil-fleet/vigil/internal/clock"
	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// Defaults for the store pulse (DESIGN L8).
const (
	// PulseIntervalDefault is how often a server writes the store's pulse.
	PulseIntervalDefault = time.Second
	// PulseGapDefault is how long the store may go without a pulse before
	// the interval counts as an outage: three missed pulses. Every instance
	// and lease alive at the last pulse then gets a full window of writable
	// store. An outage shorter than this is not compensated, so an alive
	// window (3 × the liveness interval) should be longer.
	PulseGapDefault = 3 * time.Second
	// FutureCheckInterval is how often a pulse also looks for rows dated
	// in the future (DESIGN L9); the first pulse of a server always does,
	// and so does any pulse that finds the clock stepped back or a gap.
	FutureCheckInterval = time.Minute
)

// Pulser writes the store's pulse (store.StorePulse) once a pass: the
// daemon runs it as the "store_pulse" sweeper every PulseIntervalDefault.
// When its store is a store.OutageWitness that saw the store unavailable
// since the last pulse (a call this server answered 503), the next pulse
// counts the interval as an outage whatever its length: an agent that was
// told 503 may rely on the grace (the SDKs do).
// It logs each outage it finds and each batch of rows dated in the future
// it judged not heard from, once.
type Pulser struct {
	store store.Store
	clock clock.Clock
	log   *slog.Logger
	gap   time.Duration

	mu          sync.Mutex
	lastFuture  time.Time // local monotonic reading of the last future check
	checkedOnce bool
	witnessed   uint64 // store.OutageWitness count at the last pulse written
}

// NewPulser returns a Pulser that counts a gap longer than gap (> 0) as an
// outage.
func NewPulser(st store.Store, clk clock.Clock, gap time.Duration, log *slog.Logger) *Pulser {
	return &Pulser{store: st, clock: clk, log: log, gap: gap}
}

// Gap is the gap that counts as an outage.
func (p *Pulser) Gap() time.Duration { return p.gap }

// Pass writes one pulse and returns how many instances it gave an outage
// grace or judged not heard from.
func (p *Pulser) Pass(ctx context.Context) (int, error) {
	p.mu.Lock()
	hadPulsed := p.checkedOnce
	checkFuture := !p.checkedOnce || time.Since(p.lastFuture) >= FutureCheckInterval
	witnessed := p.witnessed
	p.mu.Unlock()
	// This server answered some call 503 since its last pulse: a heartbeat
	// it refused so may have been lost, however short the gap.
	var seen uint64
	w, hasWitness := p.store.(store.OutageWitness)
	if hasWitness {
		seen = w.UnavailableSeen()
	}
	res, err := p.store.StorePulse(ctx, store.StorePulseParams{
		Now: p.clock.Now(), Gap: p.gap, FutureTolerance: vigiltype.FutureTolerance, CheckFuture: checkFuture,
		Force: hasWitness && seen != witnessed,
	})
	if err != nil {
		return 0, err
	}
	p.mu.Lock()
	p.witnessed = seen
	p.mu.Unlock()
	if checkFuture {
		p.mu.Lock()
		p.checkedOnce, p.lastFuture = true, time.Now()
		p.mu.Unlock()
	}
	Report(p.log, res, !hadPulsed)
	return int(res.GraceProcesses + res.FutureProcesses), nil
}

// Report logs what a pulse (StorePulse, or a reclaim pass's own) found.
// The gap found by a server's first pulse is usually the time no server
// ran (a restart): it is logged at INFO, worded so; any later gap is an
// outage of the store, at WARN.
func Report(log *slog.Logger, res *store.StorePulseResult, first bool) {
	if res == nil {
		return
	}
	if !res.OutageTo.IsZero() {
		args := []any{"from", res.OutageFrom, "to", res.OutageTo, "gap", res.OutageTo.Sub(res.OutageFrom).Round(time.Millisecond),
			"instances", res.GraceProcesses, "leases", res.GraceLeases}
		if first {
			log.Info("no server wrote the store for a while before this one started (a restart, or a store outage): "+
				"every instance and lease alive before it gets a full window before it is judged (DESIGN L8)", args...)
		} else {
			log.Warn("store outage: nothing could be written for a while; "+
				"every instance and lease alive before it gets a full window before it is judged (DESIGN L8)", args...)
		}
	}
	if res.FutureProcesses > 0 || res.FutureLeases > 0 {
		log.Warn("rows dated in the future: their heartbeats are ahead of the server's clock by more than the tolerance, so they count as not heard from (DESIGN L9)",
			"instances", res.FutureProcesses, "leases", res.FutureLeases, "tolerance", vigiltype.FutureTolerance)
	}
}
