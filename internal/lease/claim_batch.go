package lease

import (
	"context"
	"fmt"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// ClaimBatchMax is the most tasks one batch claim may ask for (max_tasks).
const ClaimBatchMax = 100

// CheckClaimBatchMax refuses a max_tasks outside 1–ClaimBatchMax
// (ErrInvalid naming max_tasks).
func CheckClaimBatchMax(n int) error {
	if n < 1 || n > ClaimBatchMax {
		return vigiltype.Invalid("max_tasks", fmt.Sprintf("must be an integer from 1 to %d", ClaimBatchMax))
	}
	return nil
}

// ClaimBatch authenticates the instance and atomically takes up to n
// claimable tasks of types (issue #6, batch claims), in the order single
// claims would take them. Each task is under its own lease (its own
// lease_epoch) and is heartbeated, completed, failed or released on its own,
// exactly like a task from Claim. An empty slice when nothing is claimable.
// Errors as Claim, and ErrInvalid (max_tasks) for n outside 1–ClaimBatchMax,
// checked before anything else.
func (s *Service) ClaimBatch(ctx context.Context, instanceID, token string, types []string, n int) ([]*vigiltype.Task, error) {
	if err := CheckClaimBatchMax(n); err != nil {
		return nil, err
	}
	if len(types) == 0 {
		return nil, vigiltype.Invalid("task_types", "must name at least one task type")
	}
	for i, typ := range types {
		if err := vigiltype.CheckName(fmt.Sprintf("task_types[%d]", i), typ); err != nil {
			return nil, err
		}
	}
	if err := s.liveness.Authenticate(ctx, instanceID, token); err != nil {
		return nil, fmt.Errorf("instance %s: %w", instanceID, err)
	}
	tasks, err := s.store.TaskClaimBatch(ctx, store.TaskClaimBatchParams{
		InstanceID: instanceID, Types: types, Max: n, LeaseTimeout: s.cfg.LeaseTimeout, Now: s.clock.Now(),
	})
	if err != nil {
		return nil, fmt.Errorf("claim up to %d tasks for instance %s: %w", n, instanceID, err)
	}
	return tasks, nil
}
