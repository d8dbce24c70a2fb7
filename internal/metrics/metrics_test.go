package metrics_test

import (
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// Every metric vigil serves passes client_golang's linter (the rules of
// `promtool check metrics`): names, units, _total suffixes, help texts.
// Each of vigil's own families is fed first, so that none is linted empty,
// and both the registry and the /metrics text are linted.
func TestMetricsLint(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	ctx := t.Context()
	c, err := vigilclient.New([]string{srv.URL})
	require.NoError(t, err)

	reg, err := c.RegisterProcess(ctx, vigilclient.RegisterParams{
		ProcessKind: "worker", Hostname: "h", PID: os.Getpid(), LivenessInterval: time.Minute,
	})
	require.NoError(t, err)
	inst := reg.Instance()
	_, err = c.ProcessHeartbeat(ctx, inst)
	require.NoError(t, err)
	_, err = c.Enqueue(ctx, vigilclient.EnqueueParams{TaskType: "work"})
	require.NoError(t, err)
	task, err := c.Claim(ctx, inst, []string{"work"})
	require.NoError(t, err)
	require.NotNil(t, task)
	_, err = c.TaskHeartbeat(ctx, vigilclient.Lease{Instance: inst, TaskID: task.TaskID, Epoch: task.LeaseEpoch})
	require.NoError(t, err)
	code := 1
	_, err = c.RecordEvent(ctx, vigilclient.EventParams{Agent: "worker", Kind: vigiltype.EventExit, ExitCode: &code})
	require.NoError(t, err)
	srv.Metrics.Restarted("worker")
	srv.Metrics.StallKilled("worker")

	mfs, err := srv.Metrics.Gatherer().Gather()
	require.NoError(t, err)
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	for _, want := range []string{
		"vigil_processes", "vigil_heartbeats_received_total", "vigil_leases_claimed_total",
		"vigil_leases_reclaimed_total", "vigil_process_events_total", "vigil_http_request_duration_seconds",
		"vigil_restarts_total", "vigil_stall_kills_total",
	} {
		require.Contains(t, names, want)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	require.NoError(t, err)
	require.Empty(t, problems, "the registry")

	resp, err := http.Get(srv.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	problems, err = promlint.New(resp.Body).Lint()
	require.NoError(t, err)
	require.Empty(t, problems, "/metrics as served")
}
