package vigilclient_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func (b *testBundle) agent(kind string, handlers map[string]vigilclient.Handler, s vigilclient.Settings) *vigilclient.Agent {
	return &vigilclient.Agent{
		Kind: kind, Handlers: handlers, Settings: s, Client: b.client, Logger: b.logs.logger(),
		Hostname: "testhost",
	}
}

func (b *testBundle) process(t *testing.T, id string) *vigiltype.Process {
	t.Helper()
	p, err := b.client.GetProcess(context.Background(), id)
	require.NoError(t, err)
	return p
}

func (b *testBundle) task(t *testing.T, id int64) *vigiltype.Task {
	t.Helper()
	task, err := b.client.GetTask(context.Background(), id)
	require.NoError(t, err)
	return task
}

func (b *testBundle) enqueue(t *testing.T, p vigilclient.EnqueueParams) *vigiltype.Task {
	t.Helper()
	task, err := b.client.Enqueue(context.Background(), p)
	require.NoError(t, err)
	return task
}

func id(n int64) string { return strconv.FormatInt(n, 10) }

func TestAgentLivenessKeepsTheRowAlive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// 700ms: an alive window of 2.1s outlasts a slow round trip on a
	// loaded machine.
	a := b.agent("ticker", nil, vigilclient.Settings{LivenessInterval: 700 * time.Millisecond})
	run := start(t, a)
	inst := a.InstanceID()

	p := b.process(t, inst)
	require.Equal(t, "ticker", p.ProcessKind)
	require.Equal(t, "testhost", p.Hostname)
	require.InDelta(t, 0.7, p.LivenessIntervalS, 1e-9)

	// Well past two alive windows, the row is still alive: the tick renews it.
	window := vigiltype.AliveWindow(p.LivenessIntervalS)
	waitFor(t, "heartbeats past two alive windows", func() bool {
		p = b.process(t, inst)
		require.Equal(t, vigiltype.ProcessAlive, p.Status, "never stopped while the agent runs")
		return p.LastHeartbeatAt.Sub(p.StartedAt) > 2*window
	})

	require.NoError(t, run.stop(t))
	p = b.process(t, inst)
	require.Equal(t, vigiltype.ProcessStopped, p.Status, "stopped at once after Run returns")
	require.NotNil(t, p.ExitedAt)
	require.True(t, b.logs.has("exited", "instance_id", inst))
}

func TestAgentCompletesWithResult(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.agent("echoer", map[string]vigilclient.Handler{
		"echo": func(ctx context.Context, task *vigilclient.Task) (any, error) {
			var in struct {
				Text string `json:"text"`
			}
			if err := task.DecodePayload(&in); err != nil {
				return nil, err
			}
			return map[string]any{"echo": in.Text, "instance_id": task.InstanceID}, nil
		},
	}, vigilclient.Settings{PollInterval: 20 * time.Millisecond})
	start(t, a)

	task := b.enqueue(t, vigilclient.EnqueueParams{TaskType: "echo", Payload: map[string]string{"text": "hi"}})
	waitFor(t, "the task to complete", func() bool { return b.task(t, task.TaskID).Status == vigiltype.TaskCompleted })

	got := b.task(t, task.TaskID)
	require.JSONEq(t, fmt.Sprintf(`{"echo":"hi","instance_id":%q}`, a.InstanceID()), string(got.Result))
	require.Equal(t, a.InstanceID(), *got.CompletedBy)
	require.Zero(t, got.Attempts)
	require.True(t, b.logs.has("claimed", "task_id", id(task.TaskID), "task_type", "echo"))
	b.logs.wait(t, "completed", "task_id", id(task.TaskID))

	// The server cleared current_task_id itself (DESIGN L6).
	waitFor(t, "current_task_id cleared", func() bool { return b.process(t, a.InstanceID()).CurrentTaskID == nil })
}

func TestAgentRecordsHandlerFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.agent("failer", map[string]vigilclient.Handler{
		"err":   func(context.Context, *vigilclient.Task) (any, error) { return nil, errors.New("disk full") },
		"panic": func(context.Context, *vigilclient.Task) (any, error) { panic("oops") },
		"unmarshalable": func(context.Context, *vigilclient.Task) (any, error) {
			return make(chan int), nil
		},
	}, vigilclient.Settings{PollInterval: 20 * time.Millisecond})
	start(t, a)

	for typ, want := range map[string]string{
		"err":           "disk full",
		"panic":         "handler panicked: oops",
		"unmarshalable": "marshal result: json: unsupported type: chan int",
	} {
		task := b.enqueue(t, vigilclient.EnqueueParams{TaskType: typ, MaxAttempts: 1})
		waitFor(t, typ+" to be dead-lettered", func() bool { return b.task(t, task.TaskID).Status == vigiltype.TaskDeadLetter })
		got := b.task(t, task.TaskID)
		require.Equal(t, 1, got.Attempts, typ)
		require.Equal(t, want, *got.LastError, typ)
		b.logs.wait(t, "failure recorded", "task_id", id(task.TaskID), "error", want)
	}
}

func TestAgentRenewsTheLease(t *testing.T) {
	t.Parallel()
	// Heartbeats every 150ms; a lease window of 2s leaves room for several
	// slow ones on a loaded machine (a -race round trip beside another
	// suite can take a second).
	leaseTimeout := 2 * time.Second
	b := setup(t, testserver.WithLeaseTimeout(leaseTimeout), testserver.WithSweepInterval(20*time.Millisecond))

	finish := make(chan struct{})
	a := b.agent("renewer", map[string]vigilclient.Handler{
		"long": func(ctx context.Context, _ *vigilclient.Task) (any, error) {
			select {
			case <-finish:
				return "done", nil
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		},
	}, vigilclient.Settings{HeartbeatInterval: 150 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	start(t, a)

	task := b.enqueue(t, vigilclient.EnqueueParams{TaskType: "long"})
	var claimed *vigiltype.Task
	waitFor(t, "the claim", func() bool { claimed = b.task(t, task.TaskID); return claimed.Status == vigiltype.TaskRunning })

	// The lease outlives two of its own windows: it is renewed.
	waitFor(t, "the lease renewed past two windows", func() bool {
		cur := b.task(t, task.TaskID)
		require.Equal(t, vigiltype.TaskRunning, cur.Status)
		require.Equal(t, claimed.LeaseEpoch, cur.LeaseEpoch, "never reclaimed")
		return cur.LastHeartbeatAt.Sub(*claimed.StartedAt) > 2*leaseTimeout
	})
	close(finish)
	waitFor(t, "completion", func() bool { return b.task(t, task.TaskID).Status == vigiltype.TaskCompleted })
	require.Zero(t, b.task(t, task.TaskID).Reclaims)
	require.False(t, b.logs.has("lease lost"))
}

// A handler that reports activity makes the runtime's lease heartbeats v2,
// carrying the activity time (DESIGN T4); before that they are v1.
func TestAgentReportsActivity(t *testing.T) {
	t.Parallel()
	b := setup(t)
	progress, reported, finish := make(chan struct{}), make(chan time.Time), make(chan struct{})
	a := b.agent("editor", map[string]vigilclient.Handler{
		"edit": func(ctx context.Context, task *vigilclient.Task) (any, error) {
			for _, step := range []chan struct{}{progress, finish} {
				select {
				case <-step:
				case <-ctx.Done():
					return nil, context.Cause(ctx)
				}
				if step == progress {
					task.Activity()
					reported <- time.Now()
				}
			}
			return "done", nil
		},
	}, vigilclient.Settings{HeartbeatInterval: 30 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	start(t, a)

	task := b.enqueue(t, vigilclient.EnqueueParams{TaskType: "edit"})
	waitFor(t, "a v1 heartbeat", func() bool { return b.task(t, task.TaskID).HeartbeatSchemaVersion == 1 })
	close(progress)
	at := <-reported
	waitFor(t, "a v2 heartbeat with the activity", func() bool {
		cur := b.task(t, task.TaskID)
		return cur.HeartbeatSchemaVersion == 2 && cur.LastActivityAt != nil && cur.LastActivityAt.After(*cur.StartedAt)
	})
	cur := b.task(t, task.TaskID)
	require.WithinDuration(t, at, *cur.LastActivityAt, time.Second, "the reported time, as the server keeps it")
	close(finish)
	waitFor(t, "completion", func() bool { return b.task(t, task.TaskID).Status == vigiltype.TaskCompleted })
}

func TestAgentCancelsTheHandlerWhenTheLeaseIsLost(t *testing.T) {
	t.Parallel()
	b := setup(t, testserver.WithLeaseTimeout(300*time.Millisecond), testserver.WithSweepInterval(20*time.Millisecond))

	type firstRun struct {
		epoch int64
		cause error
	}
	first := make(chan firstRun, 1)
	var calls atomic.Int32
	a := b.agent("holder", map[string]vigilclient.Handler{
		"block": func(ctx context.Context, task *vigilclient.Task) (any, error) {
			if calls.Add(1) > 1 {
				return map[string]int64{"epoch": task.LeaseEpoch}, nil // the re-claimed run finishes
			}
			<-ctx.Done() // the heartbeat interval (1h) never renews the 300ms lease
			// Wait until the server has reclaimed the task, so the
			// completion below meets a stale epoch.
			for {
				cur, err := b.client.GetTask(context.Background(), task.TaskID)
				if err != nil {
					return nil, err
				}
				if cur.LeaseEpoch != task.LeaseEpoch || cur.Status != vigiltype.TaskRunning {
					break
				}
				select {
				case <-time.After(10 * time.Millisecond):
				case <-time.After(waitTimeout):
					return nil, errors.New("never reclaimed")
				}
			}
			first <- firstRun{epoch: task.LeaseEpoch, cause: context.Cause(ctx)}
			return "too late", nil
		},
	}, vigilclient.Settings{HeartbeatInterval: time.Hour, PollInterval: 20 * time.Millisecond})
	start(t, a)

	task := b.enqueue(t, vigilclient.EnqueueParams{TaskType: "block"})
	got := recv(t, "the first handler run to end", first)
	require.ErrorIs(t, got.cause, vigilclient.ErrLeaseLost)
	require.True(t, b.logs.has("lease lost", "task_id", id(task.TaskID), "lease_epoch", id(got.epoch)))
	b.logs.wait(t, "complete refused: lease lost (stale epoch)", "task_id", id(task.TaskID), "lease_epoch", id(got.epoch))

	// The server reclaimed the task and the agent claimed it again at a
	// new epoch; the stale completion changed nothing.
	waitFor(t, "the re-claimed run to complete", func() bool { return b.task(t, task.TaskID).Status == vigiltype.TaskCompleted })
	final := b.task(t, task.TaskID)
	require.GreaterOrEqual(t, final.Reclaims, 1)
	require.Greater(t, final.LeaseEpoch, got.epoch)
	require.JSONEq(t, fmt.Sprintf(`{"epoch":%d}`, final.LeaseEpoch), string(final.Result))
}

func TestAgentDrainReleasesAnUnfinishedTask(t *testing.T) {
	t.Parallel()
	b := setup(t)

	started := make(chan struct{})
	cause := make(chan error, 1)
	a := b.agent("drainer", map[string]vigilclient.Handler{
		"block": func(ctx context.Context, _ *vigilclient.Task) (any, error) {
			close(started)
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return nil, ctx.Err()
		},
	}, vigilclient.Settings{PollInterval: 20 * time.Millisecond})
	a.DrainGrace = 50 * time.Millisecond
	run := start(t, a)
	inst := a.InstanceID()

	task := b.enqueue(t, vigilclient.EnqueueParams{TaskType: "block"})
	recv(t, "the handler to start", started)

	require.NoError(t, run.stop(t))
	require.ErrorIs(t, recv(t, "the handler's cause", cause), vigilclient.ErrDraining)

	// Right after Run returns: the task is back to scheduled with nothing
	// counted, and the instance shows stopped.
	got := b.task(t, task.TaskID)
	require.Equal(t, vigiltype.TaskScheduled, got.Status)
	require.Zero(t, got.Attempts)
	require.Zero(t, got.Reclaims)
	p := b.process(t, inst)
	require.Equal(t, vigiltype.ProcessStopped, p.Status)
	require.NotNil(t, p.ExitedAt)
	require.Nil(t, p.CurrentTaskID)
	require.True(t, b.logs.has("released", "task_id", id(task.TaskID)))
}

func TestAgentDrainLetsTheHandlerFinish(t *testing.T) {
	t.Parallel()
	b := setup(t)

	started := make(chan struct{})
	finish := make(chan struct{})
	a := b.agent("finisher", map[string]vigilclient.Handler{
		"work": func(ctx context.Context, _ *vigilclient.Task) (any, error) {
			close(started)
			<-finish // not ctx: stopping the agent does not cancel a draining handler
			return "finished", ctx.Err()
		},
	}, vigilclient.Settings{PollInterval: 20 * time.Millisecond})
	a.DrainGrace = waitTimeout
	run := start(t, a)

	task := b.enqueue(t, vigilclient.EnqueueParams{TaskType: "work"})
	recv(t, "the handler to start", started)
	run.cancel()
	b.logs.wait(t, "draining: waiting for the handler to finish", "task_id", id(task.TaskID))
	require.Equal(t, vigiltype.ProcessAlive, b.process(t, a.InstanceID()).Status, "alive while draining")
	close(finish)
	require.NoError(t, run.wait(t))

	got := b.task(t, task.TaskID)
	require.Equal(t, vigiltype.TaskCompleted, got.Status)
	require.JSONEq(t, `"finished"`, string(got.Result))
	require.Equal(t, vigiltype.ProcessStopped, b.process(t, a.InstanceID()).Status)
}

// outage is a reverse proxy to a real server that can be made to fail
// every request with 503, as a network partition would.
type outage struct {
	*httptest.Server
	down atomic.Bool
}

func newOutage(t *testing.T, target string) *outage {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(u)
	o := &outage{}
	o.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o.down.Load() {
			http.Error(w, "partitioned", http.StatusServiceUnavailable)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(o.Close)
	return o
}

func TestAgentFencesWhenLivenessFailsThenReregisters(t *testing.T) {
	t.Parallel()
	b := setup(t, testserver.WithSweepInterval(20*time.Millisecond))
	net := newOutage(t, b.srv.URL)
	hc := &http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second}
	t.Cleanup(hc.CloseIdleConnections)
	client, err := vigilclient.New([]string{net.URL}, vigilclient.WithHTTPClient(hc))
	require.NoError(t, err)

	causes := make(chan error, 1)
	var calls atomic.Int32
	a := b.agent("fenced", map[string]vigilclient.Handler{
		"block": func(ctx context.Context, task *vigilclient.Task) (any, error) {
			if calls.Add(1) > 1 {
				return "quick", nil // later runs, the re-claimed one included
			}
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return nil, context.Cause(ctx)
		},
	}, vigilclient.Settings{LivenessInterval: 400 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	a.Client = client
	start(t, a)
	old := a.InstanceID()

	blocked := b.enqueue(t, vigilclient.EnqueueParams{TaskType: "block"})
	waitFor(t, "the claim", func() bool { return b.task(t, blocked.TaskID).Status == vigiltype.TaskRunning })

	net.down.Store(true)
	require.ErrorIs(t, recv(t, "the handler to be cancelled", causes), vigilclient.ErrFenced)
	b.logs.wait(t, "handler cancelled: instance fenced", "task_id", id(blocked.TaskID))
	// The server, on its side, shows the old instance stopped and takes the
	// task back: nobody runs it unseen.
	waitFor(t, "the task to be reclaimed", func() bool { return b.task(t, blocked.TaskID).Reclaims == 1 })
	require.Equal(t, vigiltype.ProcessStopped, b.process(t, old).Status)

	net.down.Store(false)
	waitFor(t, "a new instance", func() bool { return a.InstanceID() != old })
	b.logs.wait(t, "re-registered after fence; resuming", "old_instance_id", old, "instance_id", a.InstanceID())
	// The fenced instance is marked exited once the outcome of the task it
	// held was sent (here refused: the server took the task back).
	waitFor(t, "the fenced instance to be marked exited", func() bool { return b.process(t, old).ExitedAt != nil })

	// Work resumes under the new instance: it claims the reclaimed task
	// again and completes it.
	waitFor(t, "work under the new instance", func() bool { return b.task(t, blocked.TaskID).Status == vigiltype.TaskCompleted })
	require.Equal(t, a.InstanceID(), *b.task(t, blocked.TaskID).CompletedBy)
}

func TestAgentRegistrationRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.agent("bad kind!", nil, vigilclient.Settings{})
	err := a.Run(context.Background())
	require.ErrorIs(t, err, vigiltype.ErrInvalid)
	require.Contains(t, err.Error(), "process_kind")
}

func TestAgentRejectsBadConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, a := range map[string]*vigilclient.Agent{
		"no kind":        {Client: b.client},
		"nil handler":    {Kind: "k", Client: b.client, Handlers: map[string]vigilclient.Handler{"x": nil}},
		"negative poll":  {Kind: "k", Client: b.client, Settings: vigilclient.Settings{PollInterval: -time.Second}},
		"negative drain": {Kind: "k", Client: b.client, DrainGrace: -time.Second},
	} {
		require.ErrorIs(t, a.Run(context.Background()), vigiltype.ErrInvalid, name)
	}
}

func TestAgentFromEnvRejectsBadSettings(t *testing.T) {
	for _, bad := range []string{"-1", "0", "abc", "NaN"} {
		t.Run(bad, func(t *testing.T) {
			t.Setenv("VIGIL_ENV_WORKER_LIVENESS_INTERVAL", bad)
			_, err := vigilclient.AgentFromEnv("env-worker", nil)
			require.EqualError(t, err, `VIGIL_ENV_WORKER_LIVENESS_INTERVAL="`+bad+`": must be a positive duration like 30s`)
			require.ErrorIs(t, err, vigiltype.ErrInvalid)
		})
	}
	t.Run("good", func(t *testing.T) {
		t.Setenv("VIGIL_ENV_WORKER_POLL_INTERVAL", "0.5")
		t.Setenv("VIGIL_URL", "http://127.0.0.1:1,http://127.0.0.1:2")
		a, err := vigilclient.AgentFromEnv("env-worker", nil)
		require.NoError(t, err)
		require.Equal(t, 500*time.Millisecond, a.Settings.PollInterval)
		require.Equal(t, vigilclient.LivenessIntervalDefault, a.Settings.LivenessInterval)
		require.Equal(t, []string{"http://127.0.0.1:1", "http://127.0.0.1:2"}, a.Client.URLs())
	})
}

// An agent told to stop while a handler runs lets it finish and then claims
// nothing more: the next task is never claimed (and so never released with
// its epoch bumped). Several rounds, because the old loop lost a coin toss.
func TestAgentStoppingClaimsNothingMore(t *testing.T) {
	t.Parallel()
	for round := range 6 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			started := make(chan struct{}, 1)
			finish := make(chan struct{})
			a := b.agent("stopper", map[string]vigilclient.Handler{
				"work": func(ctx context.Context, _ *vigilclient.Task) (any, error) {
					started <- struct{}{}
					<-finish
					return "done", nil
				},
			}, vigilclient.Settings{PollInterval: 20 * time.Millisecond})
			a.DrainGrace = waitTimeout
			run := start(t, a)

			first := b.enqueue(t, vigilclient.EnqueueParams{TaskType: "work"})
			recv(t, "the first handler to start", started)
			next := b.enqueue(t, vigilclient.EnqueueParams{TaskType: "work"})
			run.cancel()
			b.logs.wait(t, "draining: waiting for the handler to finish", "task_id", id(first.TaskID))
			close(finish)
			require.NoError(t, run.wait(t))

			require.Equal(t, vigiltype.TaskCompleted, b.task(t, first.TaskID).Status)
			got := b.task(t, next.TaskID)
			require.Equal(t, vigiltype.TaskScheduled, got.Status)
			require.Zero(t, got.LeaseEpoch, "never claimed after the stop")
		})
	}
}
