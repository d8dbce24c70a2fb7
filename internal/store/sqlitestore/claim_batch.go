package sqlitestore

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// TaskClaimBatch implements store.Store: one UPDATE … WHERE task_id IN
// (the first @max tasks in claim order) … RETURNING on the one writer
// connection, so a batch is one transaction and one commit whatever its
// size. Each row gets claimSetSQL, as a single claim does (its own
// lease_epoch + 1).
func (s *Store) TaskClaimBatch(ctx context.Context, p store.TaskClaimBatchParams) ([]*vigiltype.Task, error) {
	if err := p.Check(); err != nil {
		return nil, err
	}
	now := timeString(p.Now)
	claimSQL, typeArgs, err := claimBatchSQL(p.Types)
	if err != nil {
		return nil, fmt.Errorf("claim tasks for process %s: %w", p.InstanceID, err)
	}
	args := append([]any{
		sql.Named("instance_id", p.InstanceID),
		sql.Named("now", now),
		sql.Named("default_lease_ms", p.LeaseTimeout.Milliseconds()),
		sql.Named("max", p.Max),
	}, typeArgs...)

	stmts := s.writerStmts(ctx, claimerSQL, claimSQL, currentSQL)
	var tasks []*vigiltype.Task
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		if err := checkClaimer(ctx, tx, stmts, p.InstanceID, now); err != nil {
			return err
		}

		rows, err := stmts.query(ctx, tx, claimSQL, args...)
		if err != nil {
			return err
		}
		if tasks, err = scanTasks(rows); err != nil {
			return err
		}
		if len(tasks) == 0 {
			return nil
		}
		// RETURNING order is unspecified: put the batch in claim order.
		slices.SortFunc(tasks, func(a, b *vigiltype.Task) int {
			return cmp.Or(a.RunAfter.Compare(b.RunAfter), cmp.Compare(a.TaskID, b.TaskID))
		})
		last := tasks[len(tasks)-1]
		_, err = stmts.exec(ctx, tx, currentSQL, last.TaskID, last.TaskType, p.InstanceID)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claim up to %d tasks for process %s: %w", p.Max, p.InstanceID, err)
	}
	if tasks == nil {
		tasks = []*vigiltype.Task{}
	}
	return tasks, nil
}

// claimBatchSQL is a batch claim's statement for types: an UPDATE of the
// tasks claimPickLimitSQL picks (up to @max, in claim order), RETURNING
// them. The repeated status test is written +status so that it cannot use
// an index: given status = 'scheduled' on an index, SQLite walks every
// scheduled task and tests each against the IN list (the whole backlog on
// every claim) instead of looking the picked ids up by rowid
// (TestClaimBatchPlanUsesRowids).
func claimBatchSQL(types []string) (string, []any, error) {
	pick, args, err := claimPickLimitSQL(types, "@max")
	if err != nil {
		return "", nil, err
	}
	return `
			UPDATE tasks SET ` + claimSetSQL + `
			WHERE task_id IN ` + pick + ` AND +status = 'scheduled'
			RETURNING ` + taskColumns, args, nil
}

// query runs query in tx, through its prepared statement when there is one.
func (ts txStmts) query(ctx context.Context, tx *sql.Tx, query string, args ...any) (*sql.Rows, error) {
	if st, ok := ts[query]; ok {
		return tx.StmtContext(ctx, st).QueryContext(ctx, args...)
	}
	return tx.QueryContext(ctx, query, args...)
}
