package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vigil-fleet/vigil/internal/liveness"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// Sustained fleet load (issue #6, last row): a simulated fleet of agents,
// each sending a liveness heartbeat every 30 s, open loop at the fleet's
// rate against a server on PostgreSQL, while an operator reads
// process_status.
func init() {
	register(Case{Name: "fleet-load-postgres", NeedsPostgres: true, Run: runFleetLoad})
}

// Sizes of the fleet load.
const (
	loadAgents           = 1_000_000
	loadIntervalS        = 30
	loadDuration         = 60 * time.Second
	loadWorkers          = 512 // in-flight requests at most (HTTP connections)
	loadKinds            = 1000
	loadHosts            = 10_000
	loadStatusEvery      = 20 * time.Millisecond // process_status sampling period
	loadCopyChunk        = 100_000
	loadDrainMax         = 30 * time.Second // how long a backlog may take to finish after the window
	loadSmokeAgents      = 500
	loadSmokeIntervalS   = 1
	loadSmokeDuration    = 700 * time.Millisecond
	loadSmokeWorkers     = 32
	loadTargetP99        = 50 * time.Millisecond
	loadStatusTargetP50  = 300 * time.Microsecond
	loadStatusTargetP99  = time.Millisecond
	loadRegisterInterval = loadIntervalS // the liveness_interval_s the fleet registers with
)

// loadInstanceID and loadToken name agent i of the simulated fleet.
func loadInstanceID(i int) string { return "fleet-" + strconv.Itoa(i) }
func loadToken(i int) string      { return "fleet-token-" + strconv.Itoa(i) }
func loadKind(i int) string       { return "fleet-kind-" + strconv.Itoa(i%loadKinds) }

func runFleetLoad(ctx context.Context, env Env) (rows []Row, err error) {
	agents, intervalS, dur, workers := loadAgents, loadIntervalS, loadDuration, loadWorkers
	if env.Smoke {
		agents, intervalS, dur, workers = loadSmokeAgents, loadSmokeIntervalS, loadSmokeDuration, loadSmokeWorkers
	}
	rate := float64(agents) / float64(intervalS)

	schema, err := newPGSchema(ctx, env.PostgresURL)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, schema.Drop()) }()
	url, err := schema.URL(nil)
	if err != nil {
		return nil, err
	}
	d, err := hbStartDaemon(ctx, url) // migrates the schema
	if err != nil {
		return nil, err
	}
	stopped := false
	defer func() {
		if !stopped {
			err = errors.Join(err, d.Stop())
		}
	}()
	if err := loadBulkRegister(ctx, env, url, agents); err != nil {
		return nil, err
	}

	env.Logf("  open loop: %s heartbeats/s for %s (%d agents at %ds), %d workers",
		hbThousands(rate), dur, agents, intervalS, workers)
	client := hbHTTPClient(workers + 1)
	defer client.CloseIdleConnections()
	base := d.URL()

	statsBefore, err := loadTableStats(ctx, url, schema.Name)
	if err != nil {
		return nil, err
	}
	statusCtx, stopStatus := context.WithCancel(ctx)
	statusDone := make(chan hbStats, 1)
	go func() { statusDone <- loadSampleStatus(statusCtx, client, base, agents) }()
	hb := hbOpenLoop(ctx, rate, dur, workers, func(ctx context.Context, seq int64) error {
		i := int(seq % int64(agents))
		return hbPost(ctx, client, base, loadInstanceID(i), loadToken(i))
	})
	stopStatus()
	status := <-statusDone
	// Stopped, the server's connections close and their backends flush
	// their statistics on the way out.
	stopped = true
	if err := d.Stop(); err != nil {
		return nil, err
	}
	statsAfter, err := loadTableStats(ctx, url, schema.Name)
	if err != nil {
		return nil, err
	}
	hot := statsAfter.sub(statsBefore)
	env.Logf("  processes: %d updates, %.0f%% HOT; table %s → %s, with indexes %s → %s",
		hot.updates, hot.hotPercent(), hbMiB(statsBefore.tableBytes), hbMiB(statsAfter.tableBytes),
		hbMiB(statsBefore.totalBytes), hbMiB(statsAfter.totalBytes))
	env.Logf("  heartbeats: %s (%d errors, %d never sent); process_status: %s", hb.Summary(), hb.Errors, hb.Unsent, status.Summary())
	if hb.N == 0 {
		return nil, fmt.Errorf("fleet load: no heartbeat succeeded; first error: %v", hb.FirstErr)
	}

	r := Row{
		Path: fmt.Sprintf("sustained fleet load, PostgreSQL: %s agents at a %d s liveness interval (%s heartbeats/s) for %s",
			hbThousands(float64(agents)), intervalS, hbThousands(rate), dur),
		Figure:   fmt.Sprintf("achieved %s", hb.Summary()),
		Baseline: "—",
		Target:   fmt.Sprintf("%s/s sustained, p99 ≤ 50 ms; process_status p50 ≤ 300 µs, p99 ≤ 1 ms", hbThousands(rate)),
		Met: hb.Rate() >= 0.99*rate && hb.Errors == 0 && hb.Unsent == 0 && hb.Quantile(0.99) <= loadTargetP99 &&
			status.Quantile(0.5) <= loadStatusTargetP50 && status.Quantile(0.99) <= loadStatusTargetP99,
		Note: fmt.Sprintf("open loop, latency from each request's scheduled send time; %d workers; %d errors; %d scheduled but never sent (server behind); "+
			"process_status (GET /v1/process-status/{kind}, %d kinds) during the load: %d samples, p50 %s, p99 %s",
			workers, hb.Errors, hb.Unsent, loadKinds, len(status.Latencies), hbMS(status.Quantile(0.5)), hbMS(status.Quantile(0.99))),
	}
	r.Note += fmt.Sprintf("; processes during the load: %.0f%% of %d updates HOT, table %s → %s (with indexes %s → %s)",
		hot.hotPercent(), hot.updates, hbMiB(statsBefore.tableBytes), hbMiB(statsAfter.tableBytes),
		hbMiB(statsBefore.totalBytes), hbMiB(statsAfter.totalBytes))
	if hb.FirstErr != nil {
		r.Note += "; first error: " + hb.FirstErr.Error()
	}
	if env.Smoke {
		r.Note = "smoke; " + r.Note
	}
	return []Row{r}, nil
}

// loadBulkRegister inserts the fleet's instances with COPY, as registered
// now (alive) with liveness_interval_s 30 and the token loadToken(i).
func loadBulkRegister(ctx context.Context, env Env, url string, agents int) error {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	now := time.Now().UTC().Truncate(time.Millisecond)
	cols := []string{"instance_id", "token_hash", "process_kind", "hostname", "pid",
		"liveness_interval_s", "started_at", "last_heartbeat_at", "alive_until"}
	start := time.Now()
	for from := 0; from < agents; from += loadCopyChunk {
		n := min(loadCopyChunk, agents-from)
		_, err := pool.CopyFrom(ctx, pgx.Identifier{"processes"}, cols, pgx.CopyFromSlice(n, func(j int) ([]any, error) {
			i := from + j
			started := now.Add(time.Duration(i-agents) * time.Millisecond) // distinct, in the past
			return []any{loadInstanceID(i), liveness.HashToken(loadToken(i)), loadKind(i),
				"fleet-host-" + strconv.Itoa(i%loadHosts), int64(10000 + i%50000), float64(loadRegisterInterval),
				started, now, now.Add(vigiltype.AliveWindow(loadRegisterInterval))}, nil
		}))
		if err != nil {
			return fmt.Errorf("bulk register agents %d..%d: %w", from, from+n, err)
		}
		if agents > loadCopyChunk {
			env.Logf("  registered %s / %s agents (COPY, %s)", hbThousands(float64(from+n)), hbThousands(float64(agents)),
				time.Since(start).Round(100*time.Millisecond))
		}
	}
	if _, err := pool.Exec(ctx, "ANALYZE processes"); err != nil {
		return fmt.Errorf("analyze processes: %w", err)
	}
	env.Logf("  %s agents registered in %s", hbThousands(float64(agents)), time.Since(start).Round(100*time.Millisecond))
	return nil
}

// loadSampleStatus reads process_status of a random kind every
// loadStatusEvery until ctx ends.
func loadSampleStatus(ctx context.Context, c *http.Client, base string, agents int) hbStats {
	var st hbStats
	tick := time.NewTicker(loadStatusEvery)
	defer tick.Stop()
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			st.Elapsed = time.Since(start)
			slices.Sort(st.Latencies)
			st.N = len(st.Latencies)
			return st
		case <-tick.C:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/process-status/"+loadKind(rand.IntN(agents)), nil)
		if err != nil {
			continue
		}
		t := time.Now()
		if err := hbDo(c, req); err != nil {
			if ctx.Err() == nil {
				st.Errors++
			}
			continue
		}
		st.Latencies = append(st.Latencies, time.Since(t))
	}
}

// hbOpenLoop sends op at a fixed rate for dur, whatever the answers' pace
// (open loop), from at most workers goroutines at once. Each latency counts
// from the request's scheduled send time, so a server that falls behind
// shows it in the latencies instead of slowing the load down (no
// coordinated omission). Requests scheduled in the window but still queued
// when it ends are finished (for at most loadDrainMax) and counted; those
// the queue had no room for by the end of the window are never sent
// (Unsent). The achieved rate is completions over the time until the last
// one finished.
func hbOpenLoop(ctx context.Context, rate float64, dur time.Duration, workers int, op func(ctx context.Context, seq int64) error) hbStats {
	type job struct {
		seq int64
		due time.Time
	}
	total := int64(rate * dur.Seconds())
	jobs := make(chan job, 1<<16)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		all      hbStats
		lastDone atomic.Int64 // unix nanoseconds of the latest completion
	)
	opCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range workers {
		wg.Go(func() {
			var (
				lat      []time.Duration
				errs     int
				firstErr error
			)
			for j := range jobs {
				if d := time.Until(j.due); d > 0 {
					time.Sleep(d)
				}
				err := op(opCtx, j.seq)
				now := time.Now()
				for {
					old := lastDone.Load()
					if now.UnixNano() <= old || lastDone.CompareAndSwap(old, now.UnixNano()) {
						break
					}
				}
				if err != nil {
					errs++
					if firstErr == nil {
						firstErr = err
					}
					continue
				}
				lat = append(lat, now.Sub(j.due))
			}
			mu.Lock()
			all.Latencies = append(all.Latencies, lat...)
			all.Errors += errs
			if all.FirstErr == nil {
				all.FirstErr = firstErr
			}
			mu.Unlock()
		})
	}
	start := time.Now()
	interval := time.Duration(float64(time.Second) / rate)
	windowEnd := time.NewTimer(dur)
	defer windowEnd.Stop()
	var sent int64
dispatch:
	for seq := range total {
		select {
		case jobs <- job{seq: seq, due: start.Add(time.Duration(seq) * interval)}:
			sent++
		case <-windowEnd.C:
			// The workers are so far behind that the queue stayed full
			// to the end of the window: the rest is never sent.
			break dispatch
		case <-ctx.Done():
			break dispatch
		}
	}
	close(jobs)
	all.Unsent = int(total - sent)
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(time.Until(start.Add(dur + loadDrainMax))):
		cancel() // the rest fail and count as errors
		<-drained
	}
	all.Elapsed = time.Unix(0, lastDone.Load()).Sub(start)
	all.Elapsed = max(all.Elapsed, dur)
	slices.Sort(all.Latencies)
	all.N = len(all.Latencies)
	return all
}

// loadStats are the processes table's update counters and sizes.
type loadStats struct {
	updates, hotUpdates    int64
	tableBytes, totalBytes int64
}

// sub is the counters' growth from before to s (sizes are s's).
func (s loadStats) sub(before loadStats) loadStats {
	s.updates -= before.updates
	s.hotUpdates -= before.hotUpdates
	return s
}

// hotPercent is the share of updates that were heap-only (HOT): no index
// entry written, the new row version on the same page.
func (s loadStats) hotPercent() float64 {
	if s.updates == 0 {
		return 0
	}
	return 100 * float64(s.hotUpdates) / float64(s.updates)
}

// loadTableStats reads the processes table's statistics in schema. The
// counters lag by up to a second (PostgreSQL flushes them in batches).
func loadTableStats(ctx context.Context, url, schema string) (loadStats, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return loadStats{}, err
	}
	defer conn.Close(context.Background())
	var s loadStats
	err = conn.QueryRow(ctx, `
		SELECT n_tup_upd, n_tup_hot_upd, pg_relation_size(relid), pg_total_relation_size(relid)
		FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'processes'`, schema).
		Scan(&s.updates, &s.hotUpdates, &s.tableBytes, &s.totalBytes)
	if err != nil {
		return loadStats{}, fmt.Errorf("read processes statistics: %w", err)
	}
	return s, nil
}

// hbMiB formats a size in MiB.
func hbMiB(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }
