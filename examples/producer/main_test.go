package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

func TestProducer(t *testing.T) {
	srv := testserver.Start(t)
	t.Setenv("VIGIL_URL", srv.URL)
	t.Setenv("VIGIL_KIND", "")
	t.Setenv("VIGIL_PRODUCER_EVERY", "0.02")
	c, err := vigilclient.New([]string{srv.URL})
	require.NoError(t, err)
	ctx := context.Background()

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(runCtx, slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	var page *vigilclient.TaskPage
	waitFor(t, "three enqueued tasks", func() bool {
		page, err = c.ListTasks(ctx, vigilclient.ListTasksParams{TaskType: "sleep"})
		require.NoError(t, err)
		return len(page.Tasks) >= 3
	})
	for _, task := range page.Tasks {
		var p struct {
			Seconds int `json:"seconds"`
		}
		require.NoError(t, json.Unmarshal(task.Payload, &p))
		require.GreaterOrEqual(t, p.Seconds, 1)
		require.LessOrEqual(t, p.Seconds, 5)
	}

	p, err := c.ProcessStatus(ctx, "producer")
	require.NoError(t, err)
	require.Equal(t, vigiltype.ProcessAlive, p.Status, "the producer keeps its own liveness row")

	cancel()
	select {
	case err := <-done:
		done <- err
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return")
	}
	p, err = c.GetProcess(ctx, p.InstanceID)
	require.NoError(t, err)
	require.Equal(t, vigiltype.ProcessStopped, p.Status)
}

func TestProducerRejectsABadPeriod(t *testing.T) {
	t.Setenv("VIGIL_PRODUCER_EVERY", "-1")
	err := run(context.Background(), slog.New(slog.DiscardHandler))
	require.EqualError(t, err, `VIGIL_PRODUCER_EVERY="-1": must be a positive duration like 3s`)
}
