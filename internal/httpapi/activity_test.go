package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/lease"
	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func (b *testBundle) beat(in instance, task vigiltype.Task, extra string) response {
	b.t.Helper()
	return b.leaseOp(in, task.TaskID, task.LeaseEpoch, "heartbeat", extra)
}

func (b *testBundle) liveness(in instance) {
	b.t.Helper()
	r := b.do("POST", "/v1/processes/"+in.ID+"/heartbeat", "", "X-Vigil-Instance-Token", in.Token)
	require.Equal(b.t, http.StatusOK, r.status, "%s", r.body)
}

func (b *testBundle) reclaim() int {
	b.t.Helper()
	n, err := b.srv.Lease.Reclaim(context.Background())
	require.NoError(b.t, err)
	return n
}

func activityAt(t time.Time) string {
	return `,"schema_version":2,"activity_at":"` + t.Format(time.RFC3339Nano) + `"`
}

// DESIGN T4, the activity policy: a v2 lease whose activity is stale
// expires although heartbeats keep arriving; a v1 lease does not until its
// heartbeats stop.
func TestActivityPolicyExpiresStaleV2Leases(t *testing.T) {
	t.Parallel()
	b := setup(t, testserver.WithLeaseTimeout(time.Minute), testserver.WithLeaseExpiry(lease.ExpiryActivity))
	v2, v1 := b.register("session", 30), b.register("legacy", 30)
	b.enqueue(`{"task_type":"edit"}`)
	b.enqueue(`{"task_type":"legacy"}`)
	v2Task, v1Task := b.claimTask(v2, "edit"), b.claimTask(v1, "legacy")

	// Activity once, 10s in; then heartbeats every 20s carry the same,
	// ever older, activity time. The v1 holder keeps heartbeating.
	b.clock.Advance(10 * time.Second)
	lastActivity := b.clock.Now()
	for range 4 {
		b.clock.Advance(20 * time.Second)
		b.liveness(v2)
		b.liveness(v1)
		r := b.beat(v2, v2Task, activityAt(lastActivity))
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		r = b.beat(v1, v1Task, "")
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	}
	// now = claim + 90s; the v2 lease expired at activity + 60s = claim + 70s.
	require.Equal(t, 1, b.reclaim())
	got := b.task(v2Task.TaskID)
	require.Equal(t, vigiltype.TaskScheduled, got.Status, "the stale v2 lease was reclaimed")
	require.Contains(t, *got.LastError, "lease expired")
	require.Contains(t, *got.LastError, "last reported activity at "+lastActivity.Format("2006-01-02T15:04:05.000Z"),
		"the reason shows the lapse was on activity, not heartbeats")
	require.True(t, got.LastActivityAt.Equal(lastActivity), "last_activity_at is kept apart from heartbeats")
	require.Equal(t, vigiltype.TaskRunning, b.task(v1Task.TaskID).Status, "a v1 lease keeps the heartbeat fallback")
	require.Equal(t, 2, got.HeartbeatSchemaVersion)

	// The v1 holder stops heartbeating: its lease lapses a window later.
	b.clock.Advance(time.Minute + time.Millisecond)
	b.liveness(v1)
	require.Equal(t, 1, b.reclaim())
	require.Equal(t, vigiltype.TaskScheduled, b.task(v1Task.TaskID).Status)
}

// Under the default max policy the same stale v2 heartbeats keep the lease.
func TestMaxPolicyKeepsLeasesWithHeartbeats(t *testing.T) {
	t.Parallel()
	b := setup(t, testserver.WithLeaseTimeout(time.Minute))
	in := b.register("session", 30)
	b.enqueue(`{"task_type":"edit"}`)
	task := b.claimTask(in, "edit")
	lastActivity := b.clock.Now()
	for range 5 {
		b.clock.Advance(20 * time.Second)
		b.liveness(in)
		r := b.beat(in, task, activityAt(lastActivity))
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	}
	require.Equal(t, 0, b.reclaim())
	require.Equal(t, vigiltype.TaskRunning, b.task(task.TaskID).Status)
}

func TestActivityGatedTasksDefaultToThirtyMinutes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	task := b.enqueue(`{"task_type":"edit","activity_gated":true}`)
	require.Equal(t, 1800.0, task.LeaseTimeoutS)
	own := b.enqueue(`{"task_type":"edit","activity_gated":true,"lease_timeout_s":90}`)
	require.Equal(t, 90.0, own.LeaseTimeoutS)
	plain := b.enqueue(`{"task_type":"edit"}`)
	require.Equal(t, 0.0, plain.LeaseTimeoutS, "the server's window")
}

func TestClaimByID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.register("session", 30)
	first := b.enqueue(`{"task_type":"a"}`)
	second := b.enqueue(`{"task_type":"b"}`)
	claim := func(body string) response {
		return b.do("POST", "/v1/tasks/claim", body, "X-Vigil-Instance-Token", in.Token)
	}
	r := claim(`{"instance_id":"` + in.ID + `","task_id":` + itoa(second.TaskID) + `}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var got vigiltype.Task
	r.decode(t, &got)
	require.Equal(t, second.TaskID, got.TaskID, "the named task, not the oldest")
	require.Equal(t, int64(1), got.LeaseEpoch)

	r = claim(`{"instance_id":"` + in.ID + `","task_id":` + itoa(second.TaskID) + `}`)
	require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
	code, _ := r.errorCode(t)
	require.Equal(t, "not_claimable", code)
	require.Equal(t, vigiltype.TaskScheduled, b.task(first.TaskID).Status)
}

func TestHeartbeatVersionsPerHost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.register("session", 30) // host-a
	b.enqueue(`{"task_type":"edit"}`)
	task := b.claimTask(in, "edit")
	require.Equal(t, http.StatusOK, b.beat(in, task, "").status)
	b.clock.Advance(time.Second)
	require.Equal(t, http.StatusOK, b.beat(in, task, activityAt(b.clock.Now())).status)
	require.Equal(t, http.StatusOK, b.beat(in, task, activityAt(b.clock.Now())).status)

	r := b.do("GET", "/v1/heartbeat-versions", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var view struct {
		WindowS float64                      `json:"window_s"`
		Hosts   []vigiltype.HeartbeatVersion `json:"hosts"`
	}
	r.decode(t, &view)
	require.Equal(t, 3600.0, view.WindowS)
	require.Len(t, view.Hosts, 2)
	require.Equal(t, vigiltype.HeartbeatVersion{Hostname: "host-a", SchemaVersion: 1, LastSentAt: b.clock.Now().Add(-time.Second), Heartbeats: 1}, view.Hosts[0])
	require.Equal(t, vigiltype.HeartbeatVersion{Hostname: "host-a", SchemaVersion: 2, LastSentAt: b.clock.Now(), Heartbeats: 2}, view.Hosts[1])

	b.clock.Advance(2 * time.Hour)
	r = b.do("GET", "/v1/heartbeat-versions?window_s=60", "")
	r.decode(t, &view)
	require.Empty(t, view.Hosts, "nothing sent within the window")
}

func TestHeartbeatBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.register("session", 30)
	b.enqueue(`{"task_type":"edit"}`)
	b.enqueue(`{"task_type":"other"}`)
	claimedAt := b.clock.Now()
	task := b.claimTask(in, "edit")
	b.clock.Advance(time.Minute)
	before := b.task(task.TaskID)

	cases := []struct {
		name, extra, msg string
	}{
		{"version 3", `,"schema_version":3`, "schema_version: must be 1 or 2"},
		{"v2 without activity", `,"schema_version":2`, "activity_at: is required with schema_version 2"},
		{"v1 with activity", `,"schema_version":1,"activity_at":"` + claimedAt.Format(time.RFC3339) + `"`, "activity_at: is only accepted with schema_version 2"},
		{"activity in the future", activityAt(b.clock.Now().Add(time.Minute)), "activity_at: must not be in the future"},
		{"activity before the claim", activityAt(claimedAt.Add(-time.Second)), "activity_at: must not be before the claim"},
	}
	for _, c := range cases {
		r := b.beat(in, task, c.extra)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", c.name, r.body)
		_, msg := r.errorCode(t)
		require.Contains(t, msg, c.msg, c.name)
	}
	r := b.beat(in, task, `,"activity_at":"yesterday"`)
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
	r = b.leaseOp(in, task.TaskID, task.LeaseEpoch, "complete", activityAt(b.clock.Now()))
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
	r = b.do("POST", "/v1/tasks/claim", `{"instance_id":"`+in.ID+`","task_id":2,"task_types":["other"]}`, "X-Vigil-Instance-Token", in.Token)
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
	r = b.do("GET", "/v1/heartbeat-versions?window_s=-5", "")
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)

	require.Equal(t, before, b.task(task.TaskID), "refused heartbeats changed the task")
	require.Equal(t, vigiltype.TaskScheduled, b.task(2).Status)
	r = b.do("GET", "/v1/heartbeat-versions", "")
	require.JSONEq(t, `{"window_s":3600,"hosts":[]}`, string(r.body), "refused heartbeats were counted")
}

// DESIGN T6, issue #14: a running task whose holder keeps renewing the
// lease but reports no activity newer than the staleness bound reads
// stalled — apart from one that stopped heartbeating (its lease runs out)
// and from a v1 holder (no activity to judge). New activity ends it.
func TestStalledIsComputedOnRead(t *testing.T) {
	t.Parallel()
	b := setup(t, testserver.WithLeaseTimeout(time.Hour))
	v2, v1 := b.register("session", 3600), b.register("legacy", 3600)
	b.enqueue(`{"task_type":"edit"}`)
	b.enqueue(`{"task_type":"legacy"}`)
	v2Task, v1Task := b.claimTask(v2, "edit"), b.claimTask(v1, "legacy")
	activity := b.clock.Now()
	stalled := func(task vigiltype.Task) bool {
		r := b.do("GET", "/v1/tasks/"+strconv.FormatInt(task.TaskID, 10), "")
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		var got vigiltype.Task
		require.NoError(t, json.Unmarshal(r.body, &got))
		return got.Stalled
	}
	for range 16 { // a renewal a minute, the activity ever older
		b.clock.Advance(time.Minute)
		require.Equal(t, http.StatusOK, b.beat(v2, v2Task, activityAt(activity)).status)
		require.Equal(t, http.StatusOK, b.beat(v1, v1Task, "").status)
	}
	require.True(t, stalled(v2Task), "16 min without activity, lease renewed")
	require.False(t, stalled(v1Task), "a v1 holder has no activity to judge")

	r := b.do("GET", "/v1/tasks?status=running", "")
	require.Equal(t, http.StatusOK, r.status)
	require.Contains(t, string(r.body), `"stalled":true`, "the listing says so too")

	require.Equal(t, http.StatusOK, b.beat(v2, v2Task, activityAt(b.clock.Now())).status)
	require.False(t, stalled(v2Task), "fresh activity ends it")
}

// The cutover (seed 002 phase 3, DESIGN T6, issue #14): under
// activity-only a v1 holder's heartbeats are recorded and counted but no
// longer extend its lease, which runs out on the claim plus the window; a
// v2 holder keeps its lease with activity.
func TestActivityOnlyStopsV1FromExtendingLeases(t *testing.T) {
	t.Parallel()
	b := setup(t, testserver.WithLeaseTimeout(time.Minute), testserver.WithLeaseExpiry(lease.ExpiryActivityOnly))
	v2, v1 := b.register("session", 3600), b.register("legacy", 3600)
	b.enqueue(`{"task_type":"edit"}`)
	b.enqueue(`{"task_type":"legacy"}`)
	v2Task, v1Task := b.claimTask(v2, "edit"), b.claimTask(v1, "legacy")
	for range 4 {
		b.clock.Advance(20 * time.Second)
		require.Equal(t, http.StatusOK, b.beat(v2, v2Task, activityAt(b.clock.Now())).status)
		r := b.beat(v1, v1Task, "")
		require.Equal(t, http.StatusOK, r.status, "a v1 heartbeat is still accepted and counted: %s", r.body)
	}
	// 80s after the claim: the v1 lease (60s from the claim) ran out
	// although its holder kept heartbeating; the v2 one is alive.
	require.Equal(t, 1, b.reclaim())
	r := b.beat(v1, v1Task, "")
	require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
	require.Equal(t, http.StatusOK, b.beat(v2, v2Task, activityAt(b.clock.Now())).status)

	r = b.do("GET", "/v1/heartbeat-versions", "")
	require.Equal(t, http.StatusOK, r.status)
	require.Contains(t, string(r.body), `"schema_version":1`, "v1 heartbeats are counted per host")
}

// DESIGN T7, issue #14: a v2 heartbeat may carry its activity as an age
// measured on the holder's own clock; the server places it at its now −
// age, so a holder whose clock is 10 minutes off either way keeps an
// activity-gated lease exactly as one with a true clock. (An activity_at
// read off a clock 10 minutes fast is refused; off one 10 minutes slow it
// would shorten the lease by the skew.)
func TestActivityAgeIsClockFree(t *testing.T) {
	t.Parallel()
	b := setup(t, testserver.WithLeaseTimeout(time.Minute), testserver.WithLeaseExpiry(lease.ExpiryActivity))
	holder := b.register("session", 3600)
	b.enqueue(`{"task_type":"edit"}`)
	task := b.claimTask(holder, "edit")
	b.clock.Advance(30 * time.Second)

	for _, skew := range []time.Duration{10 * time.Minute, -10 * time.Minute} {
		holderNow := b.clock.Now().Add(skew)
		activity := holderNow.Add(-5 * time.Second) // 5s ago, on the holder's clock
		r := b.beat(holder, task, activityAt(activity))
		if skew > 0 {
			require.Equal(t, http.StatusBadRequest, r.status, "an activity_at from a fast clock: %s", r.body)
		}
		age := holderNow.Sub(activity).Milliseconds()
		r = b.beat(holder, task, `,"schema_version":2,"activity_age_ms":`+strconv.FormatInt(age, 10))
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		var got vigiltype.Task
		require.NoError(t, json.Unmarshal(r.body, &got))
		want := b.clock.Now().Add(-5 * time.Second)
		require.Equal(t, want, got.LastActivityAt.UTC(), "skew %s: placed on the server's clock", skew)
		require.Equal(t, want.Add(time.Minute), got.LeaseExpiresAt.UTC(), "skew %s: the full window from the activity", skew)
		b.clock.Advance(10 * time.Second)
	}

	for _, tc := range []struct{ extra, want string }{
		{`,"schema_version":2,"activity_age_ms":-1`, "activity_age_ms"},
		{`,"schema_version":2,"activity_age_ms":1e300`, "activity_age_ms"},
		{`,"schema_version":1,"activity_age_ms":5`, "activity_age_ms"},
		{`,"schema_version":2,"activity_age_ms":5` + `,"activity_at":"` + b.clock.Now().Format(time.RFC3339) + `"`, "activity_age_ms"},
	} {
		r := b.beat(holder, task, tc.extra)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", tc.extra, r.body)
		require.Contains(t, string(r.body), tc.want)
	}
	r := b.leaseOp(holder, task.TaskID, task.LeaseEpoch, "complete", `,"activity_age_ms":5`)
	require.Equal(t, http.StatusBadRequest, r.status, "only heartbeats take it: %s", r.body)
}
