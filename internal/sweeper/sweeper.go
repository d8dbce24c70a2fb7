// Package sweeper runs the server's background loops. A Sweeper is a thin
// goroutine around one pass (RunOnce); each pass's outcome is recorded in the
// store in the list_agents / agent_status shape (kind "sweeper",
// last_result_count, last_run_duration_ms, last_error) so every surface can
// report it.
package sweeper

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/vigil-fleet/vigil/internal/clock"
	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// PassFunc is one pass of a sweeper; it returns how many rows it acted on.
type PassFunc func(ctx context.Context) (int, error)

// Config describes one sweeper.
type Config struct {
	Name     string        // e.g. "lease_reclaimer"; the key of its status row
	Interval time.Duration // time between passes; > 0
	Pass     PassFunc
	Store    store.Store  // where the status is recorded
	Clock    clock.Clock  // stamps last_run_at; clock.Real when nil
	Logger   *slog.Logger // slog.Default() when nil
}

// Sweeper runs Pass every Interval between Start and Stop.
type Sweeper struct {
	cfg Config

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// New validates cfg and returns a stopped Sweeper.
func New(cfg Config) (*Sweeper, error) {
	if cfg.Name == "" || cfg.Pass == nil || cfg.Store == nil {
		return nil, fmt.Errorf("sweeper: Name, Pass and Store are required")
	}
	if cfg.Interval <= 0 {
		return nil, fmt.Errorf("sweeper %s: interval must be positive, got %s", cfg.Name, cfg.Interval)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Sweeper{cfg: cfg}, nil
}

// Start records the sweeper (not run yet) so that it is listed at once,
// then launches the loop: one pass at once, then one every Interval, until
// ctx ends or Stop is called. Starting a started sweeper does nothing.
func (s *Sweeper) Start(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel != nil {
		return
	}
	if err := s.cfg.Store.SweeperRecord(ctx, &vigiltype.Sweeper{
		Name: s.cfg.Name, Kind: vigiltype.SweeperKind, IntervalS: s.cfg.Interval.Seconds(),
	}); err != nil {
		s.cfg.Logger.Error("record sweeper status", "sweeper", s.cfg.Name, "err", err)
	}
	ctx, s.cancel = context.WithCancel(ctx)
	s.done = make(chan struct{})
	go s.loop(ctx, s.done)
}

// Stop ends the loop and waits for a pass in progress to return. It is
// idempotent and safe to call on a sweeper never started.
func (s *Sweeper) Stop() {
	s.mu.Lock()
	cancel, done := s.cancel, s.done
	s.cancel, s.done = nil, nil
	s.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

func (s *Sweeper) loop(ctx context.Context, done chan struct{}) {
	defer close(done)
	ticker := time.NewTicker(s.cfg.Interval)
	defer ticker.Stop()
	for {
		s.RunOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// RunOnce runs one pass and records its status. It returns the pass's
// result so tests can drive a sweeper without its goroutine.
func (s *Sweeper) RunOnce(ctx context.Context) (int, error) {
	started := time.Now()
	runAt := s.cfg.Clock.Now()
	n, err := s.cfg.Pass(ctx)
	status := &vigiltype.Sweeper{
		Name:              s.cfg.Name,
		Kind:              vigiltype.SweeperKind,
		IntervalS:         s.cfg.Interval.Seconds(),
		LastRunAt:         &runAt,
		LastResultCount:   n,
		LastRunDurationMS: float64(time.Since(started).Microseconds()) / 1000,
	}
	if err != nil {
		if ctx.Err() != nil {
			return n, err // shutting down: not a sweeper failure
		}
		msg := err.Error()
		status.LastError = &msg
		s.cfg.Logger.Error("sweeper pass failed", "sweeper", s.cfg.Name, "err", err)
	} else if n > 0 {
		s.cfg.Logger.Info("sweeper pass", "sweeper", s.cfg.Name, "count", n)
	}
	if rerr := s.cfg.Store.SweeperRecord(context.WithoutCancel(ctx), status); rerr != nil {
		s.cfg.Logger.Error("record sweeper status", "sweeper", s.cfg.Name, "err", rerr)
	}
	return n, err
}
