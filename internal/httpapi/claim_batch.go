package httpapi

import (
	"encoding/json"
	"net/http"

	"github.com/vigil-fleet/vigil/internal/lease"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// maxTasks reads a claim's optional max_tasks (issue #6, batch claims). It
// reports whether the field was sent at all: without it the claim is the
// single claim it always was. A value that is not an integer from 1 to
// lease.ClaimBatchMax (null, a string, 2.5, 0, 101) is ErrInvalid naming
// max_tasks.
func maxTasks(raw json.RawMessage) (n int, present bool, err error) {
	if raw == nil {
		return 0, false, nil
	}
	if err := json.Unmarshal(raw, &n); err != nil || string(raw) == "null" {
		return 0, true, lease.CheckClaimBatchMax(0)
	}
	return n, true, lease.CheckClaimBatchMax(n)
}

// taskClaimBatch answers a claim that sent max_tasks: {"tasks": […]}, up to
// n tasks each under its own lease, an empty list when nothing is claimable.
func (a *api) taskClaimBatch(w http.ResponseWriter, r *http.Request, instanceID, token string, types []string, n int) {
	tasks, err := a.Lease.ClaimBatch(r.Context(), instanceID, token, types, n)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if len(tasks) == 0 {
		tasks = []*vigiltype.Task{}
		routine(r)
	}
	if a.Metrics != nil && len(tasks) > 0 {
		a.Metrics.LeasesClaimed.Add(float64(len(tasks)))
	}
	writeJSON(w, http.StatusOK, map[string]any{"tasks": tasks})
}
