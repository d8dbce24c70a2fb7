package bench

// Claim rows (issue #6): claim + complete of no-op tasks through the Go SDK
// against a real server, with zero double claims, next to a raw claim loop
// through the same driver and, on PostgreSQL, River workers on the same
// database.

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/vigil-fleet/vigil/vigilclient"
)

func init() {
	register(Case{Name: "claims-sqlite", Run: func(ctx context.Context, env Env) ([]Row, error) {
		return runClaims(ctx, env, rdSQLite)
	}})
	register(Case{Name: "claims-postgres", NeedsPostgres: true, Run: func(ctx context.Context, env Env) ([]Row, error) {
		return runClaims(ctx, env, rdPostgres)
	}})
}

// Task types of the claim rows: one per measurement, so each drains its own.
const (
	clTypeSDK = "bench.sdk"
	clTypeRaw = "bench.raw"
)

// clWorkers is how many raw PostgreSQL claim loops run at once.
const clWorkers = 16

// clSizes returns how many tasks each measurement drains.
func clSizes(env Env) int {
	if env.Smoke {
		return 150
	}
	return 20_000
}

// clEnqueue bulk-inserts n scheduled no-op tasks of typ, claimable now.
func (s *rdServer) clEnqueue(ctx context.Context, typ string, n int) error {
	now := time.Now().Add(-time.Second).UTC()
	var err error
	switch s.backend {
	case rdSQLite:
		ts := now.Format("2006-01-02T15:04:05.000Z")
		_, err = s.sqlite.ExecContext(ctx, `
			WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
			INSERT INTO tasks (task_type, payload, status, max_attempts, max_reclaims, run_after, created_at, updated_at)
			SELECT ?2, '{}', 'scheduled', 5, 3, ?3, ?3, ?3 FROM n`, n, typ, ts)
	case rdPostgres:
		_, err = s.pg.Exec(ctx, `
			INSERT INTO tasks (task_type, payload, status, max_attempts, max_reclaims, run_after, created_at, updated_at)
			SELECT $2, '{}', 'scheduled', 5, 3, $3, $3, $3 FROM generate_series(1, $1::bigint)`,
			n, typ, now.Truncate(time.Millisecond))
		if err == nil {
			_, err = s.pg.Exec(ctx, `VACUUM ANALYZE tasks`)
		}
	}
	if err != nil {
		return fmt.Errorf("enqueue %d %s tasks: %w", n, typ, err)
	}
	return nil
}

// clCheck counts, in the database, the tasks of typ that are completed at
// epoch 1 (claimed exactly once), and returns an error unless all n are.
func (s *rdServer) clCheck(ctx context.Context, typ string, n int) error {
	var done, once int64
	const q = `SELECT count(*) FILTER (WHERE status = 'completed'), count(*) FILTER (WHERE lease_epoch = 1) FROM tasks WHERE task_type = `
	var err error
	switch s.backend {
	case rdSQLite:
		err = s.sqlite.QueryRowContext(ctx, q+`?`, typ).Scan(&done, &once)
	case rdPostgres:
		err = s.pg.QueryRow(ctx, q+`$1`, typ).Scan(&done, &once)
	}
	if err != nil {
		return fmt.Errorf("check %s tasks: %w", typ, err)
	}
	if done != int64(n) || once != int64(n) {
		return fmt.Errorf("check %s tasks: %d of %d completed, %d claimed exactly once", typ, done, n, once)
	}
	return nil
}

// The SDK measurement runs clAgents agents (vigilclient.Agent, each its
// own process instance) with Concurrency clConcurrency: each claims up to
// its free slots in one request (batch claims, max_tasks) and completes
// every task on its own lease.
const (
	clAgents      = 2
	clConcurrency = 32
)

// clSDK drains the clTypeSDK tasks with clAgents SDK agents running no-op
// handlers, clConcurrency tasks at a time each, from the agents' start
// until the server has accepted the last completion. It returns the
// elapsed time and how many tasks were handed to a handler more than once
// (double claims).
func (s *rdServer) clSDK(ctx context.Context, n int) (time.Duration, int, error) {
	allDone := make(chan struct{})
	counter := &clCompletions{
		next: &http.Transport{MaxIdleConnsPerHost: 2 * clAgents * clConcurrency},
		want: int64(n), done: allDone,
	}
	hc := &http.Client{Transport: counter}
	defer counter.next.CloseIdleConnections()
	client, err := vigilclient.New([]string{s.url}, vigilclient.WithHTTPClient(hc))
	if err != nil {
		return 0, 0, err
	}
	var (
		mu      sync.Mutex
		handled = make(map[int64]int, n)
	)
	handler := func(_ context.Context, t *vigilclient.Task) (any, error) {
		mu.Lock()
		handled[t.TaskID]++
		mu.Unlock()
		return nil, nil
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	errs := make([]error, clAgents)
	stopped := make(chan struct{}, clAgents)
	start := time.Now()
	for i := range clAgents {
		a := &vigilclient.Agent{
			Kind:        "bench-worker",
			Handlers:    map[string]vigilclient.Handler{clTypeSDK: handler},
			Settings:    vigilclient.Settings{PollInterval: 10 * time.Millisecond},
			Client:      client,
			Logger:      slog.New(slog.DiscardHandler),
			Hostname:    "bench",
			PID:         1 + i,
			Concurrency: clConcurrency,
		}
		wg.Go(func() {
			errs[i] = a.Run(runCtx)
			stopped <- struct{}{}
		})
	}
	timeout := time.NewTimer(10 * time.Minute)
	defer timeout.Stop()
	var elapsed time.Duration
	var waitErr error
	select {
	case <-allDone:
		elapsed = time.Since(start)
	case <-stopped:
		waitErr = fmt.Errorf("an SDK agent stopped after %d of %d completions", counter.n.Load(), n)
	case <-timeout.C:
		waitErr = fmt.Errorf("%d of %d completions after 10 minutes", counter.n.Load(), n)
	case <-ctx.Done():
		waitErr = ctx.Err()
	}
	stop()
	wg.Wait()
	if err := errors.Join(append(errs, waitErr)...); err != nil {
		return 0, 0, err
	}
	doubles := 0
	for _, c := range handled {
		if c > 1 {
			doubles++
		}
	}
	if len(handled) != n {
		return 0, 0, fmt.Errorf("SDK agents handled %d distinct tasks, want %d", len(handled), n)
	}
	return elapsed, doubles, nil
}

// clCompletions is the SDK agents' transport: it counts the completions
// the server accepted (200 to POST /v1/tasks/{id}/complete) and closes
// done at the want-th, without polling the database.
type clCompletions struct {
	next *http.Transport
	want int64
	done chan struct{}
	n    atomic.Int64
}

// RoundTrip implements http.RoundTripper.
func (c *clCompletions) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(r)
	if err == nil && resp.StatusCode == http.StatusOK && strings.HasSuffix(r.URL.Path, "/complete") {
		k := int64(1)
		if r.URL.Path == "/v1/tasks/complete" {
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			resp.Body = io.NopCloser(bytes.NewReader(raw))
			k = int64(bytes.Count(raw, []byte(`"task":{`)))
		}
		if n := c.n.Add(k); n >= c.want && n-k < c.want {
			close(c.done)
		}
	}
	return resp, err
}

// clRaw drains the clTypeRaw tasks with a raw claim loop through the same
// driver: one task per claim statement, then one completing statement, each
// its own transaction; one loop on SQLite (one writer), clWorkers loops on
// PostgreSQL (FOR UPDATE SKIP LOCKED). It returns the elapsed time.
func (s *rdServer) clRaw(ctx context.Context, n int) (time.Duration, error) {
	loops := 1
	if s.backend == rdPostgres {
		loops = clWorkers
	}
	var done atomic.Int64
	errs := make([]error, loops)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range loops {
		owner := fmt.Sprintf("raw-%d", w)
		wg.Go(func() {
			for {
				ok, err := s.clRawOne(ctx, owner)
				if err != nil {
					errs[w] = err
					return
				}
				if !ok {
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	if done.Load() != int64(n) {
		return 0, fmt.Errorf("raw loop completed %d tasks, want %d", done.Load(), n)
	}
	return elapsed, nil
}

// clRawOne claims one clTypeRaw task for owner and completes it; false when
// none is left.
func (s *rdServer) clRawOne(ctx context.Context, owner string) (bool, error) {
	now := time.Now().UTC().Truncate(time.Millisecond)
	var id, epoch int64
	switch s.backend {
	case rdSQLite:
		ts := now.Format("2006-01-02T15:04:05.000Z")
		exp := now.Add(5 * time.Minute).Format("2006-01-02T15:04:05.000Z")
		err := s.sqlite.QueryRowContext(ctx, `
			UPDATE tasks SET status = 'running', lease_owner = ?1, lease_epoch = lease_epoch + 1,
				started_at = ?2, last_heartbeat_at = ?2, last_activity_at = ?2, lease_expires_at = ?3, updated_at = ?2
			WHERE task_id = (
				SELECT task_id FROM tasks
				WHERE status = 'scheduled' AND run_after <= ?2 AND task_type = ?4
				ORDER BY run_after, task_id LIMIT 1)
			AND status = 'scheduled'
			RETURNING task_id, lease_epoch`, owner, ts, exp, clTypeRaw).Scan(&id, &epoch)
		if err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return false, nil
			}
			return false, err
		}
		_, err = s.sqlite.ExecContext(ctx, `
			UPDATE tasks SET status = 'completed', completed_by = lease_owner, completed_at = ?1,
				lease_owner = NULL, lease_expires_at = NULL, updated_at = ?1
			WHERE task_id = ?2 AND status = 'running' AND lease_owner = ?3 AND lease_epoch = ?4`,
			ts, id, owner, epoch)
		return true, err
	default:
		err := s.pg.QueryRow(ctx, `
			WITH next AS (
				SELECT task_id FROM tasks
				WHERE status = 'scheduled' AND run_after <= $2 AND task_type = $4
				ORDER BY run_after, task_id LIMIT 1
				FOR UPDATE SKIP LOCKED)
			UPDATE tasks SET status = 'running', lease_owner = $1, lease_epoch = lease_epoch + 1,
				started_at = $2, last_heartbeat_at = $2, last_activity_at = $2, lease_expires_at = $3, updated_at = $2
			WHERE task_id = (SELECT task_id FROM next) AND status = 'scheduled'
			RETURNING task_id, lease_epoch`, owner, now, now.Add(5*time.Minute), clTypeRaw).Scan(&id, &epoch)
		if err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return false, nil
			}
			return false, err
		}
		_, err = s.pg.Exec(ctx, `
			UPDATE tasks SET status = 'completed', completed_by = lease_owner, completed_at = $1,
				lease_owner = NULL, lease_expires_at = NULL, updated_at = $1
			WHERE task_id = $2 AND status = 'running' AND lease_owner = $3 AND lease_epoch = $4`,
			now, id, owner, epoch)
		return true, err
	}
}

// clNoopArgs is River's no-op job.
type clNoopArgs struct{}

// Kind implements river.JobArgs.
func (clNoopArgs) Kind() string { return "vigil_bench_noop" }

// clNoopWorker works a clNoopArgs job by doing nothing.
type clNoopWorker struct {
	river.WorkerDefaults[clNoopArgs]
}

// Work implements river.Worker.
func (clNoopWorker) Work(context.Context, *river.Job[clNoopArgs]) error { return nil }

// River's settings for the baseline, tuned for throughput: with its
// defaults (100 ms fetch cooldown) and 100 workers River cannot fetch more
// than 1,000 jobs/s, which would make a weak baseline.
const (
	clRiverWorkers       = 1000
	clRiverFetchCooldown = 10 * time.Millisecond
)

// clRiver runs River's migrations into the bench's schema, inserts n no-op
// jobs and measures River workers on the same database working them all,
// from the client's start until the last completion is reported.
func (s *rdServer) clRiver(ctx context.Context, n int) (time.Duration, error) {
	driver := riverpgxv5.New(s.pg)
	migrator, err := rivermigrate.New(driver, &rivermigrate.Config{Schema: s.schema})
	if err != nil {
		return 0, fmt.Errorf("river migrator: %w", err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return 0, fmt.Errorf("river migrate: %w", err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &clNoopWorker{})
	client, err := river.NewClient(driver, &river.Config{
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: clRiverWorkers}},
		FetchCooldown: clRiverFetchCooldown,
		Workers:       workers,
		Schema:        s.schema,
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return 0, fmt.Errorf("river client: %w", err)
	}
	params := make([]river.InsertManyParams, n)
	for i := range params {
		params[i] = river.InsertManyParams{Args: clNoopArgs{}}
	}
	if _, err := client.InsertManyFast(ctx, params); err != nil {
		return 0, fmt.Errorf("river insert: %w", err)
	}
	if _, err := s.pg.Exec(ctx, `VACUUM ANALYZE river_job`); err != nil {
		return 0, err
	}
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{
		Kinds: []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed}, ChanSize: n + 1000,
	})
	defer cancel()
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return 0, fmt.Errorf("river start: %w", err)
	}
	defer func() {
		sctx, stop := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer stop()
		_ = client.Stop(sctx)
	}()
	timeout := time.NewTimer(10 * time.Minute)
	defer timeout.Stop()
	for got := 0; got < n; {
		select {
		case ev := <-events:
			if ev.Kind != river.EventKindJobCompleted {
				return 0, fmt.Errorf("river job %d: %s", ev.Job.ID, ev.Kind)
			}
			got++
		case <-timeout.C:
			return 0, fmt.Errorf("river: %d of %d jobs completed after 10 minutes", got, n)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return time.Since(start), nil
}

// clRate formats n tasks in d as tasks per second.
func clRate(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }

func runClaims(ctx context.Context, env Env, backend rdBackend) ([]Row, error) {
	n := clSizes(env)
	s, err := rdStart(ctx, env, backend, "claims", 0)
	if err != nil {
		return nil, err
	}
	defer s.stop()
	if err := s.clEnqueue(ctx, clTypeSDK, n); err != nil {
		return nil, err
	}
	if err := s.clEnqueue(ctx, clTypeRaw, n); err != nil {
		return nil, err
	}
	env.Logf("  %s: %d tasks per measurement enqueued", backend, n)

	sdkTime, doubles, err := s.clSDK(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("SDK claims: %w", err)
	}
	if err := s.clCheck(ctx, clTypeSDK, n); err != nil {
		return nil, err
	}
	sdk := clRate(n, sdkTime)
	env.Logf("  SDK: %d tasks in %s: %.0f tasks/s, %d double claims", n, sdkTime.Round(time.Millisecond), sdk, doubles)
	rawTime, err := s.clRaw(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("raw claim loop: %w", err)
	}
	if err := s.clCheck(ctx, clTypeRaw, n); err != nil {
		return nil, err
	}
	raw := clRate(n, rawTime)
	env.Logf("  raw loop: %d tasks in %s: %.0f tasks/s", n, rawTime.Round(time.Millisecond), raw)

	figure := fmt.Sprintf("%.0f tasks/s (%d SDK agents × concurrency %d, batch claims, %d tasks), %d double claims",
		sdk, clAgents, clConcurrency, n, doubles)
	if backend == rdSQLite {
		row := Row{
			Path:     "claim + complete of no-op tasks through the SDK, SQLite",
			Figure:   figure,
			Baseline: fmt.Sprintf("raw single-claim loop, same driver: %.0f tasks/s", raw),
			Ratio:    sdk / raw,
			Target:   "≥ 20,000 tasks/s, zero double claims; ≥ 2× the single-claim loop",
			Met:      sdk >= 20_000 && doubles == 0 && sdk/raw >= 2,
		}
		if !row.Met {
			row.Note = clNote(sdk, 20_000, doubles, fmt.Sprintf("%.2f× the single-claim loop (target 2×)", sdk/raw))
		}
		return []Row{row}, nil
	}

	riverTime, riverErr := s.clRiver(ctx, n)
	var riverRate float64
	if riverErr != nil {
		env.Logf("  River: %v", riverErr)
	} else {
		riverRate = clRate(n, riverTime)
		env.Logf("  River: %d jobs in %s: %.0f jobs/s", n, riverTime.Round(time.Millisecond), riverRate)
	}
	row := Row{
		Path:     "claim + complete of no-op tasks through the SDK, PostgreSQL",
		Figure:   figure,
		Baseline: fmt.Sprintf("raw SKIP LOCKED loop (%d loops): %.0f tasks/s (SDK %.2f× it)", clWorkers, raw, sdk/raw),
		Target:   "≥ 5,000 tasks/s, zero double claims; report both ratios, aim ≥ 1× River",
	}
	if riverErr == nil {
		row.Baseline = fmt.Sprintf("River v0.51.2 (%d workers, %s fetch cooldown, same database): %.0f jobs/s; ",
			clRiverWorkers, clRiverFetchCooldown, riverRate) + row.Baseline
		row.Ratio = sdk / riverRate
	} else {
		row.Ratio = sdk / raw
		row.Note = "River baseline failed: " + riverErr.Error() + "; ratio is to the raw loop. "
	}
	row.Met = sdk >= 5_000 && doubles == 0 && riverErr == nil && row.Ratio >= 1
	if !row.Met {
		row.Note += clNote(sdk, 5_000, doubles, fmt.Sprintf("%.2f× River, %.2f× the raw loop", row.Ratio, sdk/raw))
	}
	return []Row{row}, nil
}

// clNote says which part of a claim target missed.
func clNote(rate, target float64, doubles int, ratio string) string {
	note := "missed: "
	if rate < target {
		note += fmt.Sprintf("%.0f tasks/s is below %.0f; ", rate, target)
	}
	if doubles > 0 {
		note += fmt.Sprintf("%d DOUBLE CLAIMS; ", doubles)
	}
	return note + ratio + " (see docs/performance/reads.md)"
}
