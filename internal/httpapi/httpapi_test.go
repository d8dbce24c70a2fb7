package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/clock"
	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// testBundle is one server on a fake clock, and helpers to call it.
type testBundle struct {
	t     *testing.T
	srv   *testserver.Server
	clock *clock.Fake
	token string // the bearer token do sends, "" for none
}

// as is b sending bearer token on every call (unless one names its own).
func (b *testBundle) as(token string) *testBundle {
	c := *b
	c.token = token
	return &c
}

func setup(t *testing.T, opts ...testserver.Option) *testBundle {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	// The sweeper's own loop is parked far in the future: tests run
	// reclaim passes themselves, at fake times they choose.
	opts = append([]testserver.Option{testserver.WithClock(clk), testserver.WithSweepInterval(time.Hour)}, opts...)
	return &testBundle{t: t, srv: testserver.Start(t, opts...), clock: clk}
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) decode(t *testing.T, v any) {
	t.Helper()
	require.NoError(t, json.Unmarshal(r.body, v), "body: %s", r.body)
}

func (r response) errorCode(t *testing.T) (string, string) {
	t.Helper()
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	r.decode(t, &e)
	return e.Error.Code, e.Error.Message
}

// do sends body (a string of JSON, or "" for none) with optional headers
// given as name, value pairs. A write is sent as application/json unless
// headers name a Content-Type ("" sends none); a "Host" pair sets the
// request's Host.
func (b *testBundle) do(method, path, body string, headers ...string) response {
	b.t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, b.srv.URL+path, strings.NewReader(body))
	require.NoError(b.t, err)
	if method != http.MethodGet && method != http.MethodHead {
		req.Header.Set("Content-Type", "application/json")
	}
	if b.token != "" {
		req.Header.Set("Authorization", "Bearer "+b.token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		switch name, value := headers[i], headers[i+1]; {
		case strings.EqualFold(name, "Host"):
			req.Host = value
		case value == "":
			req.Header.Del(name)
		default:
			req.Header.Set(name, value)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	return response{status: resp.StatusCode, header: resp.Header, body: data}
}

type instance struct {
	ID    string
	Token string
}

func (b *testBundle) register(kind string, intervalS float64) instance {
	b.t.Helper()
	body, _ := json.Marshal(map[string]any{"process_kind": kind, "hostname": "host-a", "pid": 100, "liveness_interval_s": intervalS})
	r := b.do("POST", "/v1/processes", string(body))
	require.Equal(b.t, http.StatusCreated, r.status, "%s", r.body)
	var reg struct {
		InstanceID    string `json:"instance_id"`
		InstanceToken string `json:"instance_token"`
	}
	r.decode(b.t, &reg)
	require.NotEmpty(b.t, reg.InstanceToken)
	return instance{ID: reg.InstanceID, Token: reg.InstanceToken}
}

func (b *testBundle) process(id string) vigiltype.Process {
	b.t.Helper()
	r := b.do("GET", "/v1/processes/"+id, "")
	require.Equal(b.t, http.StatusOK, r.status, "%s", r.body)
	var p vigiltype.Process
	r.decode(b.t, &p)
	return p
}

func (b *testBundle) enqueue(body string) vigiltype.Task {
	b.t.Helper()
	r := b.do("POST", "/v1/tasks", body)
	require.Equal(b.t, http.StatusCreated, r.status, "%s", r.body)
	var task vigiltype.Task
	r.decode(b.t, &task)
	return task
}

func (b *testBundle) claim(in instance, types ...string) response {
	b.t.Helper()
	body, _ := json.Marshal(map[string]any{"instance_id": in.ID, "task_types": types})
	return b.do("POST", "/v1/tasks/claim", string(body), "X-Vigil-Instance-Token", in.Token)
}

func (b *testBundle) claimTask(in instance, types ...string) vigiltype.Task {
	b.t.Helper()
	r := b.claim(in, types...)
	require.Equal(b.t, http.StatusOK, r.status, "%s", r.body)
	var task vigiltype.Task
	r.decode(b.t, &task)
	return task
}

func (b *testBundle) leaseOp(in instance, taskID int64, epoch int64, op string, extra string) response {
	b.t.Helper()
	body := `{"instance_id":"` + in.ID + `","lease_epoch":` + itoa(epoch) + extra + `}`
	return b.do("POST", "/v1/tasks/"+itoa(taskID)+"/"+op, body, "X-Vigil-Instance-Token", in.Token)
}

func (b *testBundle) task(id int64) vigiltype.Task {
	b.t.Helper()
	r := b.do("GET", "/v1/tasks/"+itoa(id), "")
	require.Equal(b.t, http.StatusOK, r.status, "%s", r.body)
	var task vigiltype.Task
	r.decode(b.t, &task)
	return task
}

func itoa(n int64) string { return strings.TrimSpace(string(must(json.Marshal(n)))) }

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestHealthz(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.do("GET", "/healthz", "")
	require.Equal(t, http.StatusOK, r.status)
	require.JSONEq(t, `{"status":"ok"}`, string(r.body))
}

// DESIGN L3: alive iff now - last_heartbeat_at <= 3 × interval, server clock.
func TestLivenessStatusComputedOnRead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.register("critic", 10)
	require.Equal(t, vigiltype.ProcessAlive, b.process(in.ID).Status)

	b.clock.Advance(30 * time.Second)
	require.Equal(t, vigiltype.ProcessAlive, b.process(in.ID).Status, "exactly 3× the interval is still alive")
	b.clock.Advance(time.Millisecond)
	require.Equal(t, vigiltype.ProcessStopped, b.process(in.ID).Status, "past 3× the interval is stopped")

	r := b.do("POST", "/v1/processes/"+in.ID+"/heartbeat", "", "X-Vigil-Instance-Token", in.Token)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, vigiltype.ProcessAlive, b.process(in.ID).Status, "a heartbeat brings it back")

	r = b.do("POST", "/v1/processes/"+in.ID+"/exit", "", "X-Vigil-Instance-Token", in.Token)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, vigiltype.ProcessStopped, b.process(in.ID).Status, "a clean exit is stopped at once")
	r = b.do("POST", "/v1/processes/"+in.ID+"/heartbeat", "", "X-Vigil-Instance-Token", in.Token)
	require.Equal(t, http.StatusConflict, r.status)
	code, _ := r.errorCode(t)
	require.Equal(t, "instance_exited", code)
}

func TestProcessStatusNewestOfKind(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.register("critic", 30)
	b.clock.Advance(time.Second)
	newest := b.register("critic", 30)
	b.register("enrichment", 30)

	r := b.do("GET", "/v1/process-status/critic", "")
	require.Equal(t, http.StatusOK, r.status)
	var p vigiltype.Process
	r.decode(t, &p)
	require.Equal(t, newest.ID, p.InstanceID)

	r = b.do("GET", "/v1/process-status/nobody", "")
	require.Equal(t, http.StatusNotFound, r.status)
	code, msg := r.errorCode(t)
	require.Equal(t, "not_found", code)
	require.Contains(t, msg, `no process of kind "nobody"`)
}

func TestProcessListPaginationNewestFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var want []string
	for range 7 {
		in := b.register("worker", 30)
		want = append([]string{in.ID}, want...)
		b.clock.Advance(time.Second)
	}
	var got []string
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10, "pagination does not end")
		r := b.do("GET", "/v1/processes?limit=3&cursor="+cursor, "")
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		var page struct {
			Processes  []vigiltype.Process `json:"processes"`
			NextCursor *string             `json:"next_cursor"`
		}
		r.decode(t, &page)
		for _, p := range page.Processes {
			got = append(got, p.InstanceID)
		}
		if page.NextCursor == nil {
			break
		}
		cursor = *page.NextCursor
	}
	require.Equal(t, want, got)
}

// started_within_s keeps the instances started within that many seconds of
// the server's now, paged as usual: a supervisor asks "registered since my
// launch" as a duration, never as a time of its own clock (DESIGN L10).
func TestProcessListStartedWithin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var want []string
	for i := range 6 {
		in := b.register("worker", 30)
		if i >= 2 {
			want = append([]string{in.ID}, want...)
		}
		b.clock.Advance(10 * time.Second)
	}
	// Now is 60s after the first registration: the last four started
	// within the last 40s.
	var got []string
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10, "pagination does not end")
		r := b.do("GET", "/v1/processes?kind=worker&started_within_s=40&limit=3&cursor="+cursor, "")
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		var page struct {
			Processes  []vigiltype.Process `json:"processes"`
			NextCursor *string             `json:"next_cursor"`
		}
		r.decode(t, &page)
		for _, p := range page.Processes {
			got = append(got, p.InstanceID)
		}
		if page.NextCursor == nil {
			break
		}
		cursor = *page.NextCursor
	}
	require.Equal(t, want, got)

	r := b.do("GET", "/v1/processes?started_within_s=-1", "")
	require.Equal(t, http.StatusBadRequest, r.status)
	_, msg := r.errorCode(t)
	require.Contains(t, msg, "started_within_s")
}

// Liveness and lease heartbeats are independent signals (DESIGN §1).
func TestLivenessAndLeaseHeartbeatsAreIndependent(t *testing.T) {
	t.Parallel()

	t.Run("LeaseLapsesWhileProcessAlive", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testserver.WithLeaseTimeout(5*time.Minute))
		in := b.register("worker", 30)
		task := b.enqueue(`{"task_type":"sleep"}`)
		claimed := b.claimTask(in, "sleep")
		require.Equal(t, task.TaskID, claimed.TaskID)

		// Liveness ticks every 30s for 5 minutes; no lease heartbeat.
		for range 10 {
			b.clock.Advance(30 * time.Second)
			r := b.do("POST", "/v1/processes/"+in.ID+"/heartbeat", "", "X-Vigil-Instance-Token", in.Token)
			require.Equal(t, http.StatusOK, r.status)
		}
		b.clock.Advance(time.Millisecond)
		n, err := b.srv.Lease.Reclaim(context.Background())
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, vigiltype.ProcessAlive, b.process(in.ID).Status, "the holder is still alive")
		got := b.task(task.TaskID)
		require.Equal(t, vigiltype.TaskScheduled, got.Status)
		require.Equal(t, 1, got.Reclaims)
		require.Contains(t, *got.LastError, "lease expired")
	})

	t.Run("ProcessStopsWhileLeaseRenewed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, testserver.WithLeaseTimeout(5*time.Minute))
		in := b.register("worker", 10)
		task := b.enqueue(`{"task_type":"sleep"}`)
		claimed := b.claimTask(in, "sleep")

		// Lease heartbeats every 20s; no liveness heartbeat.
		for range 2 {
			b.clock.Advance(20 * time.Second)
			r := b.leaseOp(in, task.TaskID, claimed.LeaseEpoch, "heartbeat", "")
			require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		}
		require.Equal(t, vigiltype.ProcessStopped, b.process(in.ID).Status,
			"lease heartbeats do not keep a process alive")
		// The reclaimer takes the task of a stopped holder at once, without
		// waiting for the 5-minute lease window.
		n, err := b.srv.Lease.Reclaim(context.Background())
		require.NoError(t, err)
		require.Equal(t, 1, n)
		got := b.task(task.TaskID)
		require.Contains(t, *got.LastError, "stopped")
		r := b.leaseOp(in, task.TaskID, claimed.LeaseEpoch, "heartbeat", "")
		require.Equal(t, http.StatusConflict, r.status)
	})
}

func TestStaleEpochIsRefusedAndChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, testserver.WithLeaseTimeout(time.Minute))
	first := b.register("worker", 30)
	second := b.register("worker", 30)
	task := b.enqueue(`{"task_type":"sleep","payload":{"seconds":1}}`)
	old := b.claimTask(first, "sleep")

	// first goes silent; its lease expires and second takes the task over.
	b.clock.Advance(time.Minute + time.Millisecond)
	r := b.do("POST", "/v1/processes/"+second.ID+"/heartbeat", "", "X-Vigil-Instance-Token", second.Token)
	require.Equal(t, http.StatusOK, r.status)
	_, err := b.srv.Lease.Reclaim(context.Background())
	require.NoError(t, err)
	current := b.claimTask(second, "sleep")
	require.Equal(t, old.LeaseEpoch+1, current.LeaseEpoch)
	before := b.task(task.TaskID)

	for _, op := range []struct{ name, extra string }{
		{"heartbeat", ""},
		{"complete", `,"result":{"by":"first"}`},
		{"fail", `,"error":"boom"`},
		{"release", ""},
	} {
		r := b.leaseOp(first, task.TaskID, old.LeaseEpoch, op.name, op.extra)
		require.Equal(t, http.StatusConflict, r.status, "%s: %s", op.name, r.body)
		code, _ := r.errorCode(t)
		require.Equal(t, "stale_epoch", code)
		require.Equal(t, before, b.task(task.TaskID), "%s with a stale epoch changed the task", op.name)
	}

	r = b.leaseOp(second, task.TaskID, current.LeaseEpoch, "complete", `,"result":{"by":"second"}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	done := b.task(task.TaskID)
	require.Equal(t, vigiltype.TaskCompleted, done.Status)
	require.JSONEq(t, `{"by":"second"}`, string(done.Result))
	require.Equal(t, second.ID, *done.CompletedBy)
}

func TestServerToken(t *testing.T) {
	t.Parallel()
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("s3cret-token-0123456789\n"), 0o600))
	b := setup(t, testserver.WithTokenFile(tokenFile))

	require.Equal(t, http.StatusOK, b.do("GET", "/healthz", "").status, "/healthz needs no token")
	r := b.do("GET", "/v1/processes", "")
	require.Equal(t, http.StatusUnauthorized, r.status)
	code, _ := r.errorCode(t)
	require.Equal(t, "unauthorized", code)
	require.Equal(t, http.StatusUnauthorized, b.do("GET", "/v1/processes", "", "Authorization", "Bearer wrong").status)
	require.Equal(t, http.StatusOK, b.do("GET", "/v1/processes", "", "Authorization", "Bearer s3cret-token-0123456789").status)
	require.Equal(t, http.StatusUnauthorized, b.do("GET", "/v1/processes", "", "Authorization", "bearer s3cret-token-0123456789").status,
		"the auth scheme is matched exactly: Bearer")
}

// Bad input gets a 4xx naming the field and rule, and writes nothing.
func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.register("worker", 30)
	other := b.register("worker", 30)
	task := b.enqueue(`{"task_type":"sleep"}`)
	held := b.claimTask(in, "sleep")
	tok := []string{"X-Vigil-Instance-Token", in.Token}
	lease := func(extra string) string {
		return `{"instance_id":"` + in.ID + `","lease_epoch":` + itoa(held.LeaseEpoch) + extra + `}`
	}
	taskPath := "/v1/tasks/" + itoa(task.TaskID)
	big := `{"task_type":"sleep","payload":{"x":"` + strings.Repeat("a", 2<<20) + `"}}`

	cases := []struct {
		name, method, path, body string
		headers                  []string
		status                   int
		code, msgContains        string
	}{
		{"interval zero", "POST", "/v1/processes", `{"process_kind":"k","hostname":"h","pid":1,"liveness_interval_s":0}`, nil, 400, "invalid", "liveness_interval_s: must be a positive number"},
		{"interval negative", "POST", "/v1/processes", `{"process_kind":"k","hostname":"h","pid":1,"liveness_interval_s":-5}`, nil, 400, "invalid", "liveness_interval_s"},
		{"interval NaN", "POST", "/v1/processes", `{"process_kind":"k","hostname":"h","pid":1,"liveness_interval_s":NaN}`, nil, 400, "malformed_json", "invalid JSON"},
		{"interval string", "POST", "/v1/processes", `{"process_kind":"k","hostname":"h","pid":1,"liveness_interval_s":"abc"}`, nil, 400, "malformed_json", "liveness_interval_s must be a number"},
		{"interval missing", "POST", "/v1/processes", `{"process_kind":"k","hostname":"h","pid":1}`, nil, 400, "invalid", "liveness_interval_s"},
		{"interval too long", "POST", "/v1/processes", `{"process_kind":"k","hostname":"h","pid":1,"liveness_interval_s":1e9}`, nil, 400, "invalid", "must be between 0.01 and 86400 seconds"},
		{"interval too short", "POST", "/v1/processes", `{"process_kind":"k","hostname":"h","pid":1,"liveness_interval_s":1e-300}`, nil, 400, "invalid", "must be between 0.01 and 86400 seconds"},
		{"hostname control chars", "POST", "/v1/processes", `{"process_kind":"k","hostname":"evil\u001b[31mRED\n","pid":1,"liveness_interval_s":5}`, nil, 400, "invalid", "hostname: must be UTF-8 text without control characters"},
		{"hostname NUL", "POST", "/v1/processes", `{"process_kind":"k","hostname":"a\u0000b","pid":1,"liveness_interval_s":5}`, nil, 400, "invalid", "hostname: must be UTF-8 text without control characters"},
		{"kind bad chars", "POST", "/v1/processes", `{"process_kind":"a b","hostname":"h","pid":1,"liveness_interval_s":5}`, nil, 400, "invalid", "process_kind: may only contain"},
		{"kind missing", "POST", "/v1/processes", `{"hostname":"h","pid":1,"liveness_interval_s":5}`, nil, 400, "invalid", "process_kind: is required"},
		{"pid zero", "POST", "/v1/processes", `{"process_kind":"k","hostname":"h","pid":0,"liveness_interval_s":5}`, nil, 400, "invalid", "pid: must be a positive integer"},
		{"hostname empty", "POST", "/v1/processes", `{"process_kind":"k","hostname":"","pid":1,"liveness_interval_s":5}`, nil, 400, "invalid", "hostname: is required"},
		{"unknown field", "POST", "/v1/processes", `{"process_kind":"k","hostname":"h","pid":1,"liveness_interval_s":5,"colour":"red"}`, nil, 400, "malformed_json", `unknown field "colour"`},
		{"malformed JSON", "POST", "/v1/processes", `{"process_kind":`, nil, 400, "malformed_json", "unexpected end of JSON"},
		{"not an object", "POST", "/v1/processes", `[1,2]`, nil, 400, "malformed_json", "must be a JSON object"},
		{"trailing data", "POST", "/v1/tasks", `{"task_type":"sleep"} {}`, nil, 400, "malformed_json", "unexpected data"},
		{"oversized body", "POST", "/v1/tasks", big, nil, 413, "payload_too_large", "limit"},
		{"unknown status filter", "GET", "/v1/processes?status=zombie", "", nil, 400, "invalid", "status: must be alive or stopped"},
		{"limit negative", "GET", "/v1/processes?limit=-1", "", nil, 400, "invalid", "limit"},
		{"limit not a number", "GET", "/v1/processes?limit=ten", "", nil, 400, "invalid", "limit: must be an integer"},
		{"limit zero", "GET", "/v1/tasks?limit=0", "", nil, 400, "invalid", "limit: must not be 0"},
		{"kind filter bad chars", "GET", "/v1/processes?kind=a%20b", "", nil, 400, "invalid", "kind: may only contain"},
		{"host filter control chars", "GET", "/v1/processes?host=a%1Bb", "", nil, 400, "invalid", "host: must be UTF-8 text"},
		{"bad cursor", "GET", "/v1/processes?cursor=zzz", "", nil, 400, "invalid", "cursor"},
		{"unknown task status", "GET", "/v1/tasks?status=done", "", nil, 400, "invalid", "status: must be one of"},
		{"heartbeat unknown instance", "POST", "/v1/processes/nope/heartbeat", "", tok, 404, "not_found", ""},
		{"heartbeat wrong token", "POST", "/v1/processes/" + in.ID + "/heartbeat", "", []string{"X-Vigil-Instance-Token", other.Token}, 403, "invalid_token", ""},
		{"heartbeat no token", "POST", "/v1/processes/" + in.ID + "/heartbeat", "", nil, 403, "invalid_token", "X-Vigil-Instance-Token header is required"},
		{"exit wrong token", "POST", "/v1/processes/" + in.ID + "/exit", "", []string{"X-Vigil-Instance-Token", "x"}, 403, "invalid_token", ""},
		{"enqueue bad type", "POST", "/v1/tasks", `{"task_type":""}`, nil, 400, "invalid", "task_type: is required"},
		{"enqueue max_attempts zero", "POST", "/v1/tasks", `{"task_type":"sleep","max_attempts":0}`, nil, 400, "invalid", "max_attempts: must be between 1 and 1000"},
		{"enqueue lease timeout negative", "POST", "/v1/tasks", `{"task_type":"sleep","lease_timeout_s":-1}`, nil, 400, "invalid", "lease_timeout_s"},
		{"enqueue lease timeout under 1s", "POST", "/v1/tasks", `{"task_type":"sleep","lease_timeout_s":0.0001}`, nil, 400, "invalid", "lease_timeout_s: must be 0 (the server's window) or between 1 and 86400 seconds"},
		{"enqueue delay negative", "POST", "/v1/tasks", `{"task_type":"sleep","delay_s":-1}`, nil, 400, "invalid", "delay_s"},
		{"enqueue payload too deep", "POST", "/v1/tasks", `{"task_type":"d","payload":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, nil, 400, "invalid", "payload: must not nest arrays and objects more than 64 deep"},
		{"enqueue payload not JSON", "POST", "/v1/tasks", `{"task_type":"sleep","payload":nope}`, nil, 400, "malformed_json", ""},
		{"unknown task", "GET", "/v1/tasks/999999", "", nil, 404, "not_found", "task 999999"},
		{"task id not a number", "GET", "/v1/tasks/abc", "", nil, 400, "invalid", "task_id"},
		{"heartbeat unknown task", "POST", "/v1/tasks/999999/heartbeat", lease(""), tok, 404, "not_found", ""},
		{"lease op unknown", "POST", taskPath + "/explode", lease(""), tok, 404, "not_found", "heartbeat, complete, fail or release"},
		{"lease wrong token", "POST", taskPath + "/complete", lease(""), []string{"X-Vigil-Instance-Token", other.Token}, 403, "invalid_token", ""},
		{"lease epoch zero", "POST", taskPath + "/heartbeat", `{"instance_id":"` + in.ID + `","lease_epoch":0}`, tok, 400, "invalid", "lease_epoch"},
		{"lease stale epoch", "POST", taskPath + "/complete", `{"instance_id":"` + in.ID + `","lease_epoch":99}`, tok, 409, "stale_epoch", ""},
		{"lease not the holder", "POST", taskPath + "/heartbeat", `{"instance_id":"` + other.ID + `","lease_epoch":` + itoa(held.LeaseEpoch) + `}`, []string{"X-Vigil-Instance-Token", other.Token}, 409, "stale_epoch", ""},
		{"fail without error", "POST", taskPath + "/fail", lease(""), tok, 400, "invalid", "error: is required"},
		{"fail negative retry", "POST", taskPath + "/fail", lease(`,"error":"x","retry_after_s":-1`), tok, 400, "invalid", "retry_after_s"},
		{"result on heartbeat", "POST", taskPath + "/heartbeat", lease(`,"result":{}`), tok, 400, "invalid", "result: is only accepted by complete"},
		{"claim no types", "POST", "/v1/tasks/claim", `{"instance_id":"` + in.ID + `","task_types":[]}`, tok, 400, "invalid", "task_types"},
		{"claim wrong token", "POST", "/v1/tasks/claim", `{"instance_id":"` + in.ID + `","task_types":["sleep"]}`, []string{"X-Vigil-Instance-Token", "bad"}, 403, "invalid_token", ""},
		{"claim no instance", "POST", "/v1/tasks/claim", `{"task_types":["sleep"]}`, tok, 400, "invalid", "instance_id: is required"},
		{"prune zero", "POST", "/v1/processes/prune", `{"older_than_s":0}`, nil, 400, "invalid", "older_than_s"},
		{"wrong method", "DELETE", "/v1/processes", "", nil, 405, "method_not_allowed", ""},
		{"GET claim", "GET", "/v1/tasks/claim", "", nil, 405, "method_not_allowed", "allowed: POST"},
		{"GET prune", "GET", "/v1/processes/prune", "", nil, 405, "method_not_allowed", "allowed: POST"},
		{"unknown route", "GET", "/v2/everything", "", nil, 404, "not_found", ""},
	}

	snapshot := func() (string, string) {
		return string(b.do("GET", "/v1/processes?limit=1000", "").body), string(b.do("GET", "/v1/tasks?limit=1000", "").body)
	}
	procsBefore, tasksBefore := snapshot()
	for _, c := range cases {
		r := b.do(c.method, c.path, c.body, c.headers...)
		require.Equal(t, c.status, r.status, "%s: %s", c.name, r.body)
		code, msg := r.errorCode(t)
		require.Equal(t, c.code, code, "%s: %s", c.name, r.body)
		require.Contains(t, msg, c.msgContains, c.name)
		require.NotContains(t, msg, "sql", "%s: internal text leaked", c.name)
	}
	procsAfter, tasksAfter := snapshot()
	require.Equal(t, procsBefore, procsAfter, "bad input changed a process row")
	require.Equal(t, tasksBefore, tasksAfter, "bad input changed a task row")
}

// Two workers polling the same queue never hold one task at once.
func TestConcurrentClaimsNeverShareATask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const tasks, workers = 120, 6
	for range tasks {
		b.enqueue(`{"task_type":"sleep"}`)
	}
	instances := make([]instance, workers)
	for i := range instances {
		instances[i] = b.register("worker", 30)
	}

	type claimRec struct {
		taskID int64
		epoch  int64
		by     string
	}
	results := make(chan claimRec, tasks*2)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for _, in := range instances {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				body, _ := json.Marshal(map[string]any{"instance_id": in.ID, "task_types": []string{"sleep"}})
				req, _ := http.NewRequest("POST", b.srv.URL+"/v1/tasks/claim", strings.NewReader(string(body)))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Vigil-Instance-Token", in.Token)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					errs <- err
					return
				}
				var task vigiltype.Task
				status := resp.StatusCode
				if status == http.StatusOK {
					err = json.NewDecoder(resp.Body).Decode(&task)
				}
				resp.Body.Close()
				switch {
				case err != nil:
					errs <- err
					return
				case status == http.StatusNoContent:
					return
				case status != http.StatusOK:
					errs <- fmt.Errorf("claim: HTTP %d", status)
					return
				}
				results <- claimRec{task.TaskID, task.LeaseEpoch, *task.LeaseOwner}
			}
		}()
	}
	wg.Wait()
	close(results)
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	seen := map[int64]claimRec{}
	for r := range results {
		prev, dup := seen[r.taskID]
		require.False(t, dup, "task %d claimed twice: by %s and %s", r.taskID, prev.by, r.by)
		require.Equal(t, int64(1), r.epoch)
		seen[r.taskID] = r
	}
	require.Len(t, seen, tasks, "every task is claimed exactly once")
}

// A handler's error text is stored whatever bytes it holds: NUL and invalid
// UTF-8 are replaced (PostgreSQL text cannot hold them) and it is cut to
// lease.ErrorMaxBytes, rather than the failure being refused and lost.
func TestFailKeepsAnyErrorText(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.register("worker", 30)
	b.enqueue(`{"task_type":"sleep"}`)
	held := b.claimTask(in, "sleep")
	long := strings.Repeat("é", 5000) // 10000 bytes
	r := b.leaseOp(in, held.TaskID, held.LeaseEpoch, "fail", `,"error":"bad\u0000thing `+"\xff "+long+`"`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	got := b.task(held.TaskID)
	require.True(t, strings.HasPrefix(*got.LastError, "bad\uFFFDthing \uFFFD é"), *got.LastError)
	require.LessOrEqual(t, len(*got.LastError), 8192)
	require.True(t, utf8.ValidString(*got.LastError))
}

// An explicit null payload is the documented default, {}.
func TestEnqueueNullPayloadIsTheDefault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	task := b.enqueue(`{"task_type":"t","payload":null}`)
	require.JSONEq(t, `{}`, string(task.Payload))
	task = b.enqueue(`{"task_type":"t"}`)
	require.JSONEq(t, `{}`, string(task.Payload))
}

// A not-found task or event is named once in the error's message.
func TestNotFoundNamesTheThingOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.do("GET", "/v1/tasks/999999", "")
	require.Equal(t, http.StatusNotFound, r.status)
	_, msg := r.errorCode(t)
	require.Equal(t, 1, strings.Count(msg, "999999"), msg)
	r = b.do("POST", "/v1/events/999999/ack", "")
	require.Equal(t, http.StatusNotFound, r.status)
	_, msg = r.errorCode(t)
	require.Equal(t, 1, strings.Count(msg, "999999"), msg)
}
