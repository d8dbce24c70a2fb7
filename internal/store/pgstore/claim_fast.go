package pgstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// The claim by type and the end of a lease (complete, fail, release) are
// each ONE statement, so each costs one round trip to the database and one
// commit, where a transaction of three or four statements cost five or six
// round trips (issue #6). Data-modifying CTEs keep them atomic: the claimer's
// row is locked and checked, the task picked, locked and written, and the
// claimer's current task set, all in one statement, or none of it. Only when
// the statement changes nothing is a second query run, to say why.

// claimByTypeSQL is TaskClaim by types in one statement. claimer locks the
// claimer's row (FOR NO KEY UPDATE, as the transaction did) only when it is
// alive at @now; no task is written without it.
var claimByTypeSQL = `
	WITH claimer AS (
		SELECT instance_id FROM processes
		WHERE instance_id = @instance_id AND exited_at IS NULL AND alive_until >= @now
		FOR NO KEY UPDATE
	), next AS (` + claimPickSQL + `
	), claimed AS (
		UPDATE tasks SET ` + claimSetSQL + `
		WHERE task_id = (SELECT task_id FROM next) AND status = 'scheduled'
			AND EXISTS (SELECT 1 FROM claimer)
		RETURNING ` + taskColumns + `
	), current AS (
		UPDATE processes SET current_task_id = claimed.task_id, current_task_type = claimed.task_type
		FROM claimed
		WHERE processes.instance_id = @instance_id
	)
	SELECT * FROM claimed`

// claimByType claims the oldest claimable task of p.Types for p.InstanceID
// (store.Store.TaskClaim without TaskID). nil, nil when nothing is
// claimable; ErrNotFound, ErrInstanceExited or ErrInstanceStopped when the
// claimer may not claim.
func (s *Store) claimByType(ctx context.Context, p store.TaskClaimParams) (*vigiltype.Task, error) {
	now := utcMS(p.Now)
	task, err := scanTask(s.pool.QueryRow(ctx, claimByTypeSQL, pgx.StrictNamedArgs{
		"instance_id":      p.InstanceID,
		"now":              now,
		"default_lease_ms": p.LeaseTimeout.Milliseconds(),
		"types":            p.Types,
	}))
	if err == nil {
		return task, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("claim task for process %s: %w", p.InstanceID, interpretError(err))
	}
	// Nothing written: either nothing was claimable or the claimer may not claim.
	var (
		exitedAt   *time.Time
		aliveUntil time.Time
	)
	err = interpretError(s.pool.QueryRow(ctx,
		`SELECT exited_at, alive_until FROM processes WHERE instance_id = $1`, p.InstanceID).
		Scan(&exitedAt, &aliveUntil))
	switch {
	case err != nil: // ErrNotFound included
		return nil, fmt.Errorf("claim task for process %s: %w", p.InstanceID, err)
	case exitedAt != nil:
		return nil, fmt.Errorf("claim task for process %s: %w", p.InstanceID, vigiltype.ErrInstanceExited)
	case aliveUntil.Before(now):
		return nil, fmt.Errorf("claim task for process %s: alive window ended %s: %w", p.InstanceID,
			aliveUntil.UTC().Format(timeLayout), vigiltype.ErrInstanceStopped)
	}
	return nil, nil
}

// leaseEnd applies the SET clause set to the task held under l, guarded by
// the whole lease predicate (id, running, owner, epoch), and clears the
// holder's current task, in one statement: leaseUpdate with endLease. A
// write that matches no row is ErrNotFound when the task does not exist,
// else ErrStaleEpoch; either way nothing changed.
func (s *Store) leaseEnd(ctx context.Context, op string, l store.TaskLease, set string, args pgx.StrictNamedArgs) (*vigiltype.Task, error) {
	args = maps.Clone(args)
	args["task_id"] = l.TaskID
	args["lease_owner"] = l.InstanceID
	args["lease_epoch"] = l.Epoch
	task, err := scanTask(s.pool.QueryRow(ctx, `
		WITH ended AS (
			UPDATE tasks SET `+set+`
			WHERE task_id = @task_id AND status = 'running'
				AND lease_owner = @lease_owner AND lease_epoch = @lease_epoch
			RETURNING `+taskColumns+`
		), cleared AS (
			UPDATE processes SET current_task_id = NULL, current_task_type = NULL
			FROM ended
			WHERE processes.instance_id = @lease_owner AND processes.current_task_id = ended.task_id
		)
		SELECT * FROM ended`, args))
	if errors.Is(err, pgx.ErrNoRows) {
		var one int
		err = interpretError(s.pool.QueryRow(ctx, `SELECT 1 FROM tasks WHERE task_id = $1`, l.TaskID).Scan(&one))
		if err == nil {
			err = vigiltype.ErrStaleEpoch
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%s task %d: %w", op, l.TaskID, interpretError(err))
	}
	return task, nil
}
