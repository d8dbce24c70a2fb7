package vigilclient_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func TestClientCompleteBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	inst := b.registerInstance(t)
	for range 3 {
		b.enqueue(t, vigilclient.EnqueueParams{TaskType: "work"})
	}
	held, err := b.client.ClaimBatch(ctx, inst, []string{"work"}, 3)
	require.NoError(t, err)
	require.Len(t, held, 3)
	_, err = b.client.Release(ctx, inst.Lease(held[1]))
	require.NoError(t, err)

	results, err := b.client.CompleteBatch(ctx, inst, []vigilclient.CompleteItem{
		{Lease: inst.Lease(held[2]), Result: map[string]int{"n": 2}},
		{Lease: inst.Lease(held[1])},
		{Lease: inst.Lease(held[0])},
	})
	require.NoError(t, err)
	require.Len(t, results, 3)
	require.NoError(t, results[0].Err)
	require.Equal(t, held[2].TaskID, results[0].Task.TaskID)
	require.Equal(t, vigiltype.TaskCompleted, results[0].Task.Status)
	require.JSONEq(t, `{"n":2}`, string(results[0].Task.Result))
	require.ErrorIs(t, results[1].Err, vigiltype.ErrStaleEpoch)
	require.Nil(t, results[1].Task)
	require.NoError(t, results[2].Err)
	require.Equal(t, vigiltype.TaskScheduled, b.task(t, held[1].TaskID).Status)

	// A malformed batch fails as a whole and completes nothing.
	_, err = b.client.CompleteBatch(ctx, inst, nil)
	require.ErrorIs(t, err, vigiltype.ErrInvalid)
	_, err = b.client.CompleteBatch(ctx, vigilclient.Instance{ID: inst.ID, Token: "wrong"},
		[]vigilclient.CompleteItem{{Lease: inst.Lease(held[1])}})
	require.ErrorIs(t, err, vigiltype.ErrInvalidToken)
}

// completeCounter counts the completion requests an agent sends: single
// (POST /v1/tasks/{id}/complete) and batch (POST /v1/tasks/complete).
type completeCounter struct {
	next          http.RoundTripper
	single, batch atomic.Int64
}

func (c *completeCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	switch {
	case r.URL.Path == "/v1/tasks/complete":
		c.batch.Add(1)
	case strings.HasSuffix(r.URL.Path, "/complete"):
		c.single.Add(1)
	}
	return c.next.RoundTrip(r)
}

// With Concurrency > 1, tasks that finish together are completed in one
// request, each with its own result; a task whose lease was lost meanwhile
// is refused alone, logged as a lost lease, and the others complete.
func TestAgentConcurrencyCompletesInBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const slots = 6
	counter := &completeCounter{next: &http.Transport{}}
	client, err := vigilclient.New([]string{b.srv.URL}, vigilclient.WithHTTPClient(&http.Client{Transport: counter, Timeout: 10 * time.Second}))
	require.NoError(t, err)

	var (
		mu      sync.Mutex
		started = map[int64]bool{}
		release = make(chan struct{})
		once    sync.Once
		victim  atomic.Int64
	)
	a := b.agent("batch-complete", map[string]vigilclient.Handler{
		"work": func(ctx context.Context, task *vigilclient.Task) (any, error) {
			mu.Lock()
			first := len(started) == 0
			started[task.TaskID] = true
			all := len(started) == slots
			mu.Unlock()
			if first && task.LeaseEpoch == 1 {
				// This task's lease is taken from the agent while it runs.
				_, err := b.client.ReclaimStalled(context.Background(), task.TaskID, task.LeaseEpoch, "test: take the lease")
				if err != nil {
					return nil, err
				}
				victim.Store(task.TaskID)
			}
			if all {
				once.Do(func() { close(release) })
			}
			select {
			case <-release:
			case <-ctx.Done():
			}
			return map[string]int64{"task": task.TaskID}, nil
		},
	}, vigilclient.Settings{PollInterval: 20 * time.Millisecond})
	a.Client = client
	a.Concurrency = slots

	var ids []int64
	for range slots {
		ids = append(ids, b.enqueue(t, vigilclient.EnqueueParams{TaskType: "work"}).TaskID)
	}
	start(t, a)
	for _, id := range ids {
		waitFor(t, "every task to complete", func() bool { return b.task(t, id).Status == vigiltype.TaskCompleted })
		got := b.task(t, id)
		require.JSONEq(t, `{"task":`+strconv.FormatInt(id, 10)+`}`, string(got.Result))
		require.Equal(t, a.InstanceID(), *got.CompletedBy)
	}
	lost := victim.Load()
	require.NotZero(t, lost)
	b.logs.wait(t, "complete refused: lease lost (stale epoch)", "task_id", strconv.FormatInt(lost, 10), "lease_epoch", "1")
	require.Equal(t, int64(2), b.task(t, lost).LeaseEpoch, "the taken task was claimed again and completed")
	require.NotZero(t, counter.batch.Load(), "no batch complete was sent")
	require.Less(t, counter.batch.Load()+counter.single.Load(), int64(slots+1), "completions were not batched")
}
