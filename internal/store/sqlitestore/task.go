package sqlitestore

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// taskColumns are the tasks columns scanTask reads, in order.
const taskColumns = `task_id, task_type, payload, status, attempts, max_attempts, reclaims, max_reclaims,
	lease_timeout_ms, lease_owner, lease_epoch, lease_expires_at, last_heartbeat_at, started_at,
	run_after, created_at, updated_at, completed_at, result, completed_by, last_error`

// leaseExpiresSQL is the lease expiry for a claim or lease heartbeat at
// @now: the task's own window, or @default_lease_ms when it has none.
var leaseExpiresSQL = sqlAddMS("@now",
	"CASE WHEN lease_timeout_ms > 0 THEN lease_timeout_ms ELSE @default_lease_ms END")

// scanTask converts one tasks row (taskColumns) to a Task. It is the only
// place task rows become vigiltype values.
func scanTask(row rowScanner) (*vigiltype.Task, error) {
	var (
		t                                           vigiltype.Task
		payload, status, runAfter, created, updated string
		leaseTimeoutMS                              int64
		leaseExpires, lastHeartbeat, started, done  sql.Null[string]
		leaseOwner, result, completedBy, lastError  sql.Null[string]
	)
	if err := row.Scan(&t.TaskID, &t.TaskType, &payload, &status, &t.Attempts, &t.MaxAttempts,
		&t.Reclaims, &t.MaxReclaims, &leaseTimeoutMS, &leaseOwner, &t.LeaseEpoch, &leaseExpires,
		&lastHeartbeat, &started, &runAfter, &created, &updated, &done, &result, &completedBy,
		&lastError); err != nil {
		return nil, err
	}
	var tp timeParser
	t.LeaseExpiresAt = tp.nullTime(leaseExpires)
	t.LastHeartbeatAt = tp.nullTime(lastHeartbeat)
	t.StartedAt = tp.nullTime(started)
	t.RunAfter = tp.time(runAfter)
	t.CreatedAt = tp.time(created)
	t.UpdatedAt = tp.time(updated)
	t.CompletedAt = tp.nullTime(done)
	if tp.err != nil {
		return nil, fmt.Errorf("task %d: %w", t.TaskID, tp.err)
	}
	t.Payload = json.RawMessage(payload)
	t.Status = vigiltype.TaskStatus(status)
	t.LeaseTimeoutS = float64(leaseTimeoutMS) / 1000
	t.LeaseOwner = nullPtr(leaseOwner)
	if result.Valid {
		t.Result = json.RawMessage(result.V)
	}
	t.CompletedBy = nullPtr(completedBy)
	t.LastError = nullPtr(lastError)
	return &t, nil
}

// scanTasks reads every row of rows with scanTask and closes rows.
func scanTasks(rows *sql.Rows) ([]*vigiltype.Task, error) {
	defer rows.Close()
	var tasks []*vigiltype.Task
	for rows.Next() {
		t, err := scanTask(rows)
		if err != nil {
			return nil, err
		}
		tasks = append(tasks, t)
	}
	return tasks, rows.Err()
}

// TaskEnqueue implements store.Store. A nil payload is stored as {}; a
// payload that is not valid JSON is refused before anything is written.
func (s *Store) TaskEnqueue(ctx context.Context, p store.TaskEnqueueParams) (*vigiltype.Task, error) {
	payload := p.Payload
	if len(payload) == 0 {
		payload = json.RawMessage("{}")
	}
	if !json.Valid(payload) {
		return nil, vigiltype.Invalid("payload", "must be valid JSON")
	}
	now := timeString(p.Now)
	task, err := scanTask(s.writer.QueryRowContext(ctx, `
		INSERT INTO tasks (task_type, payload, status, max_attempts, max_reclaims,
			lease_timeout_ms, run_after, created_at, updated_at)
		VALUES (@task_type, @payload, 'scheduled', @max_attempts, @max_reclaims,
			@lease_timeout_ms, @run_after, @now, @now)
		RETURNING `+taskColumns,
		sql.Named("task_type", p.TaskType),
		sql.Named("payload", string(payload)),
		sql.Named("max_attempts", p.MaxAttempts),
		sql.Named("max_reclaims", p.MaxReclaims),
		sql.Named("lease_timeout_ms", p.LeaseTimeout.Milliseconds()),
		sql.Named("run_after", timeString(p.RunAfter)),
		sql.Named("now", now),
	))
	if err != nil {
		return nil, fmt.Errorf("enqueue task of type %q: %w", p.TaskType, err)
	}
	return task, nil
}

// TaskGet implements store.Store.
func (s *Store) TaskGet(ctx context.Context, taskID int64) (*vigiltype.Task, error) {
	task, err := scanTask(s.reader.QueryRowContext(ctx,
		`SELECT `+taskColumns+` FROM tasks WHERE task_id = ?`, taskID))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("task %d: %w", taskID, vigiltype.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get task %d: %w", taskID, err)
	}
	return task, nil
}

// TaskList implements store.Store. Limit <= 0 means no limit.
func (s *Store) TaskList(ctx context.Context, p store.TaskListParams) ([]*vigiltype.Task, error) {
	where := []string{"TRUE"}
	args := []any{sql.Named("limit", sqlLimit(p.Limit))}
	if p.Status != "" {
		if !p.Status.Valid() {
			return nil, vigiltype.Invalid("status", "must be scheduled, running, completed or dead_letter")
		}
		where = append(where, "status = @status")
		args = append(args, sql.Named("status", string(p.Status)))
	}
	if p.TaskType != "" {
		where = append(where, "task_type = @task_type")
		args = append(args, sql.Named("task_type", p.TaskType))
	}
	if p.BeforeID != 0 {
		where = append(where, "task_id < @before_id")
		args = append(args, sql.Named("before_id", p.BeforeID))
	}
	rows, err := s.reader.QueryContext(ctx, `
		SELECT `+taskColumns+` FROM tasks
		WHERE `+strings.Join(where, " AND ")+`
		ORDER BY task_id DESC
		LIMIT @limit`, args...)
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	tasks, err := scanTasks(rows)
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	return tasks, nil
}

// TaskClaim implements store.Store. The claimer must exist and be alive at
// Now: ErrNotFound otherwise, or ErrInstanceExited when it exited or is past
// its alive window. Instance check, claim and current-task update are one
// transaction.
func (s *Store) TaskClaim(ctx context.Context, p store.TaskClaimParams) (*vigiltype.Task, error) {
	if len(p.Types) == 0 {
		return nil, vigiltype.Invalid("task_types", "must name at least one type")
	}
	types, err := json.Marshal(p.Types)
	if err != nil {
		return nil, fmt.Errorf("claim task for process %s: %w", p.InstanceID, err)
	}
	now := timeString(p.Now)

	var task *vigiltype.Task
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		var exitedAt sql.Null[string]
		var aliveUntil string
		err := tx.QueryRowContext(ctx,
			`SELECT exited_at, alive_until FROM processes WHERE instance_id = ?`, p.InstanceID).
			Scan(&exitedAt, &aliveUntil)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return vigiltype.ErrNotFound
		case err != nil:
			return err
		case exitedAt.Valid:
			return vigiltype.ErrInstanceExited
		case aliveUntil < now:
			return fmt.Errorf("alive window ended %s: %w", aliveUntil, vigiltype.ErrInstanceStopped)
		}

		task, err = scanTask(tx.QueryRowContext(ctx, `
			UPDATE tasks SET
				status = 'running',
				lease_owner = @instance_id,
				lease_epoch = lease_epoch + 1,
				started_at = @now,
				last_heartbeat_at = @now,
				lease_expires_at = `+leaseExpiresSQL+`,
				updated_at = @now
			WHERE task_id = (
				SELECT task_id FROM tasks
				WHERE status = 'scheduled' AND run_after <= @now
					AND task_type IN (SELECT value FROM json_each(@types))
				ORDER BY run_after, task_id
				LIMIT 1)
			AND status = 'scheduled'
			RETURNING `+taskColumns,
			sql.Named("instance_id", p.InstanceID),
			sql.Named("now", now),
			sql.Named("default_lease_ms", p.LeaseTimeout.Milliseconds()),
			sql.Named("types", string(types)),
		))
		if errors.Is(err, sql.ErrNoRows) {
			task = nil
			return nil
		}
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `
			UPDATE processes SET current_task_id = ?, current_task_type = ? WHERE instance_id = ?`,
			task.TaskID, task.TaskType, p.InstanceID)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claim task for process %s: %w", p.InstanceID, err)
	}
	return task, nil
}

// TaskHeartbeat implements store.Store.
func (s *Store) TaskHeartbeat(ctx context.Context, p store.TaskHeartbeatParams) (*vigiltype.Task, error) {
	return s.leaseUpdate(ctx, "heartbeat", p.TaskLease, false, `
		last_heartbeat_at = @now,
		lease_expires_at = `+leaseExpiresSQL+`,
		updated_at = @now`,
		sql.Named("now", timeString(p.Now)),
		sql.Named("default_lease_ms", p.LeaseTimeout.Milliseconds()),
	)
}

// TaskComplete implements store.Store. A nil Result is stored as NULL; a
// Result that is not valid JSON is refused before anything is written.
func (s *Store) TaskComplete(ctx context.Context, p store.TaskCompleteParams) (*vigiltype.Task, error) {
	var result any // NULL unless given
	if p.Result != nil {
		if !json.Valid(p.Result) {
			return nil, vigiltype.Invalid("result", "must be valid JSON")
		}
		result = string(p.Result)
	}
	return s.leaseUpdate(ctx, "complete", p.TaskLease, true, `
		status = 'completed',
		result = @result,
		completed_by = lease_owner,
		completed_at = @now,
		lease_owner = NULL,
		lease_expires_at = NULL,
		updated_at = @now`,
		sql.Named("now", timeString(p.Now)),
		sql.Named("result", result),
	)
}

// TaskFail implements store.Store. A task going back to scheduled loses its
// started_at; a dead-lettered one keeps it as the start of its last run.
func (s *Store) TaskFail(ctx context.Context, p store.TaskFailParams) (*vigiltype.Task, error) {
	const dead = `attempts + 1 >= max_attempts`
	return s.leaseUpdate(ctx, "fail", p.TaskLease, true, `
		attempts = attempts + 1,
		status = CASE WHEN `+dead+` THEN 'dead_letter' ELSE 'scheduled' END,
		run_after = CASE WHEN `+dead+` THEN run_after ELSE @retry_at END,
		started_at = CASE WHEN `+dead+` THEN started_at ELSE NULL END,
		last_error = @error,
		lease_owner = NULL,
		lease_expires_at = NULL,
		updated_at = @now`,
		sql.Named("now", timeString(p.Now)),
		sql.Named("retry_at", timeString(p.RetryAt)),
		sql.Named("error", p.Error),
	)
}

// TaskRelease implements store.Store.
func (s *Store) TaskRelease(ctx context.Context, p store.TaskReleaseParams) (*vigiltype.Task, error) {
	return s.leaseUpdate(ctx, "release", p.TaskLease, true, `
		status = 'scheduled',
		run_after = @now,
		started_at = NULL,
		lease_owner = NULL,
		lease_expires_at = NULL,
		updated_at = @now`,
		sql.Named("now", timeString(p.Now)),
	)
}

// leaseUpdate applies the SET clause set to the task held under l, guarded
// by the whole lease predicate (id, running, owner, epoch), in one
// transaction that also clears the holder's current task when endsLease.
// args bind set's parameters. A write that matches no row is ErrNotFound
// when the task does not exist, else ErrStaleEpoch; either way nothing
// changed.
func (s *Store) leaseUpdate(ctx context.Context, op string, l store.TaskLease, endsLease bool, set string, args ...any) (*vigiltype.Task, error) {
	args = append(args,
		sql.Named("task_id", l.TaskID),
		sql.Named("lease_owner", l.InstanceID),
		sql.Named("lease_epoch", l.Epoch),
	)
	var task *vigiltype.Task
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		task, err = scanTask(tx.QueryRowContext(ctx, `
			UPDATE tasks SET `+set+`
			WHERE task_id = @task_id AND status = 'running'
				AND lease_owner = @lease_owner AND lease_epoch = @lease_epoch
			RETURNING `+taskColumns, args...))
		if errors.Is(err, sql.ErrNoRows) {
			return taskRefusal(ctx, tx, l.TaskID)
		}
		if err != nil || !endsLease {
			return err
		}
		_, err = tx.ExecContext(ctx, `
			UPDATE processes SET current_task_id = NULL, current_task_type = NULL
			WHERE instance_id = ? AND current_task_id = ?`, l.InstanceID, l.TaskID)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%s task %d: %w", op, l.TaskID, err)
	}
	return task, nil
}

// taskRefusal explains why a lease-guarded write matched no row.
func taskRefusal(ctx context.Context, tx *sql.Tx, taskID int64) error {
	var one int
	err := tx.QueryRowContext(ctx, `SELECT 1 FROM tasks WHERE task_id = ?`, taskID).Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return vigiltype.ErrNotFound
	case err != nil:
		return err
	}
	return vigiltype.ErrStaleEpoch
}

// reclaimableSQL is true for a running task at @now whose lease expired or
// whose holder has stopped (exited, or past its alive window).
const reclaimableSQL = `(status = 'running' AND (lease_expires_at < @now OR ` + holderStoppedSQL + `))`

// holderStoppedSQL is true for a task whose lease owner has stopped at @now.
const holderStoppedSQL = `EXISTS (
	SELECT 1 FROM processes
	WHERE processes.instance_id = tasks.lease_owner
		AND (processes.exited_at IS NOT NULL OR processes.alive_until < @now))`

// reclaimReasonSQL is the reason a reclaimable task is taken back; a
// stopped holder is named first as the root cause.
const reclaimReasonSQL = `CASE WHEN ` + holderStoppedSQL + `
	THEN 'holder ' || lease_owner || ' stopped (exited or missed liveness heartbeats)'
	ELSE 'lease expired: holder ' || lease_owner || ' sent no lease heartbeat before ' || lease_expires_at
	END`

// TaskReclaim implements store.Store. Limit <= 0 means no limit. One UPDATE
// picks and rewrites the tasks, repeating the predicate so only tasks still
// reclaimable at write time change; in the same transaction, every process
// whose current task was reclaimed has it cleared. A task reclaimed back to
// scheduled loses its started_at; a dead-lettered one keeps it. The tasks
// are returned in id order.
func (s *Store) TaskReclaim(ctx context.Context, p store.TaskReclaimParams) ([]*vigiltype.Task, error) {
	const dead = `reclaims + 1 > max_reclaims`
	var tasks []*vigiltype.Task
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `
			UPDATE tasks SET
				reclaims = reclaims + 1,
				status = CASE WHEN `+dead+` THEN 'dead_letter' ELSE 'scheduled' END,
				run_after = CASE WHEN `+dead+` THEN run_after ELSE @now END,
				started_at = CASE WHEN `+dead+` THEN started_at ELSE NULL END,
				last_error = CASE WHEN `+dead+`
					THEN 'dead-lettered: reclaimed ' || (reclaims + 1) || ' times (max_reclaims '
						|| max_reclaims || '): ' || `+reclaimReasonSQL+`
					ELSE `+reclaimReasonSQL+`
					END,
				lease_owner = NULL,
				lease_expires_at = NULL,
				updated_at = @now
			WHERE task_id IN (
				SELECT task_id FROM tasks WHERE `+reclaimableSQL+` ORDER BY task_id LIMIT @limit)
			AND `+reclaimableSQL+`
			RETURNING `+taskColumns,
			sql.Named("now", timeString(p.Now)),
			sql.Named("limit", sqlLimit(p.Limit)),
		)
		if err != nil {
			return err
		}
		if tasks, err = scanTasks(rows); err != nil || len(tasks) == 0 {
			return err
		}
		ids := make([]int64, len(tasks))
		for i, t := range tasks {
			ids[i] = t.TaskID
		}
		idsJSON, err := json.Marshal(ids)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `
			UPDATE processes SET current_task_id = NULL, current_task_type = NULL
			WHERE current_task_id IN (SELECT value FROM json_each(?))`, string(idsJSON))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("reclaim tasks: %w", err)
	}
	slices.SortFunc(tasks, func(a, b *vigiltype.Task) int { return cmp.Compare(a.TaskID, b.TaskID) })
	return tasks, nil
}
