package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// TestMain runs the real main when re-executed by a test as the worker
// process (see TestWorkerCrashLeavesTheTaskToBeReclaimed).
func TestMain(m *testing.M) {
	if os.Getenv("WORKER_TEST_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

func TestParseConfig(t *testing.T) {
	t.Parallel()
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

	cfg, err := parseConfig(nil, env(nil), io.Discard)
	require.NoError(t, err)
	require.Equal(t, config{kind: "worker"}, cfg)

	cfg, err = parseConfig(nil, env(map[string]string{"VIGIL_KIND": "w2", "VIGIL_CRASH_PROB": "0.25"}), io.Discard)
	require.NoError(t, err)
	require.Equal(t, config{kind: "w2", crashProb: 0.25}, cfg)

	cfg, err = parseConfig([]string{"-crash-prob", "1", "-kind", "k"}, env(map[string]string{"VIGIL_CRASH_PROB": "0.25"}), io.Discard)
	require.NoError(t, err)
	require.Equal(t, config{kind: "k", crashProb: 1}, cfg, "flags win")

	for _, bad := range []string{"-0.1", "1.5", "NaN", "often"} {
		_, err := parseConfig(nil, env(map[string]string{"VIGIL_CRASH_PROB": bad}), io.Discard)
		require.EqualError(t, err, `VIGIL_CRASH_PROB="`+bad+`": must be a number from 0 to 1`)
	}
}

func sleepTask(t *testing.T, payload string) *vigilclient.Task {
	t.Helper()
	return &vigilclient.Task{Task: vigiltype.Task{TaskID: 7, TaskType: "sleep", Payload: json.RawMessage(payload)}, InstanceID: "inst-1"}
}

type exitCalled int

func TestSleepHandler(t *testing.T) {
	t.Parallel()
	w := &worker{log: slog.New(slog.DiscardHandler), exit: func(code int) { panic(exitCalled(code)) }, roll: func() float64 { return 0.5 }}

	res, err := w.sleep(context.Background(), sleepTask(t, `{"seconds":0}`))
	require.NoError(t, err)
	require.Equal(t, sleepResult{SleptS: 0, InstanceID: "inst-1", PID: os.Getpid()}, res)

	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(vigilclient.ErrLeaseLost)
	_, err = w.sleep(ctx, sleepTask(t, `{"seconds":3600}`))
	require.ErrorIs(t, err, vigilclient.ErrLeaseLost, "honours the context")

	res, err = w.sleep(ctx, sleepTask(t, `{"seconds":0.001,"ignore_cancel":true}`))
	require.NoError(t, err, "ignore_cancel sleeps through a cancelled context")
	require.Equal(t, 0.001, res.(sleepResult).SleptS)

	_, err = w.sleep(context.Background(), sleepTask(t, `{"seconds":-1}`))
	require.Error(t, err)
	_, err = w.sleep(context.Background(), sleepTask(t, `[]`))
	require.Error(t, err)

	w.crashProb = 0.6 // the roll (0.5) is under it: crash
	require.PanicsWithValue(t, exitCalled(3), func() { _, _ = w.sleep(context.Background(), sleepTask(t, `{"seconds":0}`)) })
	w.crashProb = 0.4
	_, err = w.sleep(context.Background(), sleepTask(t, `{"seconds":0}`))
	require.NoError(t, err)
}

func TestWorkerCompletesSleepTasks(t *testing.T) {
	srv := testserver.Start(t)
	t.Setenv("VIGIL_URL", srv.URL)
	t.Setenv("VIGIL_KIND", "")
	t.Setenv("VIGIL_CRASH_PROB", "")
	t.Setenv("VIGIL_WORKER_POLL_INTERVAL", "0.02")
	c, err := vigilclient.New([]string{srv.URL})
	require.NoError(t, err)
	ctx := context.Background()

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(runCtx, nil, slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	task, err := c.Enqueue(ctx, vigilclient.EnqueueParams{TaskType: "sleep", Payload: map[string]any{"seconds": 0.01}})
	require.NoError(t, err)
	var got *vigiltype.Task
	waitFor(t, "the sleep task to complete", func() bool {
		got, err = c.GetTask(ctx, task.TaskID)
		require.NoError(t, err)
		return got.Status == vigiltype.TaskCompleted
	})
	var res sleepResult
	require.NoError(t, json.Unmarshal(got.Result, &res))
	require.Equal(t, 0.01, res.SleptS)
	require.Equal(t, os.Getpid(), res.PID)
	require.Equal(t, *got.CompletedBy, res.InstanceID)

	p, err := c.ProcessStatus(ctx, "worker")
	require.NoError(t, err)
	require.Equal(t, res.InstanceID, p.InstanceID)

	cancel()
	select {
	case err := <-done:
		done <- err
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return")
	}
	p, err = c.GetProcess(ctx, res.InstanceID)
	require.NoError(t, err)
	require.Equal(t, vigiltype.ProcessStopped, p.Status)
}

// A worker with VIGIL_CRASH_PROB=1 dies right after claiming: status 3, no
// exit recorded, and the server takes the task back once the instance's
// alive window passes.
func TestWorkerCrashLeavesTheTaskToBeReclaimed(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t, testserver.WithSweepInterval(20*time.Millisecond))
	c, err := vigilclient.New([]string{srv.URL})
	require.NoError(t, err)
	ctx := context.Background()
	task, err := c.Enqueue(ctx, vigilclient.EnqueueParams{TaskType: "sleep", Payload: map[string]any{"seconds": 1}})
	require.NoError(t, err)

	cmd := exec.Command(os.Args[0]) // TestMain runs main()
	cmd.Env = append(os.Environ(), "WORKER_TEST_RUN_MAIN=1", "VIGIL_URL="+srv.URL, "VIGIL_KIND=crashy",
		"VIGIL_CRASH_PROB=1", "VIGIL_CRASHY_LIVENESS_INTERVAL=0.2", "VIGIL_CRASHY_POLL_INTERVAL=0.05")
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	require.True(t, errors.As(err, &exitErr), "worker output:\n%s", out)
	require.Equal(t, 3, exitErr.ExitCode(), "worker output:\n%s", out)
	require.Contains(t, string(out), "crashing on purpose")
	require.Contains(t, string(out), "msg=claimed")

	waitFor(t, "the reclaim", func() bool {
		got, err := c.GetTask(ctx, task.TaskID)
		require.NoError(t, err)
		return got.Reclaims == 1 && got.Status == vigiltype.TaskScheduled
	})
	p, err := c.ProcessStatus(ctx, "crashy")
	require.NoError(t, err)
	require.Equal(t, vigiltype.ProcessStopped, p.Status)
	require.Nil(t, p.ExitedAt, "a crash records no exit")
}
