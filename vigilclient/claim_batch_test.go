package vigilclient_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func (b *testBundle) registerInstance(t *testing.T) vigilclient.Instance {
	t.Helper()
	reg, err := b.client.RegisterProcess(context.Background(), vigilclient.RegisterParams{
		ProcessKind: "batcher", Hostname: "testhost", PID: 1, LivenessInterval: time.Hour,
	})
	require.NoError(t, err)
	return reg.Instance()
}

func TestClientClaimBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	inst := b.registerInstance(t)
	var ids []int64
	for range 5 {
		ids = append(ids, b.enqueue(t, vigilclient.EnqueueParams{TaskType: "work"}).TaskID)
	}

	_, err := b.client.ClaimBatch(ctx, inst, []string{"work"}, 0)
	require.ErrorIs(t, err, vigiltype.ErrInvalid)
	_, err = b.client.ClaimBatch(ctx, inst, []string{"work"}, vigilclient.ClaimBatchMax+1)
	require.ErrorIs(t, err, vigiltype.ErrInvalid)
	require.Equal(t, vigiltype.TaskScheduled, b.task(t, ids[0]).Status, "a refused batch claims nothing")

	first, err := b.client.ClaimBatch(ctx, inst, []string{"work"}, 3)
	require.NoError(t, err)
	rest, err := b.client.ClaimBatch(ctx, inst, []string{"work"}, 10)
	require.NoError(t, err)
	require.Len(t, first, 3)
	require.Len(t, rest, 2)
	none, err := b.client.ClaimBatch(ctx, inst, []string{"work"}, 10)
	require.NoError(t, err)
	require.NotNil(t, none)
	require.Empty(t, none)

	for i, task := range append(first, rest...) {
		require.Equal(t, ids[i], task.TaskID)
		require.Equal(t, int64(1), task.LeaseEpoch)
		require.Equal(t, inst.ID, *task.LeaseOwner)
		// Each task is its own lease.
		_, err := b.client.TaskHeartbeat(ctx, inst.Lease(task))
		require.NoError(t, err)
		_, err = b.client.Complete(ctx, inst.Lease(task), i)
		require.NoError(t, err)
		require.Equal(t, vigiltype.TaskCompleted, b.task(t, task.TaskID).Status)
	}
}

// An agent with Concurrency n runs up to n tasks at once, never more, and
// each completes under its own lease.
func TestAgentConcurrencyRunsTasksAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const slots, total = 4, 12
	var (
		mu            sync.Mutex
		now, most     int
		release       = make(chan struct{})
		releaseClosed atomic.Bool
	)
	a := b.agent("parallel", map[string]vigilclient.Handler{
		"work": func(ctx context.Context, task *vigilclient.Task) (any, error) {
			mu.Lock()
			now++
			most = max(most, now)
			full := now == slots
			mu.Unlock()
			defer func() { mu.Lock(); now--; mu.Unlock() }()
			if full && releaseClosed.CompareAndSwap(false, true) {
				close(release) // all slots were busy at once: let every task finish
			}
			select {
			case <-release:
				return map[string]int64{"epoch": task.LeaseEpoch}, nil
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		},
	}, vigilclient.Settings{PollInterval: 20 * time.Millisecond})
	a.Concurrency = slots

	var ids []int64
	for range total {
		ids = append(ids, b.enqueue(t, vigilclient.EnqueueParams{TaskType: "work"}).TaskID)
	}
	start(t, a)
	for _, taskID := range ids {
		waitFor(t, "every task to complete", func() bool { return b.task(t, taskID).Status == vigiltype.TaskCompleted })
		got := b.task(t, taskID)
		require.Equal(t, int64(1), got.LeaseEpoch, "claimed once")
		require.JSONEq(t, `{"epoch":1}`, string(got.Result))
		require.Equal(t, a.InstanceID(), *got.CompletedBy)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, slots, most, "up to Concurrency tasks at once, never more")
}

// With Concurrency > 1, each task keeps its own lease: heartbeats renew
// every lease, and a lease lost on one task cancels that task's handler
// only.
func TestAgentConcurrencyLeasesAreIndependent(t *testing.T) {
	t.Parallel()
	// 10s: room for a server starved for seconds on a loaded machine (a
	// 500ms window, then a 2s one, lost leases under -race beside another
	// suite, issue #12 case 9). Renewals are what is checked, not a wait
	// past the window.
	leaseTimeout := 10 * time.Second
	b := setup(t, testserver.WithLeaseTimeout(leaseTimeout), testserver.WithSweepInterval(20*time.Millisecond))
	ctx := context.Background()

	finish := make(chan struct{})
	causes := make(chan error, 10)
	var runs atomic.Int32
	a := b.agent("leases", map[string]vigilclient.Handler{
		"long": func(ctx context.Context, task *vigilclient.Task) (any, error) {
			runs.Add(1)
			select {
			case <-finish:
				return task.LeaseEpoch, nil
			case <-ctx.Done():
				causes <- context.Cause(ctx)
				return nil, context.Cause(ctx)
			}
		},
	}, vigilclient.Settings{HeartbeatInterval: 100 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	a.Concurrency = 3
	// A failed assertion leaves the handlers blocked: the cleanup's cancel
	// then drains within a second, not the default 20s.
	a.DrainGrace = time.Second

	tasks := []*vigiltype.Task{
		b.enqueue(t, vigilclient.EnqueueParams{TaskType: "long"}),
		b.enqueue(t, vigilclient.EnqueueParams{TaskType: "long"}),
		b.enqueue(t, vigilclient.EnqueueParams{TaskType: "long"}),
	}
	start(t, a)
	claimed := make([]*vigiltype.Task, len(tasks))
	for i, task := range tasks {
		waitFor(t, "the claims", func() bool {
			claimed[i] = b.task(t, task.TaskID)
			return claimed[i].Status == vigiltype.TaskRunning
		})
	}
	// Every lease is renewed, each by its own heartbeats.
	for i, task := range tasks {
		waitFor(t, "the lease renewed several times", func() bool {
			cur := b.task(t, task.TaskID)
			require.Equal(t, vigiltype.TaskRunning, cur.Status)
			require.Equal(t, claimed[i].LeaseEpoch, cur.LeaseEpoch, "never reclaimed")
			return cur.LastHeartbeatAt.Sub(*claimed[i].StartedAt) > 5*100*time.Millisecond &&
				cur.LeaseExpiresAt.Sub(*claimed[i].LeaseExpiresAt) > 0
		})
	}

	// Take the first task away: only its handler is cancelled; the agent
	// claims it again at the next epoch.
	_, err := b.client.ReclaimStalled(ctx, tasks[0].TaskID, claimed[0].LeaseEpoch, "test")
	require.NoError(t, err)
	cause := recv(t, "the first task's handler to be cancelled", causes)
	require.ErrorIs(t, cause, vigilclient.ErrLeaseLost)
	waitFor(t, "the first task claimed again", func() bool {
		cur := b.task(t, tasks[0].TaskID)
		return cur.Status == vigiltype.TaskRunning && cur.LeaseEpoch > claimed[0].LeaseEpoch
	})
	for i := 1; i < len(tasks); i++ {
		cur := b.task(t, tasks[i].TaskID)
		require.Equal(t, vigiltype.TaskRunning, cur.Status)
		require.Equal(t, claimed[i].LeaseEpoch, cur.LeaseEpoch)
	}
	select {
	case err := <-causes:
		t.Fatalf("another handler was cancelled: %v", err)
	default:
	}

	close(finish)
	for _, task := range tasks {
		waitFor(t, "completion", func() bool { return b.task(t, task.TaskID).Status == vigiltype.TaskCompleted })
	}
	require.Equal(t, int32(4), runs.Load())
}

// A stopping agent with Concurrency > 1 drains every running task: each
// unfinished one is released with nothing counted.
func TestAgentConcurrencyDrainReleasesEveryTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan struct{}, 3)
	a := b.agent("drainers", map[string]vigilclient.Handler{
		"block": func(ctx context.Context, _ *vigilclient.Task) (any, error) {
			started <- struct{}{}
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), vigilclient.ErrDraining) {
				return nil, context.Cause(ctx)
			}
			return nil, ctx.Err()
		},
	}, vigilclient.Settings{PollInterval: 20 * time.Millisecond})
	a.DrainGrace = 50 * time.Millisecond
	a.Concurrency = 3
	var ids []int64
	for range 3 {
		ids = append(ids, b.enqueue(t, vigilclient.EnqueueParams{TaskType: "block"}).TaskID)
	}
	run := start(t, a)
	for range 3 {
		recv(t, "the handlers to start", started)
	}
	require.NoError(t, run.stop(t))
	for _, taskID := range ids {
		got := b.task(t, taskID)
		require.Equal(t, vigiltype.TaskScheduled, got.Status)
		require.Zero(t, got.Attempts)
		require.Zero(t, got.Reclaims)
		require.True(t, b.logs.has("released", "task_id", id(taskID)))
	}
}

func TestAgentRejectsNegativeConcurrency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := &vigilclient.Agent{Kind: "k", Client: b.client, Concurrency: -1}
	require.ErrorIs(t, a.Run(context.Background()), vigiltype.ErrInvalid)
}
