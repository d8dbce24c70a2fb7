package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// completeBatchSQL is TaskComplete's guarded write (leaseUpdate's WHERE
// with completeSetSQL), run once per item of a batch.
const completeBatchSQL = `
			UPDATE tasks SET ` + completeSetSQL + `
			WHERE task_id = @task_id AND status = 'running'
				AND lease_owner = @lease_owner AND lease_epoch = @lease_epoch
			RETURNING ` + taskColumns

// TaskCompleteBatch implements store.Store: one IMMEDIATE transaction on the
// writer running, per item in task id order, TaskComplete's guarded write
// and (when it matched) its end of lease; an item that matched no row gets
// TaskComplete's answer as its own outcome: the task as stored when it
// repeats the complete its lease ended with, else the refusal.
func (s *Store) TaskCompleteBatch(ctx context.Context, items []store.TaskCompleteParams) ([]store.TaskCompleteResult, error) {
	results := make([]store.TaskCompleteResult, len(items))
	if len(items) == 0 {
		return results, nil
	}
	stmts := s.writerStmts(ctx, completeBatchSQL, endLeaseSQL)
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		clear(results) // a retried transaction starts over
		for _, i := range store.CompleteOrder(items) {
			p := items[i]
			var result any // NULL unless given
			if p.Result != nil {
				if !json.Valid(p.Result) {
					results[i].Err = fmt.Errorf("complete task %d: %w", p.TaskID, vigiltype.Invalid("result", "must be valid JSON"))
					continue
				}
				result = string(p.Result)
			}
			task, err := scanTask(stmts.queryRow(ctx, tx, completeBatchSQL,
				sql.Named("now", timeString(p.Now)),
				sql.Named("result", result),
				sql.Named("task_id", p.TaskID),
				sql.Named("lease_owner", p.InstanceID),
				sql.Named("lease_epoch", p.Epoch),
			))
			if errors.Is(err, sql.ErrNoRows) {
				task, why := repeatedComplete(p.Result)(ctx, tx, p.TaskLease)
				if why == nil {
					results[i].Task = task // a repeat of the complete its lease ended with
					continue
				}
				if !errors.Is(why, vigiltype.ErrNotFound) && !errors.Is(why, vigiltype.ErrStaleEpoch) &&
					!errors.Is(why, vigiltype.ErrOutcomeConflict) {
					return fmt.Errorf("complete task %d: %w", p.TaskID, why)
				}
				results[i].Err = fmt.Errorf("complete task %d: %w", p.TaskID, why)
				continue
			}
			if err != nil {
				return fmt.Errorf("complete task %d: %w", p.TaskID, err)
			}
			if err := endLease(ctx, tx, stmts, p.TaskLease); err != nil {
				return fmt.Errorf("complete task %d: %w", p.TaskID, err)
			}
			results[i].Task = task
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("complete %d tasks: %w", len(items), err)
	}
	return results, nil
}
