package lease

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// CompleteBatchMax is the most items one batch complete may carry.
const CompleteBatchMax = 100

// CompleteItem is one task of a batch complete: the task, the epoch it is
// held under and its result (JSON; empty means null).
type CompleteItem struct {
	TaskID int64
	Epoch  int64
	Result json.RawMessage
}

// CompleteOutcome is one item's answer: the completed task, or Err, the
// error Complete would have returned for that task alone (ErrStaleEpoch,
// ErrNotFound, ErrOutcomeConflict).
type CompleteOutcome struct {
	Task *vigiltype.Task
	Err  error
}

// CompleteBatch completes several tasks the instance holds in one store
// transaction, each checked exactly as Complete checks one (epoch, owner,
// running). Each item gets its own outcome, in request order: a stale or
// unknown item fails alone. A request that is malformed as a whole (no or
// more than CompleteBatchMax items, an item without a positive task_id or
// lease_epoch, a result that is not JSON) is ErrInvalid naming the field,
// and nothing is written; an instance that does not authenticate fails the
// whole batch, as it would fail each single complete.
func (s *Service) CompleteBatch(ctx context.Context, instanceID, token string, items []CompleteItem) ([]CompleteOutcome, error) {
	if len(items) < 1 || len(items) > CompleteBatchMax {
		return nil, vigiltype.Invalid("items", fmt.Sprintf("must hold 1 to %d tasks", CompleteBatchMax))
	}
	if instanceID == "" {
		return nil, vigiltype.Invalid("instance_id", "is required")
	}
	params := make([]store.TaskCompleteParams, len(items))
	for i, it := range items {
		if it.TaskID <= 0 {
			return nil, vigiltype.Invalid(fmt.Sprintf("items[%d].task_id", i), "must be a positive integer")
		}
		if it.Epoch <= 0 {
			return nil, vigiltype.Invalid(fmt.Sprintf("items[%d].lease_epoch", i), "must be the positive epoch returned by claim")
		}
		res, err := checkJSON(fmt.Sprintf("items[%d].result", i), it.Result, "null")
		if err != nil {
			return nil, err
		}
		params[i] = store.TaskCompleteParams{
			TaskLease: store.TaskLease{TaskID: it.TaskID, Epoch: it.Epoch, InstanceID: instanceID},
			Result:    res,
		}
	}
	if err := s.liveness.Authenticate(ctx, instanceID, token); err != nil {
		return nil, fmt.Errorf("instance %s: %w", instanceID, err)
	}
	now := s.clock.Now()
	for i := range params {
		params[i].Now = now
	}
	results, err := s.store.TaskCompleteBatch(ctx, params)
	if err != nil {
		return nil, err // the store's error names the batch
	}
	out := make([]CompleteOutcome, len(results))
	for i, r := range results {
		out[i] = CompleteOutcome{Task: r.Task, Err: r.Err}
	}
	return out, nil
}
