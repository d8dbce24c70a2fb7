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
	lease_timeout_ms, lease_owner, lease_epoch, lease_expires_at, last_heartbeat_at, last_activity_at,
	heartbeat_schema_version, started_at, run_after, created_at, updated_at, completed_at, result,
	completed_by, last_error`

// leaseWindowSQL is a task's lease window in milliseconds: its own, or
// @default_lease_ms when it has none.
const leaseWindowSQL = "CASE WHEN lease_timeout_ms > 0 THEN lease_timeout_ms ELSE @default_lease_ms END"

// leaseExpiresSQL is the lease expiry for a claim or lease heartbeat at
// @now: @now plus the task's window.
var leaseExpiresSQL = sqlAddMS("@now", leaseWindowSQL)

// claimSetSQL is the SET clause of a claim at @now by @instance_id
// (store.Store.TaskClaim). heartbeat_schema_version is left as it is: it
// tells which schema the task's last lease heartbeat used. failed_by names
// who failed the task at its current epoch, so the new epoch clears it.
var claimSetSQL = `
	status = 'running',
	lease_owner = @instance_id,
	lease_epoch = lease_epoch + 1,
	failed_by = NULL,
	started_at = @now,
	last_heartbeat_at = @now,
	last_activity_at = @now,
	lease_expires_at = ` + leaseExpiresSQL + `,
	updated_at = @now`

// scanTask converts one tasks row (taskColumns) to a Task. It is the only
// place task rows become vigiltype values.
func scanTask(row rowScanner) (*vigiltype.Task, error) {
	var (
		t                                           vigiltype.Task
		payload, status, runAfter, created, updated string
		leaseTimeoutMS                              int64
		leaseExpires, lastHeartbeat, lastActivity   sql.Null[string]
		started, done                               sql.Null[string]
		leaseOwner, result, completedBy, lastError  sql.Null[string]
	)
	if err := row.Scan(&t.TaskID, &t.TaskType, &payload, &status, &t.Attempts, &t.MaxAttempts,
		&t.Reclaims, &t.MaxReclaims, &leaseTimeoutMS, &leaseOwner, &t.LeaseEpoch, &leaseExpires,
		&lastHeartbeat, &lastActivity, &t.HeartbeatSchemaVersion, &started, &runAfter, &created,
		&updated, &done, &result, &completedBy, &lastError); err != nil {
		return nil, err
	}
	var tp timeParser
	t.LeaseExpiresAt = tp.nullTime(leaseExpires)
	t.LastHeartbeatAt = tp.nullTime(lastHeartbeat)
	t.LastActivityAt = tp.nullTime(lastActivity)
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
// transaction. A claim by TaskID writes only when the task is still
// scheduled and due; otherwise it explains why (claimRefusal).
func (s *Store) TaskClaim(ctx context.Context, p store.TaskClaimParams) (*vigiltype.Task, error) {
	if p.TaskID == 0 && len(p.Types) == 0 {
		return nil, vigiltype.Invalid("task_types", "must name at least one type")
	}
	now := timeString(p.Now)
	args := []any{
		sql.Named("instance_id", p.InstanceID),
		sql.Named("now", now),
		sql.Named("default_lease_ms", p.LeaseTimeout.Milliseconds()),
	}
	// pick selects the task to claim; the UPDATE repeats status = 'scheduled'.
	var pick string
	if p.TaskID != 0 {
		pick = `@task_id AND status = 'scheduled' AND run_after <= @now`
		args = append(args, sql.Named("task_id", p.TaskID))
	} else {
		sel, typeArgs, err := claimPickSQL(p.Types)
		if err != nil {
			return nil, fmt.Errorf("claim task for process %s: %w", p.InstanceID, err)
		}
		pick = sel + ` AND status = 'scheduled'`
		args = append(args, typeArgs...)
	}

	claimSQL := `
			UPDATE tasks SET ` + claimSetSQL + `
			WHERE task_id = ` + pick + `
			RETURNING ` + taskColumns
	stmts := s.writerStmts(ctx, claimerSQL, claimSQL, currentSQL)
	var task *vigiltype.Task
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		err := checkClaimer(ctx, tx, stmts, p.InstanceID, now)
		if err != nil {
			return err
		}

		task, err = scanTask(stmts.queryRow(ctx, tx, claimSQL, args...))
		switch {
		case errors.Is(err, sql.ErrNoRows) && p.TaskID != 0:
			return claimRefusal(ctx, tx, p.TaskID)
		case errors.Is(err, sql.ErrNoRows):
			task = nil
			return nil
		case err != nil:
			return err
		}
		_, err = stmts.exec(ctx, tx, currentSQL, task.TaskID, task.TaskType, p.InstanceID)
		return err
	})
	if err != nil {
		if p.TaskID != 0 {
			return nil, fmt.Errorf("claim task %d for process %s: %w", p.TaskID, p.InstanceID, err)
		}
		return nil, fmt.Errorf("claim task for process %s: %w", p.InstanceID, err)
	}
	return task, nil
}

// claimRefusal explains why a claim by id matched no row: ErrNotFound when
// the task does not exist, else ErrNotClaimable with its status or the
// run_after it waits for.
func claimRefusal(ctx context.Context, tx *sql.Tx, taskID int64) error {
	var status, runAfter string
	err := tx.QueryRowContext(ctx, `SELECT status, run_after FROM tasks WHERE task_id = ?`, taskID).
		Scan(&status, &runAfter)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("task %d: %w", taskID, vigiltype.ErrNotFound)
	case err != nil:
		return err
	case status != string(vigiltype.TaskScheduled):
		return fmt.Errorf("task %d is %s: %w", taskID, status, vigiltype.ErrNotClaimable)
	}
	return fmt.Errorf("task %d runs after %s: %w", taskID, runAfter, vigiltype.ErrNotClaimable)
}

// TaskHeartbeat implements store.Store. The heartbeat is checked first
// (checkHeartbeat) and nothing is written when it is refused. An ActivityAt
// later than Now counts as Now; last_activity_at never moves backwards, so
// an ActivityAt older than the stored value (or than the claim) leaves it as
// it is, and an activity-gated lease expires at the stored value plus the
// window: a late, older heartbeat never shortens a lease. The heartbeat is
// counted in heartbeat_versions in the same transaction, and only when the
// lease was renewed.
func (s *Store) TaskHeartbeat(ctx context.Context, p store.TaskHeartbeatParams) (*vigiltype.Task, error) {
	if err := checkHeartbeat(p); err != nil {
		return nil, err
	}
	now := timeString(p.Now)
	set := `
		last_heartbeat_at = @now,
		heartbeat_schema_version = @schema_version,
		updated_at = @now,`
	args := []any{
		sql.Named("now", now),
		sql.Named("default_lease_ms", p.LeaseTimeout.Milliseconds()),
		sql.Named("schema_version", p.SchemaVersion),
	}
	switch {
	case p.ActivityAt == nil && p.KeepExpiry:
		set = strings.TrimSuffix(set, ",") // a v1 heartbeat under activity-only: the lease keeps its expiry
	case p.ActivityAt == nil:
		set += `
		lease_expires_at = ` + leaseExpiresSQL
	default:
		// The new last_activity_at; SET expressions all read the old row.
		// started_at stands in for a last_activity_at that a claim before
		// migration 002 left NULL.
		const lastActivity = `max(coalesce(last_activity_at, started_at, @activity_at), @activity_at)`
		base := "@now"
		if p.ExpireOnActivity {
			base = lastActivity
		}
		set += `
		last_activity_at = ` + lastActivity + `,
		lease_expires_at = ` + sqlAddMS(base, leaseWindowSQL)
		activityAt := utcMS(*p.ActivityAt)
		if activityAt.After(utcMS(p.Now)) {
			activityAt = utcMS(p.Now)
		}
		args = append(args, sql.Named("activity_at", timeString(activityAt)))
	}
	count := func(ctx context.Context, tx *sql.Tx, _ txStmts, l store.TaskLease) error {
		return countHeartbeat(ctx, tx, l.InstanceID, p.SchemaVersion, now)
	}
	return s.leaseUpdate(ctx, "heartbeat", p.TaskLease, count, nil, set, args...)
}

// checkHeartbeat refuses a lease heartbeat whose schema version and
// activity time disagree (DESIGN T4): SchemaVersion 1 (no ActivityAt) or 2
// (with ActivityAt). ExpireOnActivity is the server's `activity` expiry
// policy, which applies to v2 heartbeats only: a v1 lease keeps expiring
// on Now + window.
func checkHeartbeat(p store.TaskHeartbeatParams) error {
	switch {
	case p.SchemaVersion != 1 && p.SchemaVersion != 2:
		return vigiltype.Invalid("schema_version", "must be 1 or 2")
	case p.SchemaVersion == 1 && p.ActivityAt != nil:
		return vigiltype.Invalid("activity_at", "is only accepted with schema_version 2")
	case p.SchemaVersion == 2 && p.ActivityAt == nil:
		return vigiltype.Invalid("activity_at", "is required with schema_version 2")
	case p.KeepExpiry && p.ActivityAt != nil:
		return vigiltype.Invalid("schema_version", "a heartbeat that keeps its lease's expiry must be v1")
	}
	return nil
}

// completeSetSQL is what a complete writes, single (TaskComplete) or in a
// batch (TaskCompleteBatch).
const completeSetSQL = `
		status = 'completed',
		result = @result,
		completed_by = lease_owner,
		completed_at = @now,
		lease_owner = NULL,
		lease_expires_at = NULL,
		updated_at = @now`

// TaskComplete implements store.Store. A nil Result is stored as NULL; a
// Result that is not valid JSON is refused before anything is written. A
// complete that repeats the one its lease ended with answers with the task
// as stored (repeatedComplete).
func (s *Store) TaskComplete(ctx context.Context, p store.TaskCompleteParams) (*vigiltype.Task, error) {
	var result any // NULL unless given
	if p.Result != nil {
		if !json.Valid(p.Result) {
			return nil, vigiltype.Invalid("result", "must be valid JSON")
		}
		result = string(p.Result)
	}
	return s.leaseUpdate(ctx, "complete", p.TaskLease, endLease, repeatedComplete(p.Result), completeSetSQL,
		sql.Named("now", timeString(p.Now)),
		sql.Named("result", result),
	)
}

// TaskFail implements store.Store. A task going back to scheduled loses its
// started_at; a dead-lettered one keeps it as the start of its last run.
// failed_by keeps the holder, so that a fail that repeats this one answers
// with the task as stored (repeatedFail) and counts nothing twice.
func (s *Store) TaskFail(ctx context.Context, p store.TaskFailParams) (*vigiltype.Task, error) {
	const dead = `attempts + 1 >= max_attempts`
	return s.leaseUpdate(ctx, "fail", p.TaskLease, endLease, repeatedFail(p.Error), `
		attempts = attempts + 1,
		failed_by = lease_owner,
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
	return s.leaseUpdate(ctx, "release", p.TaskLease, endLease, nil, `
		status = 'scheduled',
		run_after = @now,
		started_at = NULL,
		lease_owner = NULL,
		lease_expires_at = NULL,
		updated_at = @now`,
		sql.Named("now", timeString(p.Now)),
	)
}

// leaseThen is more work in a lease write's transaction, done after the
// task row was written under lease l. stmts holds the writer's prepared
// statements for the queries leaseThenSQL names.
type leaseThen func(ctx context.Context, tx *sql.Tx, stmts txStmts, l store.TaskLease) error

// endLeaseSQL clears the holder's current task when its lease ends.
const endLeaseSQL = `
		UPDATE processes SET current_task_id = NULL, current_task_type = NULL
		WHERE instance_id = ? AND current_task_id = ?`

// endLease clears the holder's current task when its lease ends.
func endLease(ctx context.Context, tx *sql.Tx, stmts txStmts, l store.TaskLease) error {
	_, err := stmts.exec(ctx, tx, endLeaseSQL, l.InstanceID, l.TaskID)
	return err
}

// repeatCheck decides, in a lease write's transaction, a write under l that
// matched no row: the task as stored when the write repeats the one its
// lease ended with (DESIGN T8), else why it is refused.
type repeatCheck func(ctx context.Context, tx *sql.Tx, l store.TaskLease) (*vigiltype.Task, error)

// repeatedComplete is TaskComplete's repeatCheck (store.RepeatedComplete).
func repeatedComplete(result json.RawMessage) repeatCheck {
	return func(ctx context.Context, tx *sql.Tx, l store.TaskLease) (*vigiltype.Task, error) {
		t, _, err := outcomeRow(ctx, tx, l.TaskID)
		if err != nil {
			return nil, err
		}
		if err := store.RepeatedComplete(t, l, result); err != nil {
			return nil, err
		}
		return t, nil
	}
}

// repeatedFail is TaskFail's repeatCheck (store.RepeatedFail).
func repeatedFail(msg string) repeatCheck {
	return func(ctx context.Context, tx *sql.Tx, l store.TaskLease) (*vigiltype.Task, error) {
		t, failedBy, err := outcomeRow(ctx, tx, l.TaskID)
		if err != nil {
			return nil, err
		}
		if err := store.RepeatedFail(t, failedBy, l, msg); err != nil {
			return nil, err
		}
		return t, nil
	}
}

// outcomeRow reads a task and who failed it at its current epoch;
// ErrNotFound when there is no such task.
func outcomeRow(ctx context.Context, tx *sql.Tx, taskID int64) (*vigiltype.Task, *string, error) {
	var failedBy sql.Null[string]
	t, err := scanTask(scanAlso{tx.QueryRowContext(ctx,
		`SELECT `+taskColumns+`, failed_by FROM tasks WHERE task_id = ?`, taskID), []any{&failedBy}})
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil, vigiltype.ErrNotFound
	}
	if err != nil {
		return nil, nil, err
	}
	return t, nullPtr(failedBy), nil
}

// scanAlso scans its row into the destinations given and then into also:
// scanTask reading a row with columns after taskColumns.
type scanAlso struct {
	row  rowScanner
	also []any
}

func (s scanAlso) Scan(dest ...any) error { return s.row.Scan(append(dest, s.also...)...) }

// leaseUpdate applies the SET clause set to the task held under l, guarded
// by the whole lease predicate (id, running, owner, epoch), in one
// transaction that then runs then. args bind set's parameters. A write that
// matches no row is ErrNotFound when the task does not exist, else repeat's
// verdict (nil: ErrStaleEpoch); either way nothing changed and then does
// not run.
func (s *Store) leaseUpdate(ctx context.Context, op string, l store.TaskLease, then leaseThen, repeat repeatCheck, set string, args ...any) (*vigiltype.Task, error) {
	args = append(args,
		sql.Named("task_id", l.TaskID),
		sql.Named("lease_owner", l.InstanceID),
		sql.Named("lease_epoch", l.Epoch),
	)
	updateSQL := `
			UPDATE tasks SET ` + set + `
			WHERE task_id = @task_id AND status = 'running'
				AND lease_owner = @lease_owner AND lease_epoch = @lease_epoch
			RETURNING ` + taskColumns
	stmts := s.writerStmts(ctx, updateSQL, endLeaseSQL)
	var task *vigiltype.Task
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		task, err = scanTask(stmts.queryRow(ctx, tx, updateSQL, args...))
		if errors.Is(err, sql.ErrNoRows) && repeat != nil {
			task, err = repeat(ctx, tx, l)
			return err
		}
		if errors.Is(err, sql.ErrNoRows) {
			return taskRefusal(ctx, tx, l.TaskID)
		}
		if err != nil {
			return err
		}
		return then(ctx, tx, stmts, l)
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
	ELSE 'lease expired at ' || lease_expires_at || ': holder ' || lease_owner
		|| ' last renewed it at ' || last_heartbeat_at
		|| CASE WHEN heartbeat_schema_version = 2 AND last_activity_at IS NOT NULL
			THEN ', last reported activity at ' || last_activity_at ELSE '' END
	END`

// TaskReclaim implements store.Store. Limit <= 0 means no limit. One UPDATE
// picks and rewrites the tasks, repeating the predicate so only tasks still
// reclaimable at write time change; in the same transaction, every process
// whose current task was reclaimed has it cleared. A task reclaimed back to
// scheduled loses its started_at; a dead-lettered one keeps it. The tasks
// are returned in id order. A pass picks them in lease expiry order, the
// order of tasks_reclaim_idx, so it reads the running tasks only until it
// has Limit of them instead of sorting every one (issue #6).
func (s *Store) TaskReclaim(ctx context.Context, p store.TaskReclaimParams) ([]*vigiltype.Task, error) {
	const dead = `reclaims + 1 > max_reclaims`
	var tasks []*vigiltype.Task
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if p.Pulse != nil {
			pulse := *p.Pulse
			pulse.Now = p.Now
			if _, err := pulseTx(ctx, tx, pulse); err != nil {
				return fmt.Errorf("pulse: %w", err)
			}
		}
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
				SELECT task_id FROM tasks WHERE `+reclaimableSQL+` ORDER BY lease_expires_at, task_id LIMIT @limit)
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

// TaskListStalled implements store.Store. Limit <= 0 means no limit. The
// holder's kind is read through tasks.lease_owner; a task whose holder row
// is gone (pruned) is not listed.
func (s *Store) TaskListStalled(ctx context.Context, p store.TaskListStalledParams) ([]*vigiltype.Task, error) {
	rows, err := s.reader.QueryContext(ctx, `
		SELECT `+taskColumns+` FROM tasks
		WHERE tasks.status = 'running' AND tasks.started_at < @started_before
			AND EXISTS (
				SELECT 1 FROM processes
				WHERE processes.instance_id = tasks.lease_owner AND processes.process_kind = @kind)
		ORDER BY tasks.started_at, tasks.task_id
		LIMIT @limit`,
		sql.Named("kind", p.Kind),
		sql.Named("started_before", timeString(p.StartedBefore)),
		sql.Named("limit", sqlLimit(p.Limit)),
	)
	if err != nil {
		return nil, fmt.Errorf("list stalled tasks of %q: %w", p.Kind, err)
	}
	tasks, err := scanTasks(rows)
	if err != nil {
		return nil, fmt.Errorf("list stalled tasks of %q: %w", p.Kind, err)
	}
	return tasks, nil
}

// TaskReclaimStalled implements store.Store. One UPDATE guarded by task id,
// status running and epoch takes the task back under TaskReclaim's rules
// (reclaims + 1, dead_letter past max_reclaims keeping run_after and
// started_at); in the same transaction every process whose current task it
// was has it cleared. A write that matches no row is ErrNotFound when the
// task does not exist, else ErrStaleEpoch, and changes nothing.
func (s *Store) TaskReclaimStalled(ctx context.Context, p store.TaskReclaimStalledParams) (*vigiltype.Task, error) {
	const dead = `reclaims + 1 > max_reclaims`
	var task *vigiltype.Task
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		task, err = scanTask(tx.QueryRowContext(ctx, `
			UPDATE tasks SET
				reclaims = reclaims + 1,
				status = CASE WHEN `+dead+` THEN 'dead_letter' ELSE 'scheduled' END,
				run_after = CASE WHEN `+dead+` THEN run_after ELSE @now END,
				started_at = CASE WHEN `+dead+` THEN started_at ELSE NULL END,
				last_error = CASE WHEN `+dead+`
					THEN 'dead-lettered: reclaimed ' || (reclaims + 1) || ' times (max_reclaims '
						|| max_reclaims || '): ' || @reason
					ELSE @reason
					END,
				lease_owner = NULL,
				lease_expires_at = NULL,
				updated_at = @now
			WHERE task_id = @task_id AND status = 'running' AND lease_epoch = @lease_epoch
			RETURNING `+taskColumns,
			sql.Named("now", timeString(p.Now)),
			sql.Named("reason", p.Reason),
			sql.Named("task_id", p.TaskID),
			sql.Named("lease_epoch", p.Epoch),
		))
		if errors.Is(err, sql.ErrNoRows) {
			return taskRefusal(ctx, tx, p.TaskID)
		}
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `
			UPDATE processes SET current_task_id = NULL, current_task_type = NULL
			WHERE current_task_id = ?`, p.TaskID)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("reclaim stalled task %d: %w", p.TaskID, err)
	}
	return task, nil
}

// The claiming instance's reads and writes, shared by TaskClaim and
// TaskClaimBatch: its liveness, and the task it took last (DESIGN L6).
const (
	claimerSQL = `SELECT exited_at, alive_until FROM processes WHERE instance_id = ?`
	currentSQL = `UPDATE processes SET current_task_id = ?, current_task_type = ? WHERE instance_id = ?`
)

// checkClaimer refuses a claim by an instance that is unknown (ErrNotFound),
// has exited (ErrInstanceExited) or is past its alive window at now
// (ErrInstanceStopped).
func checkClaimer(ctx context.Context, tx *sql.Tx, stmts txStmts, instanceID, now string) error {
	var exitedAt sql.Null[string]
	var aliveUntil string
	err := stmts.queryRow(ctx, tx, claimerSQL, instanceID).Scan(&exitedAt, &aliveUntil)
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
	return nil
}
