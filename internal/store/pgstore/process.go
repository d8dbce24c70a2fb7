package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// processColumns are the processes columns scanProcess reads, in order.
const processColumns = `instance_id, process_kind, hostname, pid, liveness_interval_s,
	started_at, last_heartbeat_at, exited_at, current_task_id, current_task_type, alive_until`

// aliveSQL is true for a processes row that is alive at @now; its negation
// is stopped. It agrees with vigiltype.Process.ComputeStatus because
// alive_until is always last_heartbeat_at + vigiltype.AliveWindow(interval).
const aliveSQL = `(exited_at IS NULL AND alive_until >= @now)`

// aliveUntilSQL recomputes alive_until for a heartbeat at @now with the same
// arithmetic as vigiltype.AliveWindow: interval × factor × 1000 in double
// precision, truncated to whole milliseconds.
var aliveUntilSQL = sqlAddMS("@now",
	"trunc(liveness_interval_s * "+strconv.Itoa(vigiltype.AliveWindowFactor)+" * 1000)::bigint")

// scanProcess converts one processes row (processColumns) to a Process with
// its status computed at now. It is the only place process rows become
// vigiltype values.
func scanProcess(row rowScanner, now time.Time) (*vigiltype.Process, error) {
	var p vigiltype.Process
	var aliveUntil time.Time
	if err := row.Scan(&p.InstanceID, &p.ProcessKind, &p.Hostname, &p.PID, &p.LivenessIntervalS,
		&p.StartedAt, &p.LastHeartbeatAt, &p.ExitedAt, &p.CurrentTaskID, &p.CurrentTaskType, &aliveUntil); err != nil {
		return nil, err
	}
	p.StartedAt = p.StartedAt.UTC()
	p.LastHeartbeatAt = p.LastHeartbeatAt.UTC()
	p.ExitedAt = utcPtr(p.ExitedAt)
	p.SetStoredDeadline(aliveUntil.UTC(), now)
	return &p, nil
}

// ProcessRegister implements store.Store. A duplicate instance_id is an
// error and leaves the existing row as it was.
func (s *Store) ProcessRegister(ctx context.Context, p store.ProcessRegisterParams) (*vigiltype.Process, error) {
	now := utcMS(p.Now)
	proc, err := scanProcess(s.pool.QueryRow(ctx, `
		INSERT INTO processes (instance_id, token_hash, process_kind, hostname, pid,
			liveness_interval_s, started_at, last_heartbeat_at, alive_until)
		VALUES (@instance_id, @token_hash, @process_kind, @hostname, @pid,
			@liveness_interval_s, @now, @now, @alive_until)
		RETURNING `+processColumns,
		pgx.StrictNamedArgs{
			"instance_id":         p.InstanceID,
			"token_hash":          p.TokenHash,
			"process_kind":        p.ProcessKind,
			"hostname":            p.Hostname,
			"pid":                 p.PID,
			"liveness_interval_s": p.LivenessIntervalS,
			"now":                 now,
			"alive_until":         now.Add(vigiltype.AliveWindow(p.LivenessIntervalS)),
		}), now)
	err = interpretError(err)
	if errors.Is(err, errAlreadyExists) {
		return nil, fmt.Errorf("register process %s: instance_id already exists", p.InstanceID)
	}
	if err != nil {
		return nil, fmt.Errorf("register process %s: %w", p.InstanceID, err)
	}
	return proc, nil
}

// ProcessCheckToken implements store.Store.
func (s *Store) ProcessCheckToken(ctx context.Context, instanceID, tokenHash string) error {
	var stored string
	err := interpretError(s.pool.QueryRow(ctx,
		`SELECT token_hash FROM processes WHERE instance_id = $1`, instanceID).Scan(&stored))
	switch {
	case errors.Is(err, vigiltype.ErrNotFound):
		return fmt.Errorf("process %s: %w", instanceID, vigiltype.ErrNotFound)
	case err != nil:
		return fmt.Errorf("check token of process %s: %w", instanceID, err)
	case stored != tokenHash:
		return fmt.Errorf("process %s: %w", instanceID, vigiltype.ErrInvalidToken)
	}
	return nil
}

// ProcessHeartbeat implements store.Store.
func (s *Store) ProcessHeartbeat(ctx context.Context, p store.ProcessHeartbeatParams) (*vigiltype.Process, error) {
	now := utcMS(p.Now)
	var proc *vigiltype.Process
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		proc, err = scanProcess(tx.QueryRow(ctx, `
			UPDATE processes
			SET last_heartbeat_at = @now, alive_until = `+aliveUntilSQL+`
			WHERE instance_id = @instance_id AND token_hash = @token_hash AND exited_at IS NULL
			RETURNING `+processColumns,
			pgx.StrictNamedArgs{"now": now, "instance_id": p.InstanceID, "token_hash": p.TokenHash},
		), now)
		if errors.Is(err, pgx.ErrNoRows) {
			return processRefusal(ctx, tx, p.InstanceID, p.TokenHash)
		}
		return interpretError(err)
	})
	if err != nil {
		return nil, fmt.Errorf("heartbeat process %s: %w", p.InstanceID, err)
	}
	return proc, nil
}

// ProcessMarkExited implements store.Store. The first exit time is kept
// when the instance is marked again.
func (s *Store) ProcessMarkExited(ctx context.Context, p store.ProcessMarkExitedParams) (*vigiltype.Process, error) {
	now := utcMS(p.Now)
	var proc *vigiltype.Process
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		proc, err = scanProcess(tx.QueryRow(ctx, `
			UPDATE processes
			SET exited_at = COALESCE(exited_at, @now), current_task_id = NULL, current_task_type = NULL
			WHERE instance_id = @instance_id AND token_hash = @token_hash
			RETURNING `+processColumns,
			pgx.StrictNamedArgs{"now": now, "instance_id": p.InstanceID, "token_hash": p.TokenHash},
		), now)
		if errors.Is(err, pgx.ErrNoRows) {
			return processRefusal(ctx, tx, p.InstanceID, p.TokenHash)
		}
		return interpretError(err)
	})
	if err != nil {
		return nil, fmt.Errorf("mark process %s exited: %w", p.InstanceID, err)
	}
	return proc, nil
}

// processRefusal explains why a write guarded by instance id, token hash
// and "not exited" matched no row: ErrNotFound, ErrInvalidToken (checked
// before exit, so a wrong token learns nothing more), or ErrInstanceExited.
func processRefusal(ctx context.Context, tx pgx.Tx, instanceID, tokenHash string) error {
	var (
		stored   string
		exitedAt *time.Time
	)
	err := interpretError(tx.QueryRow(ctx,
		`SELECT token_hash, exited_at FROM processes WHERE instance_id = $1`, instanceID).Scan(&stored, &exitedAt))
	switch {
	case err != nil: // ErrNotFound included
		return err
	case stored != tokenHash:
		return vigiltype.ErrInvalidToken
	case exitedAt != nil:
		return vigiltype.ErrInstanceExited
	}
	return fmt.Errorf("process %s: write matched no row for no known reason", instanceID)
}

// ProcessGet implements store.Store.
func (s *Store) ProcessGet(ctx context.Context, instanceID string, now time.Time) (*vigiltype.Process, error) {
	proc, err := scanProcess(s.pool.QueryRow(ctx,
		`SELECT `+processColumns+` FROM processes WHERE instance_id = $1`, instanceID), utcMS(now))
	err = interpretError(err)
	if errors.Is(err, vigiltype.ErrNotFound) {
		return nil, fmt.Errorf("process %s: %w", instanceID, vigiltype.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get process %s: %w", instanceID, err)
	}
	return proc, nil
}

// ProcessLatest implements store.Store.
func (s *Store) ProcessLatest(ctx context.Context, kind string, now time.Time) (*vigiltype.Process, error) {
	proc, err := scanProcess(s.pool.QueryRow(ctx, processLatestSQL, processReadMode, kind), utcMS(now))
	err = interpretError(err)
	if errors.Is(err, vigiltype.ErrNotFound) {
		return nil, fmt.Errorf("process kind %q: %w", kind, vigiltype.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("latest process of kind %q: %w", kind, err)
	}
	return proc, nil
}

// ProcessList implements store.Store. Limit <= 0 means no limit.
func (s *Store) ProcessList(ctx context.Context, p store.ProcessListParams) ([]*vigiltype.Process, error) {
	now := utcMS(p.Now)
	query, args, err := processListQuery(p)
	if err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, query, processReadMode, args)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", interpretError(err))
	}
	procs, err := pgx.AppendRows([]*vigiltype.Process(nil), rows, func(row pgx.CollectableRow) (*vigiltype.Process, error) {
		return scanProcess(row, now)
	})
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", interpretError(err))
	}
	return procs, nil
}

// ProcessPrune implements store.Store.
func (s *Store) ProcessPrune(ctx context.Context, p store.ProcessPruneParams) (int64, error) {
	tag, err := s.pool.Exec(ctx, `
		DELETE FROM processes
		WHERE NOT `+aliveSQL+` AND (last_heartbeat_at < @before OR last_heartbeat_at > @future)
			AND NOT EXISTS (
				SELECT 1 FROM tasks
				WHERE tasks.lease_owner = processes.instance_id AND tasks.status = 'running')`,
		pgx.StrictNamedArgs{"now": utcMS(p.Now), "before": utcMS(p.Before), "future": utcMS(p.Now.Add(vigiltype.FutureTolerance))},
	)
	if err != nil {
		return 0, fmt.Errorf("prune processes: %w", interpretError(err))
	}
	return tag.RowsAffected(), nil
}

// ProcessCounts implements store.Store.
func (s *Store) ProcessCounts(ctx context.Context, now time.Time) ([]store.ProcessCount, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT process_kind, CASE WHEN `+aliveSQL+` THEN 'alive' ELSE 'stopped' END AS status, count(*)
		FROM processes
		GROUP BY 1, 2
		ORDER BY 1, 2`,
		pgx.StrictNamedArgs{"now": utcMS(now)})
	if err != nil {
		return nil, fmt.Errorf("count processes: %w", interpretError(err))
	}
	defer rows.Close()
	var out []store.ProcessCount
	for rows.Next() {
		var c store.ProcessCount
		var status string
		if err := rows.Scan(&c.Kind, &status, &c.Count); err != nil {
			return nil, fmt.Errorf("count processes: %w", err)
		}
		c.Status = vigiltype.ProcessStatus(status)
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count processes: %w", interpretError(err))
	}
	return out, nil
}
