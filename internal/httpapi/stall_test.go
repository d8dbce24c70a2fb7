package httpapi_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// DESIGN S4: a supervisor lists the tasks of its agent's kind running past
// stall_after and takes them back by compare-and-swap on the epoch.
func TestStalledTasks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	research, other := b.register("research", 3600), b.register("critic", 3600)
	b.enqueue(`{"task_type":"dig"}`)
	b.enqueue(`{"task_type":"dig"}`)
	b.enqueue(`{"task_type":"review"}`)
	old := b.claimTask(research, "dig")
	b.claimTask(other, "review")
	b.clock.Advance(20 * time.Minute)
	fresh := b.claimTask(research, "dig")
	b.clock.Advance(15 * time.Minute) // old: 35 min, fresh: 15 min

	r := b.do("GET", "/v1/tasks/stalled?kind=research", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var page struct {
		Tasks []vigiltype.Task `json:"tasks"`
	}
	r.decode(t, &page)
	require.Len(t, page.Tasks, 1, "only research's task past the default 30 min")
	require.Equal(t, old.TaskID, page.Tasks[0].TaskID)

	r = b.do("GET", "/v1/tasks/stalled?kind=research&after_s=600", "")
	r.decode(t, &page)
	require.Len(t, page.Tasks, 2)

	r = b.do("POST", "/v1/tasks/"+itoa(old.TaskID)+"/reclaim", `{"lease_epoch":`+itoa(old.LeaseEpoch)+`,"reason":"stall kill: running 35m"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	got := b.task(old.TaskID)
	require.Equal(t, vigiltype.TaskScheduled, got.Status)
	require.Nil(t, got.StartedAt)
	require.Equal(t, 1, got.Reclaims)
	require.Equal(t, "stall kill: running 35m", *got.LastError)

	// The same call again lost the race (the task moved on): 409, no change.
	r = b.do("POST", "/v1/tasks/"+itoa(old.TaskID)+"/reclaim", `{"lease_epoch":`+itoa(old.LeaseEpoch)+`,"reason":"again"}`)
	require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
	require.Equal(t, got, b.task(old.TaskID))
	require.Equal(t, vigiltype.TaskRunning, b.task(fresh.TaskID).Status)

	for _, c := range []struct{ method, path, body, msg string }{
		{"GET", "/v1/tasks/stalled", "", "kind: is required"},
		{"GET", "/v1/tasks/stalled?kind=research&after_s=-1", "", "after_s"},
		{"POST", "/v1/tasks/" + itoa(fresh.TaskID) + "/reclaim", `{"lease_epoch":` + itoa(fresh.LeaseEpoch) + `}`, "reason: is required"},
		{"POST", "/v1/tasks/" + itoa(fresh.TaskID) + "/reclaim", `{"reason":"x"}`, "lease_epoch"},
	} {
		r := b.do(c.method, c.path, c.body)
		require.Equal(t, http.StatusBadRequest, r.status, "%s %s: %s", c.method, c.path, r.body)
		_, msg := r.errorCode(t)
		require.Contains(t, msg, c.msg)
	}
	require.Equal(t, vigiltype.TaskRunning, b.task(fresh.TaskID).Status)
}
