package clock

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// SyncIntervalDefault is how often a Synced clock re-reads its reference.
const SyncIntervalDefault = 30 * time.Second

// Synced is a Clock that follows a reference clock — the shared database's,
// when several servers share one PostgreSQL — without asking it on every
// read. It samples the reference now and then and keeps the offset
//
//	offset = reference - midpoint(local before, local after)
//
// so Now() = local.Now() + offset agrees across servers to within half a
// round trip, whatever their own clocks say (DESIGN L3: one clock decides).
type Synced struct {
	local     Clock
	reference func(context.Context) (time.Time, error)
	interval  time.Duration
	logger    *slog.Logger

	mu     sync.Mutex
	offset time.Duration

	stopOnce sync.Once
	cancel   context.CancelFunc
	done     chan struct{}
}

// NewSynced samples reference once (an error if that fails) and returns a
// Synced clock over local (Real when nil). Start keeps it in step every
// interval (SyncIntervalDefault when 0).
func NewSynced(ctx context.Context, local Clock, reference func(context.Context) (time.Time, error),
	interval time.Duration, logger *slog.Logger) (*Synced, error) {
	if local == nil {
		local = Real{}
	}
	if interval <= 0 {
		interval = SyncIntervalDefault
	}
	if logger == nil {
		logger = slog.Default()
	}
	s := &Synced{local: local, reference: reference, interval: interval, logger: logger}
	if err := s.Sync(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Now is the local time corrected by the last measured offset, in UTC.
func (s *Synced) Now() time.Time {
	s.mu.Lock()
	off := s.offset
	s.mu.Unlock()
	return s.local.Now().Add(off).UTC()
}

// Offset is the last measured reference - local difference.
func (s *Synced) Offset() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.offset
}

// Sync measures the offset once.
func (s *Synced) Sync(ctx context.Context) error {
	before := s.local.Now()
	ref, err := s.reference(ctx)
	after := s.local.Now()
	if err != nil {
		return fmt.Errorf("read the reference clock: %w", err)
	}
	mid := before.Add(after.Sub(before) / 2)
	s.mu.Lock()
	s.offset = ref.Sub(mid)
	s.mu.Unlock()
	return nil
}

// Start re-syncs every interval until Stop. A failed sync keeps the last
// offset and is logged: the clocks drift slowly, the database may be back
// by the next round.
func (s *Synced) Start(ctx context.Context) {
	ctx, s.cancel = context.WithCancel(ctx)
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		t := time.NewTicker(s.interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := s.Sync(ctx); err != nil && ctx.Err() == nil {
					s.logger.Warn("clock sync failed; keeping the last offset", "offset", s.Offset(), "err", err)
				}
			}
		}
	}()
}

// Stop ends the re-sync loop; it is idempotent and safe without Start.
func (s *Synced) Stop() {
	s.stopOnce.Do(func() {
		if s.cancel != nil {
			s.cancel()
			<-s.done
		}
	})
}
