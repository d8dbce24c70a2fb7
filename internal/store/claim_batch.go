package store

import (
	"fmt"
	"time"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// TaskClaimBatchMax is the most tasks one TaskClaimBatch may take. The
// HTTP API allows fewer (lease.ClaimBatchMax); this bound only keeps a
// backend's statement and its locks small.
const TaskClaimBatchMax = 1000

// TaskClaimBatchParams: claim up to Max tasks of Types for InstanceID in
// one transaction. LeaseTimeout and Now as in TaskClaimParams.
type TaskClaimBatchParams struct {
	InstanceID   string
	Types        []string
	Max          int // 1–TaskClaimBatchMax
	LeaseTimeout time.Duration
	Now          time.Time
}

// Check refuses a batch claim that names no type or a Max outside
// 1–TaskClaimBatchMax (ErrInvalid naming max_tasks), before anything is
// read or written. Both backends call it first.
func (p TaskClaimBatchParams) Check() error {
	if len(p.Types) == 0 {
		return vigiltype.Invalid("task_types", "must name at least one type")
	}
	if p.Max < 1 || p.Max > TaskClaimBatchMax {
		return vigiltype.Invalid("max_tasks", fmt.Sprintf("must be 1–%d", TaskClaimBatchMax))
	}
	return nil
}
