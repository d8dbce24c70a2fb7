package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// taskColumns are the tasks columns scanTask reads, in order. The JSON
// columns are read as text: pgx would otherwise read a JSON null as a nil
// pointer, which would make a null result look like no result.
const taskColumns = `task_id, task_type, payload::text AS payload, status, attempts, max_attempts,
	reclaims, max_reclaims, lease_timeout_ms, lease_owner, lease_epoch, lease_expires_at,
	last_heartbeat_at, last_activity_at, heartbeat_schema_version, started_at, run_after,
	created_at, updated_at, completed_at, result::text AS result, completed_by, last_error`

// leaseWindowSQL is a task's lease window in milliseconds: its own, or
// @default_lease_ms when it has none.
const leaseWindowSQL = "CASE WHEN lease_timeout_ms > 0 THEN lease_timeout_ms ELSE @default_lease_ms::bigint END"

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
		t              vigiltype.Task
		payload        string
		status         string
		leaseTimeoutMS int64
		result         *string
	)
	if err := row.Scan(&t.TaskID, &t.TaskType, &payload, &status, &t.Attempts, &t.MaxAttempts,
		&t.Reclaims, &t.MaxReclaims, &leaseTimeoutMS, &t.LeaseOwner, &t.LeaseEpoch, &t.LeaseExpiresAt,
		&t.LastHeartbeatAt, &t.LastActivityAt, &t.HeartbeatSchemaVersion, &t.StartedAt, &t.RunAfter,
		&t.CreatedAt, &t.UpdatedAt, &t.CompletedAt, &result, &t.CompletedBy, &t.LastError); err != nil {
		return nil, err
	}
	t.LeaseExpiresAt = utcPtr(t.LeaseExpiresAt)
	t.LastHeartbeatAt = utcPtr(t.LastHeartbeatAt)
	t.LastActivityAt = utcPtr(t.LastActivityAt)
	t.StartedAt = utcPtr(t.StartedAt)
	t.RunAfter = t.RunAfter.UTC()
	t.CreatedAt = t.CreatedAt.UTC()
	t.UpdatedAt = t.UpdatedAt.UTC()
	t.CompletedAt = utcPtr(t.CompletedAt)
	t.Payload = json.RawMessage(payload)
	t.Status = vigiltype.TaskStatus(status)
	t.LeaseTimeoutS = float64(leaseTimeoutMS) / 1000
	if result != nil {
		t.Result = json.RawMessage(*result)
	}
	return &t, nil
}

// scanTasks reads every row of rows with scanTask and closes rows; no rows
// is a nil slice.
func scanTasks(rows pgx.Rows) ([]*vigiltype.Task, error) {
	return pgx.AppendRows([]*vigiltype.Task(nil), rows, func(row pgx.CollectableRow) (*vigiltype.Task, error) {
		return scanTask(row)
	})
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
	task, err := scanTask(s.pool.QueryRow(ctx, `
		INSERT INTO tasks (task_type, payload, status, max_attempts, max_reclaims,
			lease_timeout_ms, run_after, created_at, updated_at)
		VALUES (@task_type, @payload, 'scheduled', @max_attempts, @max_reclaims,
			@lease_timeout_ms, @run_after, @now, @now)
		RETURNING `+taskColumns,
		pgx.StrictNamedArgs{
			"task_type":        p.TaskType,
			"payload":          string(payload),
			"max_attempts":     p.MaxAttempts,
			"max_reclaims":     p.MaxReclaims,
			"lease_timeout_ms": p.LeaseTimeout.Milliseconds(),
			"run_after":        utcMS(p.RunAfter),
			"now":              utcMS(p.Now),
		}))
	if err != nil {
		return nil, fmt.Errorf("enqueue task of type %q: %w", p.TaskType, interpretError(err))
	}
	return task, nil
}

// TaskGet implements store.Store.
func (s *Store) TaskGet(ctx context.Context, taskID int64) (*vigiltype.Task, error) {
	task, err := scanTask(s.pool.QueryRow(ctx,
		`SELECT `+taskColumns+` FROM tasks WHERE task_id = $1`, taskID))
	err = interpretError(err)
	if errors.Is(err, vigiltype.ErrNotFound) {
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
	args := pgx.StrictNamedArgs{"limit": sqlLimit(p.Limit)}
	if p.Status != "" {
		if !p.Status.Valid() {
			return nil, vigiltype.Invalid("status", "must be scheduled, running, completed or dead_letter")
		}
		where = append(where, "status = @status")
		args["status"] = string(p.Status)
	}
	if p.TaskType != "" {
		where = append(where, "task_type = @task_type")
		args["task_type"] = p.TaskType
	}
	if p.BeforeID != 0 {
		where = append(where, "task_id < @before_id")
		args["before_id"] = p.BeforeID
	}
	rows, err := s.pool.Query(ctx, `
		SELECT `+taskColumns+` FROM tasks
		WHERE `+strings.Join(where, " AND ")+`
		ORDER BY task_id DESC
		LIMIT @limit`, args)
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", interpretError(err))
	}
	tasks, err := scanTasks(rows)
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", interpretError(err))
	}
	return tasks, nil
}

// TaskClaim implements store.Store. The claimer must exist and be alive at
// Now: ErrNotFound otherwise, or ErrInstanceExited when it exited or is past
// its alive window. Instance check, claim and current-task update are one
// transaction; the instance's row stays locked until it commits, so an exit
// recorded meanwhile waits for the claim and a claim never lands on an
// instance that exited before it. The task is picked with FOR UPDATE SKIP
// LOCKED: a task another transaction is claiming is passed over, never
// waited for or claimed twice. A claim by TaskID does the same with its one
// task, so it never waits for a row lock while holding the instance's (a
// reclaim, complete or release of that task locks the task, then the
// holder's process row: waiting here could deadlock with it); a task locked
// by a concurrent claim or lease change is refused as not claimable
// (claimRefusal).
func (s *Store) TaskClaim(ctx context.Context, p store.TaskClaimParams) (*vigiltype.Task, error) {
	if p.TaskID == 0 && len(p.Types) == 0 {
		return nil, vigiltype.Invalid("task_types", "must name at least one type")
	}
	now := utcMS(p.Now)
	args := pgx.StrictNamedArgs{
		"instance_id":      p.InstanceID,
		"now":              now,
		"default_lease_ms": p.LeaseTimeout.Milliseconds(),
	}
	var claimSQL string
	if p.TaskID != 0 {
		claimSQL = `
			WITH next AS (
				SELECT task_id FROM tasks
				WHERE task_id = @task_id AND status = 'scheduled' AND run_after <= @now
				FOR UPDATE SKIP LOCKED)
			UPDATE tasks SET ` + claimSetSQL + `
			WHERE task_id = (SELECT task_id FROM next) AND status = 'scheduled'
			RETURNING ` + taskColumns
		args["task_id"] = p.TaskID
	} else {
		claimSQL = `
			WITH next AS (` + claimPickSQL + `)
			UPDATE tasks SET ` + claimSetSQL + `
			WHERE task_id = (SELECT task_id FROM next) AND status = 'scheduled'
			RETURNING ` + taskColumns
		args["types"] = p.Types
	}

	var task *vigiltype.Task
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		err := lockClaimer(ctx, tx, p.InstanceID, now)
		if err != nil {
			return err
		}

		task, err = scanTask(tx.QueryRow(ctx, claimSQL, args))
		switch {
		case errors.Is(err, pgx.ErrNoRows) && p.TaskID != 0:
			return claimRefusal(ctx, tx, p.TaskID, now)
		case errors.Is(err, pgx.ErrNoRows):
			task = nil
			return nil
		case err != nil:
			return interpretError(err)
		}
		_, err = tx.Exec(ctx, `
			UPDATE processes SET current_task_id = $1, current_task_type = $2 WHERE instance_id = $3`,
			task.TaskID, task.TaskType, p.InstanceID)
		return interpretError(err)
	})
	if err != nil {
		if p.TaskID != 0 {
			return nil, fmt.Errorf("claim task %d for process %s: %w", p.TaskID, p.InstanceID, err)
		}
		return nil, fmt.Errorf("claim task for process %s: %w", p.InstanceID, err)
	}
	return task, nil
}

// claimRefusal explains why a claim by id at now matched no row:
// ErrNotFound when the task does not exist, else ErrNotClaimable with its
// status or the run_after it waits for — or, when it is scheduled and due,
// because another transaction held it locked (SKIP LOCKED). The other words
// are sqlitestore's.
func claimRefusal(ctx context.Context, tx pgx.Tx, taskID int64, now time.Time) error {
	var (
		status   string
		runAfter time.Time
	)
	err := interpretError(tx.QueryRow(ctx, `SELECT status, run_after FROM tasks WHERE task_id = $1`, taskID).
		Scan(&status, &runAfter))
	switch {
	case errors.Is(err, vigiltype.ErrNotFound):
		return fmt.Errorf("task %d: %w", taskID, vigiltype.ErrNotFound)
	case err != nil:
		return err
	case status != string(vigiltype.TaskScheduled):
		return fmt.Errorf("task %d is %s: %w", taskID, status, vigiltype.ErrNotClaimable)
	case runAfter.After(now):
		return fmt.Errorf("task %d runs after %s: %w", taskID, runAfter.UTC().Format(timeLayout), vigiltype.ErrNotClaimable)
	}
	return fmt.Errorf("task %d is being claimed or changed concurrently: %w", taskID, vigiltype.ErrNotClaimable)
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
	now := utcMS(p.Now)
	set := `
		last_heartbeat_at = @now,
		heartbeat_schema_version = @schema_version,
		updated_at = @now,`
	args := pgx.StrictNamedArgs{
		"now":              now,
		"default_lease_ms": p.LeaseTimeout.Milliseconds(),
		"schema_version":   p.SchemaVersion,
	}
	switch {
	case p.ActivityAt == nil && p.KeepExpiry:
		set = strings.TrimSuffix(set, ",") // a v1 heartbeat under activity-only: the lease keeps its expiry
		delete(args, "default_lease_ms")
	case p.ActivityAt == nil:
		set += `
		lease_expires_at = ` + leaseExpiresSQL
	default:
		// The new last_activity_at; SET expressions all read the old row.
		// started_at stands in for a last_activity_at that a claim before
		// migration 002 left NULL.
		const lastActivity = `GREATEST(coalesce(last_activity_at, started_at, @activity_at::timestamptz), @activity_at::timestamptz)`
		base := "@now"
		if p.ExpireOnActivity {
			base = lastActivity
		}
		set += `
		last_activity_at = ` + lastActivity + `,
		lease_expires_at = ` + sqlAddMS(base, leaseWindowSQL)
		activityAt := utcMS(*p.ActivityAt)
		if activityAt.After(now) {
			activityAt = now
		}
		args["activity_at"] = activityAt
	}
	count := func(ctx context.Context, tx pgx.Tx, l store.TaskLease) error {
		return countHeartbeat(ctx, tx, l.InstanceID, p.SchemaVersion, now)
	}
	return s.leaseUpdate(ctx, "heartbeat", p.TaskLease, count, nil, set, args)
}

// checkHeartbeat refuses a lease heartbeat whose schema version and
// activity time disagree (DESIGN T4): SchemaVersion 1 (no ActivityAt) or 2
// (with ActivityAt). ExpireOnActivity is the server's `activity` expiry
// policy, which applies to v2 heartbeats only: a v1 lease keeps expiring
// on Now + window. The rules and words are sqlitestore's.
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
		result = @result::json,
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
	var result *string // NULL unless given
	if p.Result != nil {
		if !json.Valid(p.Result) {
			return nil, vigiltype.Invalid("result", "must be valid JSON")
		}
		r := string(p.Result)
		result = &r
	}
	return s.leaseUpdate(ctx, "complete", p.TaskLease, endLease, repeatedComplete(p.Result), completeSetSQL,
		pgx.StrictNamedArgs{"now": utcMS(p.Now), "result": result},
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
		pgx.StrictNamedArgs{"now": utcMS(p.Now), "retry_at": utcMS(p.RetryAt), "error": p.Error},
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
		pgx.StrictNamedArgs{"now": utcMS(p.Now)},
	)
}

// leaseThen is more work in a lease write's transaction, done after the
// task row was written under lease l.
type leaseThen func(ctx context.Context, tx pgx.Tx, l store.TaskLease) error

// endLease clears the holder's current task when its lease ends.
func endLease(ctx context.Context, tx pgx.Tx, l store.TaskLease) error {
	_, err := tx.Exec(ctx, `
		UPDATE processes SET current_task_id = NULL, current_task_type = NULL
		WHERE instance_id = $1 AND current_task_id = $2`, l.InstanceID, l.TaskID)
	return interpretError(err)
}

// repeatCheck decides, in a lease write's transaction, a write under l that
// matched no row: the task as stored when the write repeats the one its
// lease ended with (DESIGN T8), else why it is refused.
type repeatCheck func(ctx context.Context, tx pgx.Tx, l store.TaskLease) (*vigiltype.Task, error)

// repeatedComplete is TaskComplete's repeatCheck (store.RepeatedComplete).
func repeatedComplete(result json.RawMessage) repeatCheck {
	return func(ctx context.Context, tx pgx.Tx, l store.TaskLease) (*vigiltype.Task, error) {
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
	return func(ctx context.Context, tx pgx.Tx, l store.TaskLease) (*vigiltype.Task, error) {
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
// ErrNotFound when there is no such task. The result is read as text
// (taskColumns) and compared as a JSON value, as sqlitestore's.
func outcomeRow(ctx context.Context, tx pgx.Tx, taskID int64) (*vigiltype.Task, *string, error) {
	var failedBy *string
	t, err := scanTask(scanAlso{tx.QueryRow(ctx,
		`SELECT `+taskColumns+`, failed_by FROM tasks WHERE task_id = $1`, taskID), []any{&failedBy}})
	if err != nil {
		return nil, nil, interpretError(err) // ErrNotFound included
	}
	return t, failedBy, nil
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
// not run. A write
// racing a reclaim of the same task waits for it, then re-checks the
// predicate against the reclaimed row and matches nothing.
func (s *Store) leaseUpdate(ctx context.Context, op string, l store.TaskLease, then leaseThen, repeat repeatCheck, set string, args pgx.StrictNamedArgs) (*vigiltype.Task, error) {
	args = maps.Clone(args)
	args["task_id"] = l.TaskID
	args["lease_owner"] = l.InstanceID
	args["lease_epoch"] = l.Epoch
	var task *vigiltype.Task
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		task, err = scanTask(tx.QueryRow(ctx, `
			UPDATE tasks SET `+set+`
			WHERE task_id = @task_id AND status = 'running'
				AND lease_owner = @lease_owner AND lease_epoch = @lease_epoch
			RETURNING `+taskColumns, args))
		if errors.Is(err, pgx.ErrNoRows) && repeat != nil {
			task, err = repeat(ctx, tx, l)
			return err
		}
		if errors.Is(err, pgx.ErrNoRows) {
			return taskRefusal(ctx, tx, l.TaskID)
		}
		if err != nil {
			return interpretError(err)
		}
		return then(ctx, tx, l)
	})
	if err != nil {
		return nil, fmt.Errorf("%s task %d: %w", op, l.TaskID, err)
	}
	return task, nil
}

// taskRefusal explains why a lease-guarded write matched no row.
func taskRefusal(ctx context.Context, tx pgx.Tx, taskID int64) error {
	var one int
	if err := interpretError(tx.QueryRow(ctx, `SELECT 1 FROM tasks WHERE task_id = $1`, taskID).Scan(&one)); err != nil {
		return err // ErrNotFound included
	}
	return vigiltype.ErrStaleEpoch
}

// reclaimableSQL is true for a running task at @now whose lease expired or
// whose holder has stopped (exited, or past its alive window).
const reclaimableSQL = `(tasks.status = 'running' AND (tasks.lease_expires_at < @now OR ` + holderStoppedSQL + `))`

// holderStoppedSQL is true for a task whose lease owner has stopped at @now.
const holderStoppedSQL = `EXISTS (
	SELECT 1 FROM processes
	WHERE processes.instance_id = tasks.lease_owner
		AND (processes.exited_at IS NOT NULL OR processes.alive_until < @now))`

// reclaimReasonSQL is the reason a reclaimable task is taken back; a
// stopped holder is named first as the root cause. The words and the time
// layout are sqlitestore's.
var reclaimReasonSQL = `CASE WHEN ` + holderStoppedSQL + `
	THEN 'holder ' || lease_owner || ' stopped (exited or missed liveness heartbeats)'
	ELSE 'lease expired at ' || ` + sqlTimeText("lease_expires_at") + ` || ': holder ' || lease_owner
		|| ' last renewed it at ' || ` + sqlTimeText("last_heartbeat_at") + `
		|| CASE WHEN heartbeat_schema_version = 2 AND last_activity_at IS NOT NULL
			THEN ', last reported activity at ' || ` + sqlTimeText("last_activity_at") + ` ELSE '' END
	END`

// TaskReclaim implements store.Store. Limit <= 0 means no limit.
//
// It is one statement, safe with several servers sweeping one database at
// once. Its selection locks the tasks it picks FOR UPDATE SKIP LOCKED, so
// concurrent sweepers pick disjoint tasks, and a task a concurrent
// transaction has changed is re-checked against its new version; the UPDATE
// repeats the predicate, so a task completed, released or re-claimed in
// between is left alone. Each expired lease is thus reclaimed exactly once.
// The same statement clears the current task of every process whose current
// task was reclaimed. A task reclaimed back to scheduled loses its
// started_at; a dead-lettered one keeps it. The tasks are returned in id
// order. A pass picks them in lease expiry order, the order of
// tasks_reclaim_idx, so it reads the running tasks only until it has Limit
// of them instead of sorting every one (issue #6).
func (s *Store) TaskReclaim(ctx context.Context, p store.TaskReclaimParams) ([]*vigiltype.Task, error) {
	if p.Pulse != nil {
		// The pulse and the reclaim in one transaction: no lease is taken
		// back for liveness a store outage kept from being written.
		var tasks []*vigiltype.Task
		err := s.inTx(ctx, func(tx pgx.Tx) error {
			pulse := *p.Pulse
			pulse.Now = p.Now
			if _, err := pulseTx(ctx, tx, pulse); err != nil {
				return fmt.Errorf("pulse: %w", err)
			}
			var err error
			tasks, err = reclaimIn(ctx, tx, p)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("reclaim tasks: %w", interpretError(err))
		}
		return tasks, nil
	}
	tasks, err := reclaimIn(ctx, s.pool, p)
	if err != nil {
		return nil, fmt.Errorf("reclaim tasks: %w", interpretError(err))
	}
	return tasks, nil
}

// reclaimIn runs TaskReclaim's statement on q (the pool, or a transaction).
func reclaimIn(ctx context.Context, q hbQuerier, p store.TaskReclaimParams) ([]*vigiltype.Task, error) {
	const dead = `reclaims + 1 > max_reclaims`
	rows, err := q.Query(ctx, `
		WITH picked AS (
			SELECT task_id FROM tasks
			WHERE `+reclaimableSQL+`
			ORDER BY lease_expires_at
			LIMIT @limit
			FOR UPDATE OF tasks SKIP LOCKED
		), reclaimed AS (
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
			WHERE task_id IN (SELECT task_id FROM picked)
				AND `+reclaimableSQL+`
			RETURNING `+taskColumns+`
		), cleared AS (
			UPDATE processes SET current_task_id = NULL, current_task_type = NULL
			WHERE current_task_id IN (SELECT task_id FROM reclaimed)
		)
		SELECT * FROM reclaimed ORDER BY task_id`,
		pgx.StrictNamedArgs{"now": utcMS(p.Now), "limit": sqlLimit(p.Limit)},
	)
	if err != nil {
		return nil, err
	}
	return scanTasks(rows)
}

// TaskListStalled implements store.Store. Limit <= 0 means no limit. The
// holder's kind is read through tasks.lease_owner; a task whose holder row
// is gone (pruned) is not listed.
func (s *Store) TaskListStalled(ctx context.Context, p store.TaskListStalledParams) ([]*vigiltype.Task, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT `+taskColumns+` FROM tasks
		WHERE tasks.status = 'running' AND tasks.started_at < @started_before
			AND EXISTS (
				SELECT 1 FROM processes
				WHERE processes.instance_id = tasks.lease_owner AND processes.process_kind = @kind)
		ORDER BY tasks.started_at, tasks.task_id
		LIMIT @limit`,
		pgx.StrictNamedArgs{
			"kind":           p.Kind,
			"started_before": utcMS(p.StartedBefore),
			"limit":          sqlLimit(p.Limit),
		},
	)
	if err != nil {
		return nil, fmt.Errorf("list stalled tasks of %q: %w", p.Kind, interpretError(err))
	}
	tasks, err := scanTasks(rows)
	if err != nil {
		return nil, fmt.Errorf("list stalled tasks of %q: %w", p.Kind, interpretError(err))
	}
	return tasks, nil
}

// TaskReclaimStalled implements store.Store. One statement, guarded by
// task id, status running and epoch, takes the task back under
// TaskReclaim's rules (reclaims + 1, dead_letter past max_reclaims keeping
// run_after and started_at) and clears the current task of every process
// whose current task it was. A concurrent claim, complete or release of the
// task is waited for, then the guard is re-checked against the new row, so
// a lost race matches nothing. A write that matches no row is ErrNotFound
// when the task does not exist, else ErrStaleEpoch, and changes nothing.
func (s *Store) TaskReclaimStalled(ctx context.Context, p store.TaskReclaimStalledParams) (*vigiltype.Task, error) {
	const dead = `reclaims + 1 > max_reclaims`
	var task *vigiltype.Task
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		task, err = scanTask(tx.QueryRow(ctx, `
			WITH reclaimed AS (
				UPDATE tasks SET
					reclaims = reclaims + 1,
					status = CASE WHEN `+dead+` THEN 'dead_letter' ELSE 'scheduled' END,
					run_after = CASE WHEN `+dead+` THEN run_after ELSE @now END,
					started_at = CASE WHEN `+dead+` THEN started_at ELSE NULL END,
					last_error = CASE WHEN `+dead+`
						THEN 'dead-lettered: reclaimed ' || (reclaims + 1) || ' times (max_reclaims '
							|| max_reclaims || '): ' || @reason::text
						ELSE @reason::text
						END,
					lease_owner = NULL,
					lease_expires_at = NULL,
					updated_at = @now
				WHERE task_id = @task_id AND status = 'running' AND lease_epoch = @lease_epoch
				RETURNING `+taskColumns+`
			), cleared AS (
				UPDATE processes SET current_task_id = NULL, current_task_type = NULL
				WHERE current_task_id IN (SELECT task_id FROM reclaimed)
			)
			SELECT * FROM reclaimed`,
			pgx.StrictNamedArgs{
				"now":         utcMS(p.Now),
				"reason":      p.Reason,
				"task_id":     p.TaskID,
				"lease_epoch": p.Epoch,
			}))
		if errors.Is(err, pgx.ErrNoRows) {
			return taskRefusal(ctx, tx, p.TaskID)
		}
		return interpretError(err)
	})
	if err != nil {
		return nil, fmt.Errorf("reclaim stalled task %d: %w", p.TaskID, err)
	}
	return task, nil
}

// lockClaimer locks the claiming instance's row (so a concurrent exit or
// prune waits for the claim) and refuses a claim by an instance that is
// unknown (ErrNotFound), has exited (ErrInstanceExited) or is past its
// alive window at now (ErrInstanceStopped). TaskClaim and TaskClaimBatch
// share it.
func lockClaimer(ctx context.Context, tx pgx.Tx, instanceID string, now time.Time) error {
	var (
		exitedAt   *time.Time
		aliveUntil time.Time
	)
	err := interpretError(tx.QueryRow(ctx, `
		SELECT exited_at, alive_until FROM processes WHERE instance_id = $1
		FOR NO KEY UPDATE`, instanceID).Scan(&exitedAt, &aliveUntil))
	switch {
	case err != nil: // ErrNotFound included
		return err
	case exitedAt != nil:
		return vigiltype.ErrInstanceExited
	case aliveUntil.Before(now):
		return fmt.Errorf("alive window ended %s: %w",
			aliveUntil.UTC().Format(timeLayout), vigiltype.ErrInstanceStopped)
	}
	return nil
}
