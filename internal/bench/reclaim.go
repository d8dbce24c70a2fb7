package bench

// Reclaim rows (issue #6): one pass of the lease reclaimer (lease.Service.
// Reclaim, what the server's lease_reclaimer sweeper runs) over 10,000
// expired leases, next to one raw UPDATE that takes the same leases back.

import (
	"context"
	"fmt"
	"slices"
	"time"
)

func init() {
	register(Case{Name: "reclaim-sqlite", Run: func(ctx context.Context, env Env) ([]Row, error) {
		return runReclaim(ctx, env, rdSQLite)
	}})
	register(Case{Name: "reclaim-postgres", NeedsPostgres: true, Run: func(ctx context.Context, env Env) ([]Row, error) {
		return runReclaim(ctx, env, rdPostgres)
	}})
}

// rcType is the task type of the reclaim rows' tasks.
const rcType = "bench.reclaim"

// rcSizes returns how many expired leases one pass takes back and how many
// passes of each kind are measured.
func rcSizes(env Env) (leases, rounds int) {
	if env.Smoke {
		return 500, 2
	}
	return 10_000, 7
}

// rcHolder is the instance id of the expired leases' holder: alive, so each
// lease is taken back for its expiry, the common case.
const rcHolder = "00000000-0000-4000-8000-0000000000aa"

// rcWaitSweep waits until the server's lease reclaimer has made its first
// pass, so that it cannot take a fixture's leases back under a measurement.
func (s *rdServer) rcWaitSweep(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		list, err := s.d.Store().SweeperList(ctx)
		if err != nil {
			return err
		}
		for _, sw := range list {
			if sw.Name == "lease_reclaimer" && sw.LastRunAt != nil {
				return nil
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("the lease reclaimer made no pass within 30s")
}

// rcSetup inserts the holder and n tasks of rcType once.
func (s *rdServer) rcSetup(ctx context.Context, n int) error {
	now := time.Now().UTC().Truncate(time.Millisecond)
	var err error
	switch s.backend {
	case rdSQLite:
		ts := now.Format("2006-01-02T15:04:05.000Z")
		alive := now.Add(3 * time.Hour).Format("2006-01-02T15:04:05.000Z")
		if _, err = s.sqlite.ExecContext(ctx, `
			INSERT INTO processes (instance_id, token_hash, process_kind, hostname, pid,
				liveness_interval_s, started_at, last_heartbeat_at, alive_until)
			VALUES (?1, 'x', 'bench-holder', 'bench', 1, 3600, ?2, ?2, ?3)`, rcHolder, ts, alive); err != nil {
			return err
		}
		_, err = s.sqlite.ExecContext(ctx, `
			WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
			INSERT INTO tasks (task_type, payload, status, max_attempts, max_reclaims, run_after, created_at, updated_at)
			SELECT ?2, '{}', 'scheduled', 5, 1000, ?3, ?3, ?3 FROM n`, n, rcType, ts)
	case rdPostgres:
		if _, err = s.pg.Exec(ctx, `
			INSERT INTO processes (instance_id, token_hash, process_kind, hostname, pid,
				liveness_interval_s, started_at, last_heartbeat_at, alive_until)
			VALUES ($1, 'x', 'bench-holder', 'bench', 1, 3600, $2, $2, $3)`, rcHolder, now, now.Add(3*time.Hour)); err != nil {
			return err
		}
		_, err = s.pg.Exec(ctx, `
			INSERT INTO tasks (task_type, payload, status, max_attempts, max_reclaims, run_after, created_at, updated_at)
			SELECT $2, '{}', 'scheduled', 5, 1000, $3, $3, $3 FROM generate_series(1, $1::bigint)`, n, rcType, now)
	}
	if err != nil {
		return fmt.Errorf("reclaim fixture: %w", err)
	}
	return nil
}

// rcExpire puts every rcType task under a lease of rcHolder that expired a
// minute ago (a claim ten minutes ago, epoch + 1).
func (s *rdServer) rcExpire(ctx context.Context) error {
	now := time.Now().UTC().Truncate(time.Millisecond)
	started, expired := now.Add(-10*time.Minute), now.Add(-time.Minute)
	var err error
	switch s.backend {
	case rdSQLite:
		const layout = "2006-01-02T15:04:05.000Z"
		_, err = s.sqlite.ExecContext(ctx, `
			UPDATE tasks SET status = 'running', lease_owner = ?1, lease_epoch = lease_epoch + 1,
				started_at = ?2, last_heartbeat_at = ?2, last_activity_at = ?2, lease_expires_at = ?3, updated_at = ?2
			WHERE task_type = ?4`, rcHolder, started.Format(layout), expired.Format(layout), rcType)
	case rdPostgres:
		_, err = s.pg.Exec(ctx, `
			UPDATE tasks SET status = 'running', lease_owner = $1, lease_epoch = lease_epoch + 1,
				started_at = $2, last_heartbeat_at = $2, last_activity_at = $2, lease_expires_at = $3, updated_at = $2
			WHERE task_type = $4`, rcHolder, started, expired, rcType)
		if err == nil {
			_, err = s.pg.Exec(ctx, `VACUUM ANALYZE tasks`)
		}
	}
	if err != nil {
		return fmt.Errorf("expire leases: %w", err)
	}
	return nil
}

// rcRawUpdate takes every expired lease back in one UPDATE: the baseline.
func (s *rdServer) rcRawUpdate(ctx context.Context) (int64, error) {
	now := time.Now().UTC().Truncate(time.Millisecond)
	switch s.backend {
	case rdSQLite:
		ts := now.Format("2006-01-02T15:04:05.000Z")
		res, err := s.sqlite.ExecContext(ctx, `
			UPDATE tasks SET status = 'scheduled', reclaims = reclaims + 1, run_after = ?1, started_at = NULL,
				last_error = 'lease expired', lease_owner = NULL, lease_expires_at = NULL, updated_at = ?1
			WHERE status = 'running' AND lease_expires_at < ?1`, ts)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	default:
		tag, err := s.pg.Exec(ctx, `
			UPDATE tasks SET status = 'scheduled', reclaims = reclaims + 1, run_after = $1, started_at = NULL,
				last_error = 'lease expired', lease_owner = NULL, lease_expires_at = NULL, updated_at = $1
			WHERE status = 'running' AND lease_expires_at < $1`, now)
		if err != nil {
			return 0, err
		}
		return tag.RowsAffected(), nil
	}
}

// rcMedian is the median of d.
func rcMedian(d []time.Duration) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	return d[len(d)/2]
}

func runReclaim(ctx context.Context, env Env, backend rdBackend) ([]Row, error) {
	n, rounds := rcSizes(env)
	s, err := rdStart(ctx, env, backend, "reclaim", 0)
	if err != nil {
		return nil, err
	}
	defer s.stop()
	if err := s.rcWaitSweep(ctx); err != nil {
		return nil, err
	}
	if err := s.rcSetup(ctx, n); err != nil {
		return nil, err
	}
	var viaLease, raw []time.Duration
	for round := range rounds {
		if err := s.rcExpire(ctx); err != nil {
			return nil, err
		}
		start := time.Now()
		got, err := s.d.Lease.Reclaim(ctx)
		elapsed := time.Since(start)
		if err != nil {
			return nil, err
		}
		if got != n {
			return nil, fmt.Errorf("the lease reclaimer took back %d leases, want %d", got, n)
		}
		viaLease = append(viaLease, elapsed)

		if err := s.rcExpire(ctx); err != nil {
			return nil, err
		}
		start = time.Now()
		rows, err := s.rcRawUpdate(ctx)
		elapsed = time.Since(start)
		if err != nil {
			return nil, fmt.Errorf("raw reclaim: %w", err)
		}
		if rows != int64(n) {
			return nil, fmt.Errorf("the raw UPDATE took back %d leases, want %d", rows, n)
		}
		raw = append(raw, elapsed)
		env.Logf("  %s round %d: reclaimer %s, raw UPDATE %s", backend, round+1,
			viaLease[round].Round(time.Microsecond), raw[round].Round(time.Microsecond))
	}
	lm, rm := rcMedian(viaLease), rcMedian(raw)
	ratio := float64(lm) / float64(rm)
	row := Row{
		Path:     fmt.Sprintf("reclaim of %s expired leases by the lease reclaimer, %s", rdCount(n), backend),
		Figure:   fmt.Sprintf("%s (median of %d passes)", rdMicros(lm), rounds),
		Baseline: fmt.Sprintf("one raw UPDATE: %s (median of %d)", rdMicros(rm), rounds),
		Ratio:    ratio,
		Target:   "≤ 200 ms; ≤ 2× the raw UPDATE",
		Met:      lm <= 200*time.Millisecond && ratio <= 2,
	}
	if !row.Met {
		note := "missed: "
		if lm > 200*time.Millisecond {
			note += "above 200 ms; "
		}
		row.Note = note + fmt.Sprintf("%.2f× the raw UPDATE (see docs/performance/reads.md)", ratio)
	}
	return []Row{row}, nil
}
