package httpapi_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/testserver"
)

// /metrics reports what the server saw, in Prometheus' text format, and
// the processes by kind and computed status.
func TestMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t, testserver.WithLeaseTimeout(time.Minute))
	in := b.register("worker", 30)
	b.register("critic", 10)
	b.liveness(in)
	b.enqueue(`{"task_type":"sleep"}`)
	task := b.claimTask(in, "sleep")
	require.Equal(t, http.StatusOK, b.beat(in, task, activityAt(b.clock.Now())).status)
	require.Equal(t, http.StatusOK, b.do("GET", "/healthz", "").status)
	r := b.do("POST", "/v1/events", `{"agent":"worker","kind":"exit","exit_code":1}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	b.clock.Advance(31 * time.Second) // the critic (10s interval) is stopped now
	b.clock.Advance(time.Minute)      // and the lease expired
	_, err := b.srv.Lease.Reclaim(context.Background())
	require.NoError(t, err)

	r = b.do("GET", "/metrics", "")
	require.Equal(t, http.StatusOK, r.status)
	body := string(r.body)
	for _, want := range []string{
		`vigil_heartbeats_received_total{schema_version="1",type="liveness"} 1`,
		`vigil_heartbeats_received_total{schema_version="2",type="lease"} 1`,
		`vigil_leases_claimed_total 1`,
		`vigil_process_events_total{kind="exit"} 1`,
		`vigil_processes{kind="critic",status="stopped"} 1`,
		`vigil_processes{kind="worker",status="stopped"} 1`,
		`vigil_http_request_duration_seconds_count{code="200",method="GET",route="GET /healthz"} 1`,
		`vigil_http_request_duration_seconds_count{code="201",method="POST",route="POST /v1/events"} 1`,
	} {
		require.Contains(t, body, want)
	}
	require.Contains(t, body, "vigil_leases_reclaimed_total 1")
}
