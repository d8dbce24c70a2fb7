package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

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
// arithmetic as vigiltype.AliveWindow: interval × factor × 1000, truncated to
// whole milliseconds.
var aliveUntilSQL = sqlAddMS("@now",
	"CAST(liveness_interval_s * "+strconv.Itoa(vigiltype.AliveWindowFactor)+" * 1000 AS INTEGER)")

// scanProcess converts one processes row (processColumns) to a Process with
// its status computed at now. It is the only place process rows become
// vigiltype values.
func scanProcess(row rowScanner, now time.Time) (*vigiltype.Process, error) {
	var (
		p                          vigiltype.Process
		startedAt, lastHeartbeatAt string
		aliveUntil                 string
		exitedAt, currentTaskType  sql.Null[string]
		currentTaskID              sql.Null[int64]
	)
	if err := row.Scan(&p.InstanceID, &p.ProcessKind, &p.Hostname, &p.PID, &p.LivenessIntervalS,
		&startedAt, &lastHeartbeatAt, &exitedAt, &currentTaskID, &currentTaskType, &aliveUntil); err != nil {
		return nil, err
	}
	var tp timeParser
	p.StartedAt = tp.time(startedAt)
	p.LastHeartbeatAt = tp.time(lastHeartbeatAt)
	p.ExitedAt = tp.nullTime(exitedAt)
	deadline := tp.time(aliveUntil)
	if tp.err != nil {
		return nil, fmt.Errorf("process %s: %w", p.InstanceID, tp.err)
	}
	p.CurrentTaskID = nullPtr(currentTaskID)
	p.CurrentTaskType = nullPtr(currentTaskType)
	p.SetStoredDeadline(deadline, now)
	return &p, nil
}

// ProcessRegister implements store.Store. A duplicate instance_id is an
// error and leaves the existing row as it was.
func (s *Store) ProcessRegister(ctx context.Context, p store.ProcessRegisterParams) (*vigiltype.Process, error) {
	now := utcMS(p.Now)
	row := s.writer.QueryRowContext(ctx, `
		INSERT INTO processes (instance_id, token_hash, process_kind, hostname, pid,
			liveness_interval_s, started_at, last_heartbeat_at, alive_until)
		VALUES (@instance_id, @token_hash, @process_kind, @hostname, @pid,
			@liveness_interval_s, @now, @now, @alive_until)
		RETURNING `+processColumns,
		sql.Named("instance_id", p.InstanceID),
		sql.Named("token_hash", p.TokenHash),
		sql.Named("process_kind", p.ProcessKind),
		sql.Named("hostname", p.Hostname),
		sql.Named("pid", p.PID),
		sql.Named("liveness_interval_s", p.LivenessIntervalS),
		sql.Named("now", timeString(now)),
		sql.Named("alive_until", timeString(now.Add(vigiltype.AliveWindow(p.LivenessIntervalS)))),
	)
	proc, err := scanProcess(row, now)
	if isUniqueViolation(err) {
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
	err := s.readRow(ctx, `SELECT token_hash FROM processes WHERE instance_id = ?`, instanceID).Scan(&stored)
	switch {
	case errors.Is(err, sql.ErrNoRows):
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
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		proc, err = scanProcess(tx.QueryRowContext(ctx, `
			UPDATE processes
			SET last_heartbeat_at = @now, alive_until = `+aliveUntilSQL+`
			WHERE instance_id = @instance_id AND token_hash = @token_hash AND exited_at IS NULL
			RETURNING `+processColumns,
			sql.Named("now", timeString(now)),
			sql.Named("instance_id", p.InstanceID),
			sql.Named("token_hash", p.TokenHash),
		), now)
		if errors.Is(err, sql.ErrNoRows) {
			return processRefusal(ctx, tx, p.InstanceID, p.TokenHash)
		}
		return err
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
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		proc, err = scanProcess(tx.QueryRowContext(ctx, `
			UPDATE processes
			SET exited_at = COALESCE(exited_at, @now), current_task_id = NULL, current_task_type = NULL
			WHERE instance_id = @instance_id AND token_hash = @token_hash
			RETURNING `+processColumns,
			sql.Named("now", timeString(now)),
			sql.Named("instance_id", p.InstanceID),
			sql.Named("token_hash", p.TokenHash),
		), now)
		if errors.Is(err, sql.ErrNoRows) {
			return processRefusal(ctx, tx, p.InstanceID, p.TokenHash)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("mark process %s exited: %w", p.InstanceID, err)
	}
	return proc, nil
}

// processRefusal explains why a write guarded by instance id, token hash
// and "not exited" matched no row: ErrNotFound, ErrInvalidToken (checked
// before exit, so a wrong token learns nothing more), or ErrInstanceExited.
func processRefusal(ctx context.Context, tx *sql.Tx, instanceID, tokenHash string) error {
	var (
		stored   string
		exitedAt sql.Null[string]
	)
	err := tx.QueryRowContext(ctx,
		`SELECT token_hash, exited_at FROM processes WHERE instance_id = ?`, instanceID).Scan(&stored, &exitedAt)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return vigiltype.ErrNotFound
	case err != nil:
		return err
	case stored != tokenHash:
		return vigiltype.ErrInvalidToken
	case exitedAt.Valid:
		return vigiltype.ErrInstanceExited
	}
	return fmt.Errorf("process %s: write matched no row for no known reason", instanceID)
}

// ProcessGet implements store.Store.
func (s *Store) ProcessGet(ctx context.Context, instanceID string, now time.Time) (*vigiltype.Process, error) {
	proc, err := scanProcess(s.reader.QueryRowContext(ctx,
		`SELECT `+processColumns+` FROM processes WHERE instance_id = ?`, instanceID), utcMS(now))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("process %s: %w", instanceID, vigiltype.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get process %s: %w", instanceID, err)
	}
	return proc, nil
}

// ProcessLatest implements store.Store.
func (s *Store) ProcessLatest(ctx context.Context, kind string, now time.Time) (*vigiltype.Process, error) {
	proc, err := scanProcess(s.readRow(ctx, processLatestSQL, kind), utcMS(now))
	if errors.Is(err, sql.ErrNoRows) {
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
	rows, err := s.reader.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	defer rows.Close()
	var procs []*vigiltype.Process
	for rows.Next() {
		proc, err := scanProcess(rows, now)
		if err != nil {
			return nil, fmt.Errorf("list processes: %w", err)
		}
		procs = append(procs, proc)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	return procs, nil
}

// ProcessPrune implements store.Store.
func (s *Store) ProcessPrune(ctx context.Context, p store.ProcessPruneParams) (int64, error) {
	res, err := s.writer.ExecContext(ctx, `
		DELETE FROM processes
		WHERE NOT `+aliveSQL+` AND (last_heartbeat_at < @before OR last_heartbeat_at > @future)
			AND NOT EXISTS (
				SELECT 1 FROM tasks
				WHERE tasks.lease_owner = processes.instance_id AND tasks.status = 'running')`,
		sql.Named("now", timeString(p.Now)),
		sql.Named("before", timeString(p.Before)),
		sql.Named("future", timeString(p.Now.Add(vigiltype.FutureTolerance))),
	)
	if err != nil {
		return 0, fmt.Errorf("prune processes: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("prune processes: %w", err)
	}
	return n, nil
}

// ProcessCounts implements store.Store.
func (s *Store) ProcessCounts(ctx context.Context, now time.Time) ([]store.ProcessCount, error) {
	rows, err := s.reader.QueryContext(ctx, `
		SELECT process_kind, CASE WHEN `+aliveSQL+` THEN 'alive' ELSE 'stopped' END AS status, count(*)
		FROM processes
		GROUP BY process_kind, status
		ORDER BY process_kind, status`,
		sql.Named("now", timeString(now)))
	if err != nil {
		return nil, fmt.Errorf("count processes: %w", err)
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
	return out, rows.Err()
}
