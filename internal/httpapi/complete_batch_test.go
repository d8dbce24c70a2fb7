package httpapi_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigiltype"
)

type completeBatchAnswer struct {
	Results []struct {
		TaskID int64           `json:"task_id"`
		Task   *vigiltype.Task `json:"task"`
		Error  *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	} `json:"results"`
}

// A malformed batch complete is a 400 naming the field, and nothing is
// completed.
func TestCompleteBatchBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.register("worker", 30)
	b.enqueue(`{"task_type":"sleep"}`)
	task := b.claimTask(in, "sleep")
	tok := []string{"X-Vigil-Instance-Token", in.Token}
	good := `{"task_id":` + itoa(task.TaskID) + `,"lease_epoch":` + itoa(task.LeaseEpoch) + `}`
	body := func(items ...string) string {
		return `{"instance_id":"` + in.ID + `","items":[` + strings.Join(items, ",") + `]}`
	}
	many := make([]string, 101)
	for i := range many {
		many[i] = good
	}
	cases := []struct {
		name, body, code, field string
		status                  int
	}{
		{"no items", `{"instance_id":"` + in.ID + `"}`, "invalid", "items", 400},
		{"empty items", body(), "invalid", "items", 400},
		{"over 100", body(many...), "invalid", "items", 400},
		{"no instance", `{"items":[` + good + `]}`, "invalid", "instance_id", 400},
		{"zero task_id", body(good, `{"task_id":0,"lease_epoch":1}`), "invalid", "items[1].task_id", 400},
		{"no epoch", body(good, `{"task_id":`+itoa(task.TaskID)+`}`), "invalid", "items[1].lease_epoch", 400},
		{"negative epoch", body(`{"task_id":1,"lease_epoch":-1}`), "invalid", "items[0].lease_epoch", 400},
		{"bad result", body(good, `{"task_id":1,"lease_epoch":1,"result":"x`), "malformed_json", "", 400},
		{"string task_id", body(`{"task_id":"1","lease_epoch":1}`), "malformed_json", "task_id", 400},
		{"unknown field", body(`{"task_id":1,"lease_epoch":1,"error":"x"}`), "malformed_json", "error", 400},
		{"items not a list", `{"instance_id":"` + in.ID + `","items":{}}`, "malformed_json", "items", 400},
	}
	for _, c := range cases {
		r := b.do("POST", "/v1/tasks/complete", c.body, tok...)
		require.Equal(t, c.status, r.status, "%s: %s", c.name, r.body)
		code, msg := r.errorCode(t)
		require.Equal(t, c.code, code, "%s: %s", c.name, r.body)
		require.Contains(t, msg, c.field, c.name)
	}
	r := b.do("POST", "/v1/tasks/complete", body(good))
	require.Equal(t, http.StatusForbidden, r.status, "no token: %s", r.body)
	r = b.do("POST", "/v1/tasks/complete", body(good), "X-Vigil-Instance-Token", "wrong")
	require.Equal(t, http.StatusForbidden, r.status, "wrong token: %s", r.body)

	require.Equal(t, vigiltype.TaskRunning, b.task(task.TaskID).Status, "a bad batch completed a task")
	// The bounds themselves are accepted.
	r = b.do("POST", "/v1/tasks/complete", body(good), tok...)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	r = b.do("POST", "/v1/tasks/complete", body(many[:100]...), tok...)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
}

// Good and stale items in one batch: each gets its own outcome, in request
// order, and the stale one does not stop the others.
func TestCompleteBatchMixedItems(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.register("worker", 30)
	for range 3 {
		b.enqueue(`{"task_type":"sleep"}`)
	}
	held := b.claimBatch(in, 3, "sleep")
	require.Len(t, held, 3)
	// held[1] is released, so its epoch is stale.
	r := b.leaseOp(in, held[1].TaskID, held[1].LeaseEpoch, "release", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)

	body := `{"instance_id":"` + in.ID + `","items":[` +
		`{"task_id":` + itoa(held[2].TaskID) + `,"lease_epoch":` + itoa(held[2].LeaseEpoch) + `,"result":{"n":2}},` +
		`{"task_id":` + itoa(held[1].TaskID) + `,"lease_epoch":` + itoa(held[1].LeaseEpoch) + `},` +
		`{"task_id":999999,"lease_epoch":1},` +
		`{"task_id":` + itoa(held[0].TaskID) + `,"lease_epoch":` + itoa(held[0].LeaseEpoch) + `}]}`
	r = b.do("POST", "/v1/tasks/complete", body, "X-Vigil-Instance-Token", in.Token)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var out completeBatchAnswer
	r.decode(t, &out)
	require.Len(t, out.Results, 4)
	for i, id := range []int64{held[2].TaskID, held[1].TaskID, 999999, held[0].TaskID} {
		require.Equal(t, id, out.Results[i].TaskID, "result %d", i)
	}
	require.Nil(t, out.Results[0].Error)
	require.Equal(t, vigiltype.TaskCompleted, out.Results[0].Task.Status)
	require.JSONEq(t, `{"n":2}`, string(out.Results[0].Task.Result))
	require.Nil(t, out.Results[1].Task)
	require.Equal(t, "stale_epoch", out.Results[1].Error.Code)
	require.NotEmpty(t, out.Results[1].Error.Message)
	require.Equal(t, "not_found", out.Results[2].Error.Code)
	require.Nil(t, out.Results[3].Error)
	require.Equal(t, vigiltype.TaskCompleted, out.Results[3].Task.Status)

	require.Equal(t, vigiltype.TaskCompleted, b.task(held[2].TaskID).Status)
	require.Equal(t, vigiltype.TaskScheduled, b.task(held[1].TaskID).Status)
	require.Equal(t, vigiltype.TaskCompleted, b.task(held[0].TaskID).Status)
	require.Nil(t, b.process(in.ID).CurrentTaskID)

	// Another instance's lease is stale for this one, as a single complete.
	other := b.register("worker", 30)
	theirs := b.claimTask(other, "sleep")
	body = `{"instance_id":"` + in.ID + `","items":[{"task_id":` + itoa(theirs.TaskID) + `,"lease_epoch":` + itoa(theirs.LeaseEpoch) + `}]}`
	r = b.do("POST", "/v1/tasks/complete", body, "X-Vigil-Instance-Token", in.Token)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	out = completeBatchAnswer{}
	r.decode(t, &out)
	require.Equal(t, "stale_epoch", out.Results[0].Error.Code)
	require.Equal(t, vigiltype.TaskRunning, b.task(theirs.TaskID).Status)
}

// The single complete is answered as before batch completes.
func TestSingleCompleteUnchanged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.register("worker", 30)
	b.enqueue(`{"task_type":"sleep"}`)
	task := b.claimTask(in, "sleep")
	r := b.leaseOp(in, task.TaskID, task.LeaseEpoch, "complete", `,"result":{"ok":true}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var got vigiltype.Task
	r.decode(t, &got)
	require.Equal(t, vigiltype.TaskCompleted, got.Status)
	require.JSONEq(t, `{"ok":true}`, string(got.Result))
	var raw map[string]json.RawMessage
	r.decode(t, &raw)
	require.NotContains(t, raw, "results")
	// Completing it again with another result (none) is refused (DESIGN T8).
	r = b.leaseOp(in, task.TaskID, task.LeaseEpoch, "complete", "")
	require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
	code, _ := r.errorCode(t)
	require.Equal(t, "outcome_conflict", code)
}
