package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

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

// TaskCompleteBatch implements store.Store: one transaction running, per
// item in task id order, TaskComplete's guarded write and (when it matched)
// its end of lease; an item that matched no row gets TaskComplete's answer
// as its own outcome: the task as stored when it repeats the complete its
// lease ended with, else the refusal. A result PostgreSQL would refuse (not valid JSON or
// not UTF-8) is refused before the transaction, so that one bad item
// cannot abort the others' writes.
func (s *Store) TaskCompleteBatch(ctx context.Context, items []store.TaskCompleteParams) ([]store.TaskCompleteResult, error) {
	results := make([]store.TaskCompleteResult, len(items))
	if len(items) == 0 {
		return results, nil
	}
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		clear(results) // a retried transaction starts over
		for _, i := range store.CompleteOrder(items) {
			p := items[i]
			var result *string // NULL unless given
			if p.Result != nil {
				if !json.Valid(p.Result) || !utf8.Valid(p.Result) {
					results[i].Err = fmt.Errorf("complete task %d: %w", p.TaskID, vigiltype.Invalid("result", "must be valid JSON"))
					continue
				}
				r := string(p.Result)
				result = &r
			}
			task, err := scanTask(tx.QueryRow(ctx, completeBatchSQL, pgx.StrictNamedArgs{
				"now": utcMS(p.Now), "result": result,
				"task_id": p.TaskID, "lease_owner": p.InstanceID, "lease_epoch": p.Epoch,
			}))
			if errors.Is(err, pgx.ErrNoRows) {
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
				return fmt.Errorf("complete task %d: %w", p.TaskID, interpretError(err))
			}
			if err := endLease(ctx, tx, p.TaskLease); err != nil {
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
