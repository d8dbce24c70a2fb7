package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/httpapi"
	"github.com/vigil-fleet/vigil/internal/snapshot"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// registerAt registers an instance of kind with a real host and pid.
func (b *testBundle) registerAt(kind, host string, pid int) instance {
	b.t.Helper()
	body, _ := json.Marshal(map[string]any{"process_kind": kind, "hostname": host, "pid": pid, "liveness_interval_s": 10})
	r := b.do("POST", "/v1/processes", string(body))
	require.Equal(b.t, http.StatusCreated, r.status, "%s", r.body)
	var reg struct {
		InstanceID    string `json:"instance_id"`
		InstanceToken string `json:"instance_token"`
	}
	r.decode(b.t, &reg)
	return instance{ID: reg.InstanceID, Token: reg.InstanceToken}
}

func (b *testBundle) registerAgent(name string) {
	b.t.Helper()
	r := b.do("POST", "/v1/agents", `{"name":"`+name+`"}`)
	require.Equal(b.t, http.StatusCreated, r.status, "%s", r.body)
}

func (b *testBundle) snapshot() (snapshot.Snapshot, map[string]*snapshot.Agent) {
	b.t.Helper()
	return getSnapshot(b.t, b.srv.URL)
}

func getSnapshot(t *testing.T, url string) (snapshot.Snapshot, map[string]*snapshot.Agent) {
	t.Helper()
	resp, err := http.Get(url + "/v1/snapshot")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	var s snapshot.Snapshot
	require.NoError(t, json.Unmarshal(body, &s), "%s", body)
	rows := map[string]*snapshot.Agent{}
	for _, r := range s.Agents {
		if r.Source == snapshot.SourceRegistry {
			rows[r.Agent] = r
		}
	}
	return s, rows
}

func hostname(t *testing.T) string {
	t.Helper()
	h, err := os.Hostname()
	require.NoError(t, err)
	return h
}

// DESIGN F1–F5 through the API: the self row first, then one row per
// registry record, each with its three states.
func TestSnapshot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	host := hostname(t)

	// An instance registered an hour before this test process existed: the
	// pid now belongs to another process (reuse) and does not count.
	b.clock.Set(time.Now().Add(-time.Hour))
	b.registerAgent("reused")
	b.registerAt("reused", host, os.Getpid())

	b.clock.Set(time.Now())
	b.registerAgent("local")
	local := b.registerAt("local", host, os.Getpid())
	b.registerAgent("absent")
	b.registerAgent("paused")
	b.registerAt("paused", host, os.Getpid())
	require.Equal(t, http.StatusOK, b.do("POST", "/v1/agents/paused/mark-stopped", "").status)
	b.registerAgent("remote")
	b.registerAt("remote", "far-away-host", os.Getpid())
	r := b.do("POST", "/v1/events", `{"agent":"absent","kind":"exit","exit_code":1}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)

	s, rows := b.snapshot()
	require.Equal(t, host, s.Hostname)
	require.Len(t, s.Agents, 1+5)
	self := s.Agents[0]
	require.Equal(t, snapshot.SourceSelf, self.Source)
	require.Equal(t, snapshot.DeclaredSelfSupervising, self.DeclaredStatus)
	require.Equal(t, snapshot.ProcessRunning, self.ProcessState)

	check := func(name string, declared string, ps snapshot.ProcessState, st snapshot.OperationalState) {
		t.Helper()
		row := rows[name]
		require.NotNil(t, row, name)
		require.Equal(t, declared, row.DeclaredStatus, name)
		require.Equal(t, ps, row.ProcessState, name)
		require.Equal(t, st, row.OperationalState, name)
		require.Empty(t, row.TelemetryErrors, name)
	}
	check("reused", "active", snapshot.ProcessNotRunning, snapshot.StateDown)
	check("local", "active", snapshot.ProcessRunning, snapshot.StateIdle)
	check("absent", "active", snapshot.ProcessNotRunning, snapshot.StateDown)
	check("paused", "stopped", snapshot.ProcessRunning, snapshot.StateStopped)
	check("remote", "active", snapshot.ProcessRunning, snapshot.StateIdle)
	require.Equal(t, snapshot.SignalLiveness, rows["remote"].ProcessSignal)
	require.Equal(t, snapshot.SignalOS, rows["local"].ProcessSignal)
	require.NotNil(t, rows["absent"].LatestProcessEvent)
	require.Equal(t, vigiltype.EventExit, rows["absent"].LatestProcessEvent.Kind)
	require.Nil(t, rows["local"].LatestProcessEvent)

	// The local instance takes a task: working. The remote one misses its
	// heartbeats: its liveness rows say stopped, so down.
	task := b.enqueue(`{"task_type":"crawl"}`)
	b.claimTask(local, "crawl")
	b.clock.Advance(31 * time.Second)
	_, rows = b.snapshot()
	check("local", "active", snapshot.ProcessRunning, snapshot.StateWorking)
	require.Equal(t, []snapshot.TaskRef{{TaskID: task.TaskID, TaskType: "crawl"}}, rows["local"].RunningTasks)
	check("remote", "active", snapshot.ProcessNotRunning, snapshot.StateDown)
}

// A real process that is killed shows down once the discovery cache (7.5s
// on the server clock) lets the OS be asked again.
func TestSnapshotProcessKilled(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("sleep"); err != nil {
		t.Skip("no sleep command")
	}
	b := setup(t)
	b.clock.Set(time.Now())
	cmd := exec.Command("sleep", "1000")
	require.NoError(t, cmd.Start())
	reaped := false
	t.Cleanup(func() {
		if !reaped {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	b.registerAgent("sleeper")
	b.registerAt("sleeper", hostname(t), cmd.Process.Pid)

	_, rows := b.snapshot()
	require.Equal(t, snapshot.ProcessRunning, rows["sleeper"].ProcessState)
	require.Equal(t, snapshot.StateIdle, rows["sleeper"].OperationalState)

	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait() // reap it: "signal: killed"
	reaped = true

	_, rows = b.snapshot()
	require.Equal(t, snapshot.ProcessRunning, rows["sleeper"].ProcessState, "the hit is cached for 7.5s")

	b.clock.Advance(snapshot.DiscoveryCacheTTLDefault)
	_, rows = b.snapshot()
	require.Equal(t, snapshot.ProcessNotRunning, rows["sleeper"].ProcessState)
	require.Equal(t, snapshot.StateDown, rows["sleeper"].OperationalState)
}

type failingTasks struct{}

func (failingTasks) RunningTasks(context.Context, string) ([]*vigiltype.Task, error) {
	return nil, errors.New("tasks unreadable")
}

// A failed telemetry read wins (F3) and is listed, not swallowed.
func TestSnapshotTelemetryMissing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.clock.Set(time.Now())
	srv := b.srv
	snap, err := snapshot.New(snapshot.Config{
		Registry: srv.Registry, Liveness: srv.Liveness, Tasks: failingTasks{},
		Events: snapshot.EventLog(srv.Events), Clock: b.clock,
	})
	require.NoError(t, err)
	h, err := httpapi.New(httpapi.Config{
		Liveness: srv.Liveness, Lease: srv.Lease, Registry: srv.Registry, Events: srv.Events,
		Snapshot: snap, Store: srv.Store(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)

	b.registerAgent("blind")
	b.registerAt("blind", hostname(t), os.Getpid())
	_, rows := getSnapshot(t, ts.URL)
	row := rows["blind"]
	require.Equal(t, snapshot.ProcessRunning, row.ProcessState)
	require.Equal(t, snapshot.StateTelemetryMissing, row.OperationalState)
	require.Equal(t, []string{"read running tasks: tasks unreadable"}, row.TelemetryErrors)
}
