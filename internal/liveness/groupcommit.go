package liveness

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/vigil-fleet/vigil/internal/store"
)

// Group commit of liveness heartbeats (issue #6).
//
// Without it every heartbeat is a transaction of its own, and a database
// spends most of a transaction on its commit (a WAL write and, on
// PostgreSQL, an fsync), not on the one-row UPDATE. With it, heartbeats that
// arrive while the previous commit is in progress (and, with a Linger, a
// few milliseconds more) share one transaction:
//
//	request ──► queue of its shard ──► committer: ProcessHeartbeatBatch ──► each request answered
//	                                   (one transaction, last value wins
//	                                    per instance)
//
// A request is answered only after the commit that holds its heartbeat, and
// with its own answer: its row as written, or its own refusal (unknown
// instance, wrong token, exited), exactly as without batching. When a batch
// fails as a whole (a value the database refuses, a deadlock, a lost
// connection), each of its heartbeats is written again alone so that each
// request still gets its own answer. An instance always goes to the same
// shard, so its heartbeats commit in the order they arrived.

// Defaults for GroupCommitConfig.
const (
	// GroupCommitMaxBatchDefault is the most heartbeats one transaction holds.
	GroupCommitMaxBatchDefault = 1000
	// GroupCommitShardsDefault is the number of committers.
	GroupCommitShardsDefault = 1
	// GroupCommitFlushTimeoutDefault bounds one batch's transaction.
	GroupCommitFlushTimeoutDefault = 30 * time.Second
	// GroupCommitLingerMax is the longest Linger accepted: the wait is added
	// to every heartbeat's answer.
	GroupCommitLingerMax = 100 * time.Millisecond
)

// GroupCommitConfig tunes the group commit of liveness heartbeats. The zero
// value takes the defaults.
type GroupCommitConfig struct {
	// MaxBatch is the most heartbeats one transaction holds
	// (GroupCommitMaxBatchDefault).
	MaxBatch int
	// Linger is how long a committer waits, after the first heartbeat of a
	// batch arrives, for more to join it. 0 (the default) waits for none:
	// a batch is then whatever arrived while the previous commit ran, so a
	// lone heartbeat is never delayed and a busy server batches on its own.
	Linger time.Duration
	// Shards is the number of committers, each with its own queue and
	// transactions (GroupCommitShardsDefault). More than one lets commits
	// overlap on a database with several connections (PostgreSQL); an
	// instance always uses the same one.
	Shards int
	// FlushTimeout bounds one batch's transaction (GroupCommitFlushTimeoutDefault).
	FlushTimeout time.Duration
}

// withDefaults fills the zero fields and validates the rest; errors name the field.
func (c GroupCommitConfig) withDefaults() (GroupCommitConfig, error) {
	if c.MaxBatch < 0 || c.Shards < 0 || c.Linger < 0 || c.FlushTimeout < 0 {
		return c, errors.New("group commit: MaxBatch, Shards, Linger and FlushTimeout must not be negative")
	}
	if c.Linger > GroupCommitLingerMax {
		return c, fmt.Errorf("group commit: Linger must be at most %s, got %s", GroupCommitLingerMax, c.Linger)
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = GroupCommitMaxBatchDefault
	}
	if c.Shards == 0 {
		c.Shards = GroupCommitShardsDefault
	}
	if c.FlushTimeout == 0 {
		c.FlushTimeout = GroupCommitFlushTimeoutDefault
	}
	return c, nil
}

// shardOf is the shard an instance's heartbeats go to.
func shardOf(instanceID string, shards int) int {
	if shards <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(instanceID))
	return int(h.Sum32() % uint32(shards))
}

// pendingBeat is one heartbeat waiting for its commit.
type pendingBeat struct {
	params store.ProcessHeartbeatParams
	done   chan store.ProcessHeartbeatResult // buffered: the committer never blocks on it
}

// beatQueue is one shard's queue. Closed, it takes no more heartbeats.
type beatQueue struct {
	mu     sync.Mutex
	queue  []*pendingBeat
	closed bool
	wake   chan struct{} // capacity 1: "the queue is not empty"
}

// push appends a heartbeat stamped now() (under the lock, so that arrival
// order is time order within the shard); false once the queue is closed.
func (q *beatQueue) push(p store.ProcessHeartbeatParams, now func() time.Time) (*pendingBeat, bool) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil, false
	}
	p.Now = now()
	pb := &pendingBeat{params: p, done: make(chan store.ProcessHeartbeatResult, 1)}
	q.queue = append(q.queue, pb)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return pb, true
}

// take removes and returns up to max heartbeats, oldest first.
func (q *beatQueue) take(max int) []*pendingBeat {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := min(max, len(q.queue))
	batch := q.queue[:n:n]
	q.queue = q.queue[n:]
	if len(q.queue) == 0 {
		q.queue = nil // let the backing array go
	}
	return batch
}

// close stops the queue taking heartbeats; those already in it stay.
func (q *beatQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
}

// groupCommit is the committers of one Service, between Start and Stop.
type groupCommit struct {
	cfg    GroupCommitConfig
	store  store.Store
	queues []*beatQueue

	mu      sync.Mutex
	started bool
	cancel  context.CancelFunc
	done    sync.WaitGroup
}

func newGroupCommit(st store.Store, cfg GroupCommitConfig) *groupCommit {
	g := &groupCommit{cfg: cfg, store: st}
	for range cfg.Shards {
		// Closed until Start: heartbeats go straight to the store.
		g.queues = append(g.queues, &beatQueue{closed: true, wake: make(chan struct{}, 1)})
	}
	return g
}

// start launches one committer per shard. Starting a started group commit
// does nothing; a stopped one starts again.
func (g *groupCommit) start(ctx context.Context) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.started {
		return
	}
	g.started = true
	ctx, g.cancel = context.WithCancel(ctx)
	for _, q := range g.queues {
		q.mu.Lock()
		q.closed = false
		q.mu.Unlock()
		g.done.Add(1)
		go func() {
			defer g.done.Done()
			g.run(ctx, q)
		}()
	}
}

// stop closes the queues (later heartbeats go straight to the store),
// commits what they still hold, and waits for the committers to return.
// It is idempotent.
func (g *groupCommit) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.started {
		return
	}
	g.cancel()
	g.done.Wait()
	g.started = false
}

// submit queues a heartbeat and waits for its commit. ok is false when the
// group commit is not running: the caller then writes the heartbeat itself.
func (g *groupCommit) submit(ctx context.Context, p store.ProcessHeartbeatParams, now func() time.Time) (res store.ProcessHeartbeatResult, ok bool) {
	pb, ok := g.queues[shardOf(p.InstanceID, len(g.queues))].push(p, now)
	if !ok {
		return res, false
	}
	select {
	case res = <-pb.done:
		return res, true
	case <-ctx.Done():
		// The heartbeat may still commit; nobody waits for its answer.
		return store.ProcessHeartbeatResult{Err: fmt.Errorf("heartbeat process %s: %w", p.InstanceID, ctx.Err())}, true
	}
}

// run is one shard's committer: it waits for heartbeats, lets a batch
// gather for Linger, and commits batches until ctx ends; then it closes
// the queue and commits what is left.
func (g *groupCommit) run(ctx context.Context, q *beatQueue) {
	// Commits outlive ctx: a heartbeat already queued is answered with its
	// commit, also when the server is stopping.
	flushCtx := context.WithoutCancel(ctx)
	for {
		select {
		case <-q.wake:
		case <-ctx.Done():
			q.close()
			for g.flushOnce(flushCtx, q) {
			}
			return
		}
		if g.cfg.Linger > 0 {
			t := time.NewTimer(g.cfg.Linger)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		for ctx.Err() == nil && g.flushOnce(flushCtx, q) {
		}
	}
}

// flushOnce commits one batch from q; false when q was empty.
func (g *groupCommit) flushOnce(ctx context.Context, q *beatQueue) bool {
	batch := q.take(g.cfg.MaxBatch)
	if len(batch) == 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, g.cfg.FlushTimeout)
	defer cancel()
	g.commit(ctx, batch)
	return true
}

// commit writes a batch in one transaction and answers each heartbeat. If
// the transaction fails as a whole, each heartbeat is written alone, so
// that one heartbeat's trouble is not every other's.
func (g *groupCommit) commit(ctx context.Context, batch []*pendingBeat) {
	items := make([]store.ProcessHeartbeatParams, len(batch))
	for i, pb := range batch {
		items[i] = pb.params
	}
	results, err := g.store.ProcessHeartbeatBatch(ctx, items)
	if err == nil && len(results) != len(batch) {
		err = fmt.Errorf("heartbeat batch: %d results for %d heartbeats", len(results), len(batch))
	}
	if err != nil {
		for _, pb := range batch {
			p, err := g.store.ProcessHeartbeat(ctx, pb.params)
			pb.done <- store.ProcessHeartbeatResult{Process: p, Err: err}
		}
		return
	}
	for i, pb := range batch {
		pb.done <- results[i]
	}
}

// EnableGroupCommit makes Heartbeat commit liveness heartbeats in groups
// (see GroupCommitConfig) between Start and Stop; before Start and after
// Stop each heartbeat is still its own transaction. Call it before Start.
func (s *Service) EnableGroupCommit(cfg GroupCommitConfig) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	if s.commit != nil {
		return errors.New("group commit: already enabled")
	}
	s.commit = newGroupCommit(s.store, cfg)
	return nil
}

// Start starts the service's background work: the group commit's
// committers, when EnableGroupCommit was called (nothing otherwise). They
// run until ctx ends or Stop is called.
func (s *Service) Start(ctx context.Context) {
	if s.commit != nil {
		s.commit.start(ctx)
	}
}

// Stop commits the heartbeats still queued, answers them, and stops the
// committers; later heartbeats are written one by one. It is idempotent and
// safe on a service never started. Stop the HTTP server first, so that
// in-flight heartbeats are committed in groups to the end.
func (s *Service) Stop() {
	if s.commit != nil {
		s.commit.stop()
	}
}
