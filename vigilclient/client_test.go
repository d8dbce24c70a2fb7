package vigilclient_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func register(t *testing.T, c *vigilclient.Client, kind string) *vigilclient.Registration {
	t.Helper()
	reg, err := c.RegisterProcess(context.Background(), vigilclient.RegisterParams{
		ProcessKind: kind, Hostname: "box1", PID: 4242, LivenessInterval: 30 * time.Second,
	})
	require.NoError(t, err)
	return reg
}

func TestClientProcesses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	c := b.client

	reg := register(t, c, "critic")
	require.NotEmpty(t, reg.InstanceID)
	require.NotEmpty(t, reg.InstanceToken)
	require.Equal(t, "critic", reg.ProcessKind)
	require.Equal(t, "box1", reg.Hostname)
	require.Equal(t, 4242, reg.PID)
	require.InDelta(t, 30, reg.LivenessIntervalS, 0)
	require.Equal(t, vigiltype.ProcessAlive, reg.Status)
	inst := reg.Instance()
	require.Equal(t, reg.InstanceID, inst.String(), "String shows the id, not the token")

	p, err := c.ProcessHeartbeat(ctx, inst)
	require.NoError(t, err)
	require.NotNil(t, p)
	require.False(t, p.LastHeartbeatAt.Before(reg.LastHeartbeatAt))

	_, err = c.ProcessHeartbeat(ctx, vigilclient.Instance{ID: inst.ID, Token: "wrong"})
	require.ErrorIs(t, err, vigiltype.ErrInvalidToken)
	var apiErr *vigilclient.APIError
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, 403, apiErr.Status)
	require.Equal(t, "invalid_token", apiErr.Code)

	got, err := c.GetProcess(ctx, inst.ID)
	require.NoError(t, err)
	require.Equal(t, inst.ID, got.InstanceID)

	_, err = c.GetProcess(ctx, "no-such-instance")
	require.ErrorIs(t, err, vigiltype.ErrNotFound)

	reg2 := register(t, c, "critic")
	register(t, c, "enrichment")

	latest, err := c.ProcessStatus(ctx, "critic")
	require.NoError(t, err)
	require.Equal(t, reg2.InstanceID, latest.InstanceID, "the most recently started instance")
	_, err = c.ProcessStatus(ctx, "never-registered")
	require.ErrorIs(t, err, vigiltype.ErrNotFound)

	// Pagination, newest first.
	page, err := c.ListProcesses(ctx, vigilclient.ListProcessesParams{Kind: "critic", Limit: 1})
	require.NoError(t, err)
	require.Len(t, page.Processes, 1)
	require.Equal(t, reg2.InstanceID, page.Processes[0].InstanceID)
	require.NotEmpty(t, page.NextCursor)
	page, err = c.ListProcesses(ctx, vigilclient.ListProcessesParams{Kind: "critic", Limit: 1, Cursor: page.NextCursor})
	require.NoError(t, err)
	require.Len(t, page.Processes, 1)
	require.Equal(t, inst.ID, page.Processes[0].InstanceID)

	// Exit: stopped at once, and filters see it.
	exited, err := c.ProcessExit(ctx, inst)
	require.NoError(t, err)
	require.Equal(t, vigiltype.ProcessStopped, exited.Status)
	require.NotNil(t, exited.ExitedAt)
	_, err = c.ProcessHeartbeat(ctx, inst)
	require.ErrorIs(t, err, vigiltype.ErrInstanceExited)

	page, err = c.ListProcesses(ctx, vigilclient.ListProcessesParams{Status: vigiltype.ProcessStopped})
	require.NoError(t, err)
	require.Len(t, page.Processes, 1)
	require.Equal(t, inst.ID, page.Processes[0].InstanceID)
	require.Empty(t, page.NextCursor)

	page, err = c.ListProcesses(ctx, vigilclient.ListProcessesParams{Host: "box1", Status: vigiltype.ProcessAlive})
	require.NoError(t, err)
	require.Len(t, page.Processes, 2)

	n, err := c.Prune(ctx, 24*time.Hour)
	require.NoError(t, err)
	require.Zero(t, n, "nothing is a day old")

	_, err = c.RegisterProcess(ctx, vigilclient.RegisterParams{ProcessKind: "bad kind!", Hostname: "h", PID: 1, LivenessInterval: time.Second})
	require.ErrorIs(t, err, vigiltype.ErrInvalid)
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, 400, apiErr.Status)
	require.Contains(t, apiErr.Message, "process_kind")

	require.NoError(t, c.Health(ctx))
}

func TestClientTasks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	c := b.client
	inst := register(t, c, "worker").Instance()

	claimed, err := c.Claim(ctx, inst, []string{"sleep"})
	require.NoError(t, err)
	require.Nil(t, claimed, "204: nothing claimable")

	task, err := c.Enqueue(ctx, vigilclient.EnqueueParams{
		TaskType: "sleep", Payload: map[string]any{"seconds": 2},
		MaxAttempts: 2, MaxReclaims: new(0), LeaseTimeout: 90 * time.Second,
	})
	require.NoError(t, err)
	require.Equal(t, vigiltype.TaskScheduled, task.Status)
	require.JSONEq(t, `{"seconds":2}`, string(task.Payload))
	require.Equal(t, 2, task.MaxAttempts)
	require.Equal(t, 0, task.MaxReclaims)
	require.InDelta(t, 90, task.LeaseTimeoutS, 0)

	delayed, err := c.Enqueue(ctx, vigilclient.EnqueueParams{TaskType: "sleep", Delay: time.Hour})
	require.NoError(t, err)
	require.JSONEq(t, `{}`, string(delayed.Payload), "payload defaults to {}")

	_, err = c.Enqueue(ctx, vigilclient.EnqueueParams{TaskType: "sleep", MaxAttempts: -1})
	require.ErrorIs(t, err, vigiltype.ErrInvalid)

	page, err := c.ListTasks(ctx, vigilclient.ListTasksParams{TaskType: "sleep", Limit: 1})
	require.NoError(t, err)
	require.Len(t, page.Tasks, 1)
	require.Equal(t, delayed.TaskID, page.Tasks[0].TaskID, "highest id first")
	require.NotEmpty(t, page.NextCursor)
	page, err = c.ListTasks(ctx, vigilclient.ListTasksParams{TaskType: "sleep", Cursor: page.NextCursor})
	require.NoError(t, err)
	require.Len(t, page.Tasks, 1)
	require.Equal(t, task.TaskID, page.Tasks[0].TaskID)
	require.Empty(t, page.NextCursor)

	claimed, err = c.Claim(ctx, inst, []string{"other", "sleep"})
	require.NoError(t, err)
	require.NotNil(t, claimed)
	require.Equal(t, task.TaskID, claimed.TaskID, "the delayed one is not claimable yet")
	require.Equal(t, vigiltype.TaskRunning, claimed.Status)
	require.Equal(t, int64(1), claimed.LeaseEpoch)
	require.NotNil(t, claimed.LeaseExpiresAt)
	require.Equal(t, 90*time.Second, claimed.LeaseExpiresAt.Sub(*claimed.LastHeartbeatAt), "the task's own window")
	lease := inst.Lease(claimed)

	proc, err := c.GetProcess(ctx, inst.ID)
	require.NoError(t, err)
	require.Equal(t, task.TaskID, *proc.CurrentTaskID, "the server sets current_task_id (DESIGN L6)")

	hb, err := c.TaskHeartbeat(ctx, lease)
	require.NoError(t, err)
	require.NotNil(t, hb)
	require.False(t, hb.LastHeartbeatAt.Before(*claimed.LastHeartbeatAt))

	_, err = c.TaskHeartbeat(ctx, vigilclient.Lease{Instance: inst, TaskID: task.TaskID, Epoch: 7})
	require.ErrorIs(t, err, vigiltype.ErrStaleEpoch)

	// Fail: back to scheduled, one attempt counted; the old epoch is stale.
	failed, err := c.Fail(ctx, lease, "boom", time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, vigiltype.TaskScheduled, failed.Status)
	require.Equal(t, 1, failed.Attempts)
	require.Equal(t, "boom", *failed.LastError)
	_, err = c.Complete(ctx, lease, nil)
	require.ErrorIs(t, err, vigiltype.ErrStaleEpoch)

	// Claim again (the 1ms retry delay passes while we wait), release.
	var again *vigiltype.Task
	waitFor(t, "the failed task to be claimable again", func() bool {
		again, err = c.Claim(ctx, inst, []string{"sleep"})
		require.NoError(t, err)
		return again != nil
	})
	require.Equal(t, int64(2), again.LeaseEpoch)
	released, err := c.Release(ctx, inst.Lease(again))
	require.NoError(t, err)
	require.Equal(t, vigiltype.TaskScheduled, released.Status)
	require.Equal(t, 1, released.Attempts, "release counts no attempt")

	// Claim and complete with a result.
	again, err = c.Claim(ctx, inst, []string{"sleep"})
	require.NoError(t, err)
	require.NotNil(t, again)
	done, err := c.Complete(ctx, inst.Lease(again), map[string]any{"ok": true})
	require.NoError(t, err)
	require.Equal(t, vigiltype.TaskCompleted, done.Status)
	require.JSONEq(t, `{"ok":true}`, string(done.Result))
	require.Equal(t, inst.ID, *done.CompletedBy)
	// The same complete again (its answer lost) gets the stored task; another
	// result is refused (DESIGN T8).
	repeated, err := c.Complete(ctx, inst.Lease(again), map[string]any{"ok": true})
	require.NoError(t, err, "the holder's repeated complete")
	require.Equal(t, done, repeated)
	_, err = c.Complete(ctx, inst.Lease(again), map[string]any{"ok": false})
	require.ErrorIs(t, err, vigiltype.ErrOutcomeConflict, "a finished task refuses another result")

	got, err := c.GetTask(ctx, task.TaskID)
	require.NoError(t, err)
	require.Equal(t, vigiltype.TaskCompleted, got.Status)
	_, err = c.GetTask(ctx, 999999)
	require.ErrorIs(t, err, vigiltype.ErrNotFound)

	_, err = c.Claim(ctx, vigilclient.Instance{ID: inst.ID, Token: "nope"}, []string{"sleep"})
	require.ErrorIs(t, err, vigiltype.ErrInvalidToken)

	sweepers, err := c.Sweepers(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, sweepers)
	require.Equal(t, vigiltype.SweeperKind, sweepers[0].Kind)

	var raw json.RawMessage = []byte(`[1,2]`)
	tRaw, err := c.Enqueue(ctx, vigilclient.EnqueueParams{TaskType: "raw", Payload: raw})
	require.NoError(t, err)
	require.JSONEq(t, `[1,2]`, string(tRaw.Payload))
}

// deadURL is a loopback URL on which nothing listens.
func deadURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return "http://" + addr
}

func TestClientFailsOverToTheNextURL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	dead := deadURL(t)

	c, err := vigilclient.New([]string{dead, b.srv.URL})
	require.NoError(t, err)
	require.Equal(t, []string{dead, b.srv.URL}, c.URLs())

	// A POST goes to the next URL too: the connection was refused, so the
	// first server never saw the request.
	reg, err := c.RegisterProcess(ctx, vigilclient.RegisterParams{ProcessKind: "k", Hostname: "h", PID: 1, LivenessInterval: time.Second})
	require.NoError(t, err)
	require.Equal(t, []string{b.srv.URL, dead}, c.URLs(), "the URL that answered is tried first from now on")

	_, err = c.GetProcess(ctx, reg.InstanceID)
	require.NoError(t, err)

	only, err := vigilclient.New([]string{dead})
	require.NoError(t, err)
	err = only.Health(ctx)
	require.Error(t, err)
	require.Contains(t, err.Error(), "no server reachable")
	var apiErr *vigilclient.APIError
	require.False(t, errors.As(err, &apiErr))
}

func TestClientServerToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("s3cret-0123456789\n"), 0o600))
	b := setup(t, testserver.WithTokenFile(tokenFile))

	_, err := b.client.Sweepers(ctx)
	require.ErrorIs(t, err, vigiltype.ErrUnauthorized)

	c, err := vigilclient.New([]string{b.srv.URL}, vigilclient.WithToken("s3cret-0123456789"))
	require.NoError(t, err)
	_, err = c.Sweepers(ctx)
	require.NoError(t, err)
}

func TestNewFromEnv(t *testing.T) {
	ctx := context.Background()
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("tok-0123456789abcdef"), 0o600))
	b := setup(t, testserver.WithTokenFile(tokenFile))

	t.Setenv("VIGIL_URL", deadURL(t)+","+b.srv.URL)
	t.Setenv("VIGIL_TOKEN_FILE", tokenFile)
	c, err := vigilclient.NewFromEnv()
	require.NoError(t, err)
	_, err = c.Sweepers(ctx)
	require.NoError(t, err)
}

// Every write says Content-Type: application/json, a bodyless one (a
// liveness heartbeat, an exit, mark-stopped) too, and a read says nothing:
// the server refuses a /v1 write of any other type (415).
func TestClientSendsJSONContentTypeOnEveryWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var mu sync.Mutex
	seen := map[string]string{} // "METHOD path" → Content-Type
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.Method+" "+r.URL.Path] = r.Header.Get("Content-Type")
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"instance_id":"i1","name":"a"}`))
	}))
	t.Cleanup(srv.Close)
	c, err := vigilclient.New([]string{srv.URL})
	require.NoError(t, err)
	inst := vigilclient.Instance{ID: "i1", Token: "t"}
	_, err = c.ProcessHeartbeat(ctx, inst)
	require.NoError(t, err)
	_, err = c.MarkAgent(ctx, "a", vigiltype.AgentStopped)
	require.NoError(t, err)
	_, _ = c.GetProcess(ctx, "i1")

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]string{
		"POST /v1/processes/i1/heartbeat": "application/json",
		"POST /v1/agents/a/mark-stopped":  "application/json",
		"GET /v1/processes/i1":            "",
	}, seen)
}
