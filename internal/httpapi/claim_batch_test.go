package httpapi_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// claimBatch claims with max_tasks set to n and returns the batch.
func (b *testBundle) claimBatch(in instance, n int, types ...string) []vigiltype.Task {
	b.t.Helper()
	body, _ := json.Marshal(map[string]any{"instance_id": in.ID, "task_types": types, "max_tasks": n})
	r := b.do("POST", "/v1/tasks/claim", string(body), "X-Vigil-Instance-Token", in.Token)
	require.Equal(b.t, http.StatusOK, r.status, "%s", r.body)
	var out struct {
		Tasks []vigiltype.Task `json:"tasks"`
	}
	r.decode(b.t, &out)
	require.NotNil(b.t, out.Tasks, "tasks is a list, never null: %s", r.body)
	return out.Tasks
}

// A bad max_tasks is a 400 naming max_tasks, and nothing is claimed.
func TestClaimBatchBadMaxTasks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.register("worker", 30)
	task := b.enqueue(`{"task_type":"sleep"}`)
	tok := []string{"X-Vigil-Instance-Token", in.Token}
	claim := func(extra string) string {
		return `{"instance_id":"` + in.ID + `","task_types":["sleep"]` + extra + `}`
	}
	cases := []struct {
		name, body string
		headers    []string
	}{
		{"zero", claim(`,"max_tasks":0`), tok},
		{"negative", claim(`,"max_tasks":-3`), tok},
		{"over 100", claim(`,"max_tasks":101`), tok},
		{"huge", claim(`,"max_tasks":1e300`), tok},
		{"fraction", claim(`,"max_tasks":2.5`), tok},
		{"string", claim(`,"max_tasks":"5"`), tok},
		{"bool", claim(`,"max_tasks":true`), tok},
		{"null", claim(`,"max_tasks":null`), tok},
		{"list", claim(`,"max_tasks":[5]`), tok},
		{"with task_id", `{"instance_id":"` + in.ID + `","task_id":` + itoa(task.TaskID) + `,"max_tasks":5}`, tok},
		{"no token", claim(`,"max_tasks":0`), nil},
	}
	tasksBefore := string(b.do("GET", "/v1/tasks?limit=1000", "").body)
	for _, c := range cases {
		r := b.do("POST", "/v1/tasks/claim", c.body, c.headers...)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", c.name, r.body)
		code, msg := r.errorCode(t)
		require.Equal(t, "invalid", code, "%s: %s", c.name, r.body)
		require.Contains(t, msg, "max_tasks", c.name)
	}
	require.Equal(t, tasksBefore, string(b.do("GET", "/v1/tasks?limit=1000", "").body), "a bad max_tasks claimed a task")
	require.Nil(t, b.process(in.ID).CurrentTaskID)
	// The bounds themselves are accepted.
	require.Len(t, b.claimBatch(in, 100, "sleep"), 1)
	require.Empty(t, b.claimBatch(in, 1, "sleep"))
}

// Without max_tasks a claim is answered exactly as before batch claims: one
// task object, or 204 with no body.
func TestClaimWithoutMaxTasksUnchanged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.register("worker", 30)
	task := b.enqueue(`{"task_type":"sleep"}`)
	b.enqueue(`{"task_type":"sleep"}`)

	r := b.claim(in, "sleep")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var fields map[string]json.RawMessage
	r.decode(t, &fields)
	require.NotContains(t, fields, "tasks")
	require.Equal(t, itoa(task.TaskID), string(fields["task_id"]))
	require.Equal(t, "1", string(fields["lease_epoch"]))

	b.claimTask(in, "sleep")
	r = b.claim(in, "sleep")
	require.Equal(t, http.StatusNoContent, r.status, "%s", r.body)
	require.Empty(t, r.body)
}

// A batch claim answers {"tasks": […]}: up to max_tasks tasks in claim
// order, each running under its own lease at its own epoch, each completed
// on its own; an empty list when nothing is left.
func TestClaimBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.register("worker", 30)
	var ids []int64
	for range 5 {
		ids = append(ids, b.enqueue(`{"task_type":"sleep"}`).TaskID)
	}
	// One task goes through a claim and a release first: its next epoch is 2.
	first := b.claimTask(in, "sleep")
	r := b.leaseOp(in, first.TaskID, first.LeaseEpoch, "release", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)

	got := b.claimBatch(in, 3, "sleep")
	require.Len(t, got, 3)
	for i, task := range got {
		require.Equal(t, ids[i], task.TaskID)
		require.Equal(t, vigiltype.TaskRunning, task.Status)
		require.Equal(t, in.ID, *task.LeaseOwner)
		wantEpoch := int64(1)
		if task.TaskID == first.TaskID {
			wantEpoch = 2
		}
		require.Equal(t, wantEpoch, task.LeaseEpoch, "task %d", task.TaskID)
		require.Equal(t, task, b.task(task.TaskID))
	}
	require.Equal(t, got[2].TaskID, *b.process(in.ID).CurrentTaskID, "the last task taken is the current one")

	rest := b.claimBatch(in, 10, "sleep")
	require.Len(t, rest, 2)
	require.Equal(t, ids[3:], []int64{rest[0].TaskID, rest[1].TaskID})
	require.Empty(t, b.claimBatch(in, 10, "sleep"))

	// Each lease is its own: completing one leaves the others running, and
	// the old epoch of the released task is stale.
	for _, task := range append(got, rest...) {
		r := b.leaseOp(in, task.TaskID, task.LeaseEpoch, "complete", "")
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	}
	r = b.leaseOp(in, first.TaskID, first.LeaseEpoch, "complete", "")
	require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
	for _, id := range ids {
		require.Equal(t, vigiltype.TaskCompleted, b.task(id).Status)
	}

	// Errors are a single claim's: a bad token is refused.
	r = b.do("POST", "/v1/tasks/claim", `{"instance_id":"`+in.ID+`","task_types":["sleep"],"max_tasks":5}`,
		"X-Vigil-Instance-Token", "bad")
	require.Equal(t, http.StatusForbidden, r.status, "%s", r.body)
}

// Workers claiming in batches never hold one task at once.
func TestConcurrentBatchClaimsNeverShareATask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const tasks, workers = 300, 6
	for range tasks {
		b.enqueue(`{"task_type":"sleep"}`)
	}
	instances := make([]instance, workers)
	for i := range instances {
		instances[i] = b.register("worker", 30)
	}
	got := make([][]vigiltype.Task, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w, in := range instances {
		wg.Go(func() {
			for {
				body, _ := json.Marshal(map[string]any{"instance_id": in.ID, "task_types": []string{"sleep"}, "max_tasks": 1 + 7*w})
				req, _ := http.NewRequest("POST", b.srv.URL+"/v1/tasks/claim", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Vigil-Instance-Token", in.Token)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					errs[w] = err
					return
				}
				var out struct {
					Tasks []vigiltype.Task `json:"tasks"`
				}
				if resp.StatusCode != http.StatusOK {
					resp.Body.Close()
					errs[w] = fmt.Errorf("claim: HTTP %d", resp.StatusCode)
					return
				}
				err = json.NewDecoder(resp.Body).Decode(&out)
				resp.Body.Close()
				if err != nil {
					errs[w] = err
					return
				}
				if len(out.Tasks) == 0 {
					return
				}
				if len(out.Tasks) > 1+7*w {
					errs[w] = fmt.Errorf("batch of %d, max_tasks %d", len(out.Tasks), 1+7*w)
					return
				}
				got[w] = append(got[w], out.Tasks...)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	seen := map[int64]string{}
	for w, list := range got {
		for _, task := range list {
			prev, dup := seen[task.TaskID]
			require.False(t, dup, "task %d claimed twice: by %s and %s", task.TaskID, prev, instances[w].ID)
			require.Equal(t, int64(1), task.LeaseEpoch)
			require.Equal(t, instances[w].ID, *task.LeaseOwner)
			seen[task.TaskID] = instances[w].ID
		}
	}
	require.Len(t, seen, tasks, "every task is claimed exactly once")
}
