package snapshot

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/shirou/gopsutil/v4/process"

	"github.com/vigil-fleet/vigil/internal/clock"
)

// DiscoveryCacheTTLDefault is how long one OS process lookup, found or not
// found, is reused (DESIGN F4: 7.5s).
const DiscoveryCacheTTLDefault = 7500 * time.Millisecond

// StartToleranceDefault is how much later than its instance's started_at an
// OS process may have been created and still count as that instance. It
// absorbs the create time's granularity (10ms ticks on Linux) and a small
// skew between this host's clock and the server clock that stamped
// started_at (the database's clock on PostgreSQL).
const StartToleranceDefault = 5 * time.Second

// Lookup is what the OS says about one pid.
type Lookup struct {
	Found     bool      // a live (not zombie) process holds the pid
	CreatedAt time.Time // its create time, when Found
}

// ProcessFinder looks up one process of this host by pid. A pid no process
// holds is Found false with a nil error; an error means the OS could not be
// asked (permissions, an unsupported platform).
type ProcessFinder interface {
	Find(ctx context.Context, pid int) (Lookup, error)
}

// OSFinder finds processes with gopsutil, which reads /proc on Linux,
// sysctl on macOS and the process APIs on Windows.
type OSFinder struct{}

// Find returns whether pid is held by a live process and when it was
// created. A zombie (exited, not yet reaped) counts as not found.
func (OSFinder) Find(ctx context.Context, pid int) (Lookup, error) {
	if pid <= 0 || int(int32(pid)) != pid {
		return Lookup{}, nil
	}
	p, err := process.NewProcessWithContext(ctx, int32(pid))
	if errors.Is(err, process.ErrorProcessNotRunning) {
		return Lookup{}, nil
	}
	if err != nil {
		return Lookup{}, fmt.Errorf("look up pid %d: %w", pid, err)
	}
	ms, err := p.CreateTimeWithContext(ctx)
	if err != nil {
		// It may have exited between the two reads.
		if exists, xerr := process.PidExistsWithContext(ctx, int32(pid)); xerr == nil && !exists {
			return Lookup{}, nil
		}
		return Lookup{}, fmt.Errorf("create time of pid %d: %w", pid, err)
	}
	// Status is best effort: not every platform reports it.
	if st, err := p.StatusWithContext(ctx); err == nil && len(st) > 0 && st[0] == process.Zombie {
		return Lookup{}, nil
	}
	return Lookup{Found: true, CreatedAt: time.UnixMilli(ms).UTC()}, nil
}

// MatchInstance decides the process state of an instance registered at
// startedAt with a pid whose lookup is l (DESIGN F4, pid reuse).
//
// A process that holds the pid now and was created no later than
// startedAt + tolerance is the instance: the instance reported its own pid
// when it registered, so a later process holding that pid is a reuse of it,
// created after the registration. Only this upper bound is checked: an agent
// may register long after it started, and any process created before the
// registration must be the one that registered.
func MatchInstance(l Lookup, startedAt time.Time, tolerance time.Duration) ProcessState {
	if !l.Found || l.CreatedAt.After(startedAt.Add(tolerance)) {
		return ProcessNotRunning
	}
	return ProcessRunning
}

// cachedFinder reuses each lookup, hit or miss, for ttl on clk. Errors are
// not cached: the next snapshot asks the OS again.
type cachedFinder struct {
	finder ProcessFinder
	clock  clock.Clock
	ttl    time.Duration

	mu      sync.Mutex
	entries map[int]cacheEntry
}

type cacheEntry struct {
	lookup  Lookup
	expires time.Time
}

func newCachedFinder(f ProcessFinder, clk clock.Clock, ttl time.Duration) *cachedFinder {
	return &cachedFinder{finder: f, clock: clk, ttl: ttl, entries: map[int]cacheEntry{}}
}

// Find answers from the cache while the entry is fresh, else asks the
// finder and, on success, caches the answer.
func (c *cachedFinder) Find(ctx context.Context, pid int) (Lookup, error) {
	now := c.clock.Now()
	c.mu.Lock()
	e, ok := c.entries[pid]
	c.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.lookup, nil
	}
	l, err := c.finder.Find(ctx, pid)
	if err != nil {
		return Lookup{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for p, old := range c.entries {
		if !now.Before(old.expires) {
			delete(c.entries, p)
		}
	}
	c.entries[pid] = cacheEntry{lookup: l, expires: now.Add(c.ttl)}
	return l, nil
}
