package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// claimBatchPickSQL is claimPickSQL for up to @max tasks: each type's scan
// of tasks_claim_idx locks up to @max unlocked rows (FOR UPDATE SKIP
// LOCKED, so concurrent batches pass each other's rows by), and the oldest
// @max of them win; the rest stay locked only until the transaction ends.
const claimBatchPickSQL = `
	SELECT c.task_id FROM unnest(@types::text[]) AS ty(task_type)
	CROSS JOIN LATERAL (
		SELECT task_id, run_after FROM tasks
		WHERE status = 'scheduled' AND task_type = ty.task_type AND run_after <= @now
		ORDER BY run_after, task_id
		LIMIT @max
		FOR UPDATE SKIP LOCKED) AS c
	ORDER BY c.run_after, c.task_id
	LIMIT @max`

// claimBatchSQL claims the tasks claimBatchPickSQL picks, each with
// claimSetSQL, and returns them in claim order (an UPDATE's RETURNING order
// is unspecified). The picked ids are matched with = ANY (ARRAY(…)), not IN
// (…): with IN, the generic plan PostgreSQL switches a prepared statement
// to hash-joins the picks against a Seq Scan of every scheduled task; with
// an array it looks each up by primary key (TestClaimBatchPlanUsesPrimaryKey).
var claimBatchSQL = `
	WITH next AS (` + claimBatchPickSQL + `),
	claimed AS (
		UPDATE tasks SET ` + claimSetSQL + `
		WHERE task_id = ANY (ARRAY(SELECT task_id FROM next)) AND status = 'scheduled'
		RETURNING *)
	SELECT ` + taskColumns + ` FROM claimed ORDER BY run_after, task_id`

// TaskClaimBatch implements store.Store: one statement picks and locks up
// to @max tasks and claims each (claimSetSQL: its own lease_epoch + 1), in
// the same transaction as the claimer check and the current task, so a
// batch costs one commit whatever its size.
func (s *Store) TaskClaimBatch(ctx context.Context, p store.TaskClaimBatchParams) ([]*vigiltype.Task, error) {
	if err := p.Check(); err != nil {
		return nil, err
	}
	now := utcMS(p.Now)
	args := pgx.StrictNamedArgs{
		"instance_id":      p.InstanceID,
		"now":              now,
		"default_lease_ms": p.LeaseTimeout.Milliseconds(),
		"types":            p.Types,
		"max":              p.Max,
	}
	var tasks []*vigiltype.Task
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if err := lockClaimer(ctx, tx, p.InstanceID, now); err != nil {
			return err
		}

		rows, err := tx.Query(ctx, claimBatchSQL, args)
		if err != nil {
			return interpretError(err)
		}
		if tasks, err = scanTasks(rows); err != nil {
			return interpretError(err)
		}
		if len(tasks) == 0 {
			return nil
		}
		last := tasks[len(tasks)-1]
		_, err = tx.Exec(ctx, `
			UPDATE processes SET current_task_id = $1, current_task_type = $2 WHERE instance_id = $3`,
			last.TaskID, last.TaskType, p.InstanceID)
		return interpretError(err)
	})
	if err != nil {
		return nil, fmt.Errorf("claim up to %d tasks for process %s: %w", p.Max, p.InstanceID, err)
	}
	if tasks == nil {
		tasks = []*vigiltype.Task{}
	}
	return tasks, nil
}
