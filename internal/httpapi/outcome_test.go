package httpapi_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// Issue #12 case 6, DESIGN T8: the holder that repeats its own complete or
// fail (its first answer was lost) gets 200 and the stored task, not 409
// stale_epoch; a different result or error text is 409 outcome_conflict
// naming the field, and nothing is counted twice.
func TestRepeatedOutcomeByTheHolder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.register("worker", 30)
	other := b.register("worker", 30)

	t.Run("complete", func(t *testing.T) {
		task := b.enqueue(`{"task_type":"complete-twice"}`)
		held := b.claimTask(w, "complete-twice")
		first := b.leaseOp(w, task.TaskID, held.LeaseEpoch, "complete", `,"result":{"a":1,"b":[1,2]}`)
		require.Equal(t, http.StatusOK, first.status, "%s", first.body)
		stored := b.task(task.TaskID)

		again := b.leaseOp(w, task.TaskID, held.LeaseEpoch, "complete", `,"result":{ "b": [1, 2], "a": 1 }`)
		require.Equal(t, http.StatusOK, again.status, "%s", again.body)
		var got vigiltype.Task
		again.decode(t, &got)
		require.Equal(t, stored, got)

		differs := b.leaseOp(w, task.TaskID, held.LeaseEpoch, "complete", `,"result":{"a":2}`)
		require.Equal(t, http.StatusConflict, differs.status, "%s", differs.body)
		code, msg := differs.errorCode(t)
		require.Equal(t, "outcome_conflict", code)
		require.Regexp(t, `^result: `, msg)

		notHolder := b.leaseOp(other, task.TaskID, held.LeaseEpoch, "complete", `,"result":{"a":1,"b":[1,2]}`)
		require.Equal(t, http.StatusConflict, notHolder.status)
		code, _ = notHolder.errorCode(t)
		require.Equal(t, "stale_epoch", code)
		require.Equal(t, stored, b.task(task.TaskID))
	})

	t.Run("fail", func(t *testing.T) {
		task := b.enqueue(`{"task_type":"fail-twice"}`)
		held := b.claimTask(w, "fail-twice")
		first := b.leaseOp(w, task.TaskID, held.LeaseEpoch, "fail", `,"error":"boom"`)
		require.Equal(t, http.StatusOK, first.status, "%s", first.body)
		stored := b.task(task.TaskID)
		require.Equal(t, 1, stored.Attempts)

		again := b.leaseOp(w, task.TaskID, held.LeaseEpoch, "fail", `,"error":"boom","retry_after_s":60`)
		require.Equal(t, http.StatusOK, again.status, "%s", again.body)
		var got vigiltype.Task
		again.decode(t, &got)
		require.Equal(t, stored, got)
		require.Equal(t, stored, b.task(task.TaskID), "a repeated fail counted again")

		differs := b.leaseOp(w, task.TaskID, held.LeaseEpoch, "fail", `,"error":"bang"`)
		require.Equal(t, http.StatusConflict, differs.status, "%s", differs.body)
		code, msg := differs.errorCode(t)
		require.Equal(t, "outcome_conflict", code)
		require.Regexp(t, `^error: `, msg)
	})

	t.Run("batch", func(t *testing.T) {
		task := b.enqueue(`{"task_type":"batch-twice"}`)
		held := b.claimTask(w, "batch-twice")
		body := `{"instance_id":"` + w.ID + `","items":[{"task_id":` + itoa(task.TaskID) + `,"lease_epoch":` + itoa(held.LeaseEpoch) + `,"result":[1]}]}`
		for range 2 {
			r := b.do("POST", "/v1/tasks/complete", body, "X-Vigil-Instance-Token", w.Token)
			require.Equal(t, http.StatusOK, r.status, "%s", r.body)
			var res struct {
				Results []struct {
					Task  *vigiltype.Task `json:"task"`
					Error *struct{ Code string }
				} `json:"results"`
			}
			r.decode(t, &res)
			require.Len(t, res.Results, 1)
			require.Nil(t, res.Results[0].Error, "%s", r.body)
			require.Equal(t, vigiltype.TaskCompleted, res.Results[0].Task.Status)
		}
		body = `{"instance_id":"` + w.ID + `","items":[{"task_id":` + itoa(task.TaskID) + `,"lease_epoch":` + itoa(held.LeaseEpoch) + `,"result":[2]}]}`
		r := b.do("POST", "/v1/tasks/complete", body, "X-Vigil-Instance-Token", w.Token)
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		require.Contains(t, string(r.body), `"code":"outcome_conflict"`)
	})
}
