package httpapi

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/vigil-fleet/vigil/internal/lease"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// completeBatchRequest is the body of POST /v1/tasks/complete.
type completeBatchRequest struct {
	InstanceID string              `json:"instance_id"`
	Items      []completeBatchItem `json:"items"`
}

type completeBatchItem struct {
	TaskID     int64           `json:"task_id"`
	LeaseEpoch int64           `json:"lease_epoch"`
	Result     json.RawMessage `json:"result"`
}

// completeBatchResult answers one item: the task, or its own error.
type completeBatchResult struct {
	TaskID int64           `json:"task_id"`
	Task   *vigiltype.Task `json:"task,omitempty"`
	Error  *itemError      `json:"error,omitempty"`
}

type itemError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// itemErrorOf is the code and message an item's own error gets, those a
// single complete would answer with; ok is false for an error that is not
// an item's own (it fails the whole request).
func itemErrorOf(err error) (e *itemError, ok bool) {
	code := ""
	switch {
	case errors.Is(err, vigiltype.ErrStaleEpoch):
		code = "stale_epoch"
	case errors.Is(err, vigiltype.ErrNotFound):
		code = "not_found"
	case errors.Is(err, vigiltype.ErrOutcomeConflict):
		code = "outcome_conflict"
	case errors.Is(err, vigiltype.ErrInvalid):
		code = "invalid"
	default:
		return nil, false
	}
	return &itemError{Code: code, Message: publicMessage(err)}, true
}

// taskCompleteBatch completes several held tasks in one request and one
// store transaction: {"results": […]} in request order, each the task or
// its own error, so that a stale item fails alone. A malformed body is 400
// naming the field, and nothing is written.
func (a *api) taskCompleteBatch(w http.ResponseWriter, r *http.Request) {
	var p completeBatchRequest
	if !a.decode(w, r, &p) {
		return
	}
	actsFor(r, p.InstanceID)
	token, ok := instanceToken(w, r)
	if !ok {
		return
	}
	items := make([]lease.CompleteItem, len(p.Items))
	for i, it := range p.Items {
		items[i] = lease.CompleteItem{TaskID: it.TaskID, Epoch: it.LeaseEpoch, Result: it.Result}
	}
	outcomes, err := a.Lease.CompleteBatch(r.Context(), p.InstanceID, token, items)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	results := make([]completeBatchResult, len(outcomes))
	for i, o := range outcomes {
		results[i].TaskID = p.Items[i].TaskID
		if o.Err == nil {
			results[i].Task = o.Task
			continue
		}
		e, ok := itemErrorOf(o.Err)
		if !ok {
			a.fail(w, r, o.Err)
			return
		}
		results[i].Error = e
	}
	writeJSON(w, http.StatusOK, map[string]any{"results": results})
}
