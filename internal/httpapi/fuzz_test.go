package httpapi_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/clock"
	"github.com/vigil-fleet/vigil/internal/dashboard"
	"github.com/vigil-fleet/vigil/internal/httpapi"
	"github.com/vigil-fleet/vigil/internal/testserver"
)

// fuzzRoutes are the routes FuzzAPI drives: every one that decodes a
// request body, and every one that reads a query or a path parameter. A
// {param} in the path is the fixture's value of that kind unless the input
// gives one.
var fuzzRoutes = []struct{ method, path string }{
	{"POST", "/v1/processes"},
	{"POST", "/v1/processes/prune"},
	{"POST", "/v1/processes/{instance}/heartbeat"},
	{"POST", "/v1/processes/{instance}/exit"},
	{"POST", "/v1/tasks"},
	{"POST", "/v1/tasks/claim"},
	{"POST", "/v1/tasks/complete"},
	{"POST", "/v1/tasks/{task}/heartbeat"},
	{"POST", "/v1/tasks/{task}/complete"},
	{"POST", "/v1/tasks/{task}/fail"},
	{"POST", "/v1/tasks/{task}/release"},
	{"POST", "/v1/tasks/{task}/reclaim"},
	{"POST", "/v1/agents"},
	{"PATCH", "/v1/agents/{agent}"},
	{"POST", "/v1/agents/{agent}/planned-stop"},
	{"POST", "/v1/events"},
	{"POST", "/v1/events/{event}/ack"},
	{"GET", "/v1/processes"},
	{"GET", "/v1/processes/{instance}"},
	{"GET", "/v1/process-status/{kind}"},
	{"GET", "/v1/tasks"},
	{"GET", "/v1/tasks/{task}"},
	{"GET", "/v1/tasks/stalled"},
	{"GET", "/v1/heartbeat-versions"},
	{"GET", "/v1/agents/{agent}"},
	{"GET", "/v1/agents/{agent}/planned-stop"},
	{"GET", "/v1/events"},
	{"GET", "/v1/timeline"},
	{"GET", "/v1/snapshot"},
}

// errorCodes are the codes docs/api.md lists.
var errorCodes = map[string]bool{
	"invalid": true, "malformed_json": true, "unauthorized": true, "invalid_token": true,
	"forbidden_origin": true, "not_found": true, "method_not_allowed": true, "stale_epoch": true,
	"instance_exited": true, "not_claimable": true, "instance_stopped": true, "outcome_conflict": true,
	"conflict": true, "payload_too_large": true, "unsupported_media_type": true,
	"misdirected_request": true, "internal": true, "unavailable": true,
}

// fuzzFixture is what the fuzzed requests act on: an instance holding a
// running task, an agent and an event, on a server of its own. Its values
// are substituted for $INSTANCE, $TOKEN, $TASK, $EPOCH, $AGENT, $VERSION
// and $EVENT in a request's body, and for the {params} of its path.
type fuzzFixture struct {
	t       testing.TB
	handler http.Handler
	db      *sql.DB // a second connection to the store's file, for data_version
	dirty   bool    // a request may have changed the fixture's rows: rebuild them

	instance, token, task, epoch, agent, version, event string
}

func newFuzzFixture(t testing.TB) *fuzzFixture {
	path := filepath.Join(t.TempDir(), "vigil.db")
	clk := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	srv := testserver.Start(t, testserver.WithDB(path), testserver.WithClock(clk), testserver.WithSweepInterval(time.Hour))
	h, err := httpapi.New(httpapi.Config{
		Liveness: srv.Liveness, Lease: srv.Lease, Registry: srv.Registry, Events: srv.Events,
		Snapshot: srv.Snapshot, Store: srv.Store(), Metrics: srv.Metrics,
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Timeline: &dashboard.Service{Registry: srv.Registry, Liveness: srv.Liveness, Events: srv.Events, Now: clk.Now},
	})
	require.NoError(t, err)
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)&_pragma=query_only(1)")
	require.NoError(t, err)
	db.SetMaxOpenConns(1) // data_version is per connection
	t.Cleanup(func() { db.Close() })
	fx := &fuzzFixture{t: t, handler: h, db: db, dirty: true}
	fx.rebuild()
	return fx
}

// serve sends one request to the handler in-process.
func (fx *fuzzFixture) serve(method, target, token string, body []byte) *httptest.ResponseRecorder {
	req := httptest.NewRequestWithContext(context.Background(), method, "http://127.0.0.1:7711/", bytes.NewReader(body))
	u, err := url.Parse(target)
	require.NoError(fx.t, err)
	req.URL.Path, req.URL.RawPath, req.URL.RawQuery = u.Path, u.RawPath, u.RawQuery
	req.RequestURI = u.RequestURI()
	if method != http.MethodGet {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set(httpapi.InstanceTokenHeader, token)
	}
	rec := httptest.NewRecorder()
	fx.handler.ServeHTTP(rec, req)
	return rec
}

// setup sends a fixture request that must succeed and returns its body.
func (fx *fuzzFixture) setup(method, target, token, body string, into any) {
	rec := fx.serve(method, target, token, []byte(body))
	require.Less(fx.t, rec.Code, 300, "%s %s: %s", method, target, rec.Body)
	require.NoError(fx.t, json.Unmarshal(rec.Body.Bytes(), into))
}

// rebuild makes a fresh instance holding a fresh task, an agent and an
// event, when a request may have used up the last ones.
func (fx *fuzzFixture) rebuild() {
	if !fx.dirty {
		return
	}
	var reg struct {
		InstanceID    string `json:"instance_id"`
		InstanceToken string `json:"instance_token"`
	}
	fx.setup("POST", "/v1/processes", "", `{"process_kind":"fuzz","hostname":"box1","pid":4242,"liveness_interval_s":30}`, &reg)
	var task struct {
		ID    int64 `json:"task_id"`
		Epoch int64 `json:"lease_epoch"`
	}
	fx.setup("POST", "/v1/tasks", "", `{"task_type":"fuzz_held","payload":{"n":1}}`, &task)
	fx.setup("POST", "/v1/tasks/claim", reg.InstanceToken,
		`{"instance_id":"`+reg.InstanceID+`","task_id":`+strconv.FormatInt(task.ID, 10)+`}`, &task)
	var agent struct {
		Name    string `json:"name"`
		Version int64  `json:"version"`
	}
	fx.setup("POST", "/v1/agents", "", `{"name":"fuzz-agent","function":"fuzzing","tick_cron":"0 * * * *","config":{"model":"m1"}}`, &agent)
	var event struct {
		ID int64 `json:"event_id"`
	}
	fx.setup("POST", "/v1/events", "", `{"agent":"fuzz-agent","kind":"exit","exit_code":1,"stderr_tail":"boom"}`, &event)
	fx.instance, fx.token = reg.InstanceID, reg.InstanceToken
	fx.task, fx.epoch = strconv.FormatInt(task.ID, 10), strconv.FormatInt(task.Epoch, 10)
	fx.agent, fx.version = agent.Name, strconv.FormatInt(agent.Version, 10)
	fx.event = strconv.FormatInt(event.ID, 10)
	fx.dirty = false
}

// dataVersion changes whenever another connection commits a write.
func (fx *fuzzFixture) dataVersion() int64 {
	var v int64
	require.NoError(fx.t, fx.db.QueryRow("PRAGMA data_version").Scan(&v))
	return v
}

// fuzzSeeds are requests from docs/api.md and the handlers' tests, by
// route, with the fixture's placeholders.
var fuzzSeeds = []struct {
	method, path, query, body string
}{
	{"POST", "/v1/processes", "", `{"process_kind":"critic","hostname":"box1","pid":4242,"liveness_interval_s":30}`},
	{"POST", "/v1/processes", "", `{"process_kind":"critic","hostname":"box\u0001","pid":0,"liveness_interval_s":1e309}`},
	{"POST", "/v1/processes", "", `{"process_kind":"critic","hostname":"` + "bo\xffx" + `","pid":1,"liveness_interval_s":30}`},
	{"POST", "/v1/processes/prune", "", `{"older_than_s":2592000}`},
	{"POST", "/v1/processes/prune", "", `{"older_than_s":-1}`},
	{"POST", "/v1/processes/{instance}/heartbeat", "", ``},
	{"POST", "/v1/processes/{instance}/exit", "", `{}`},
	{"POST", "/v1/tasks", "", `{"task_type":"sleep","payload":{"seconds":3}}`},
	{"POST", "/v1/tasks", "", `{"task_type":"sleep","payload":[1,2],"max_attempts":3,"max_reclaims":0,"lease_timeout_s":90,"delay_s":5,"activity_gated":true}`},
	{"POST", "/v1/tasks", "", `{"task_type":"sleep","payload":"x","max_attempts":0,"lease_timeout_s":-1}`},
	{"POST", "/v1/tasks/claim", "", `{"instance_id":"$INSTANCE","task_types":["sleep"]}`},
	{"POST", "/v1/tasks/claim", "", `{"instance_id":"$INSTANCE","task_id":42}`},
	{"POST", "/v1/tasks/claim", "", `{"instance_id":"$INSTANCE","task_types":["sleep"],"max_tasks":32}`},
	{"POST", "/v1/tasks/claim", "", `{"instance_id":"$INSTANCE","task_id":$TASK,"max_tasks":null}`},
	{"POST", "/v1/tasks/complete", "", `{"instance_id":"$INSTANCE","items":[{"task_id":$TASK,"lease_epoch":$EPOCH,"result":{"ok":true}},{"task_id":8,"lease_epoch":1}]}`},
	{"POST", "/v1/tasks/complete", "", `{"instance_id":"$INSTANCE","items":[{"task_id":$TASK,"lease_epoch":$EPOCH,"result":"` + "\xff" + `"}]}`},
	{"POST", "/v1/tasks/{task}/heartbeat", "", `{"instance_id":"$INSTANCE","lease_epoch":$EPOCH}`},
	{"POST", "/v1/tasks/{task}/heartbeat", "", `{"instance_id":"$INSTANCE","lease_epoch":$EPOCH,"schema_version":2,"activity_at":"2026-11-30T12:00:03.250Z"}`},
	{"POST", "/v1/tasks/{task}/heartbeat", "", `{"instance_id":"$INSTANCE","lease_epoch":$EPOCH,"schema_version":2,"activity_at":"9999-12-31T23:59:59+14:00"}`},
	{"POST", "/v1/tasks/{task}/complete", "", `{"instance_id":"$INSTANCE","lease_epoch":$EPOCH,"result":{"ok":true}}`},
	{"POST", "/v1/tasks/{task}/fail", "", `{"instance_id":"$INSTANCE","lease_epoch":$EPOCH,"error":"boom\u0000","retry_after_s":30}`},
	{"POST", "/v1/tasks/{task}/release", "", `{"instance_id":"$INSTANCE","lease_epoch":$EPOCH}`},
	{"POST", "/v1/tasks/{task}/reclaim", "", `{"lease_epoch":$EPOCH,"reason":"stall kill: running 41m"}`},
	{"POST", "/v1/agents", "", `{"name":"research","function":"research assistant","tick_cron":"0 * * * *","config":{"model":"m1"}}`},
	{"POST", "/v1/agents", "", `{"name":"research","tick_cron":"@every 0s","config":null}`},
	{"PATCH", "/v1/agents/{agent}", "", `{"version":$VERSION,"tick_cron":"*/30 * * * *"}`},
	{"PATCH", "/v1/agents/{agent}", "", `{"version":$VERSION,"function":null,"config":{"a":[1,{"b":"\ud800"}]}}`},
	{"POST", "/v1/agents/{agent}/planned-stop", "", `{"reason":"operator redeploy"}`},
	{"POST", "/v1/agents/{agent}/planned-stop", "", `{"reason":"x","ttl_s":1e300}`},
	{"POST", "/v1/events", "", `{"agent":"$AGENT","kind":"exit","exit_code":137,"signal":"KILL","run_duration_ms":1200,"stderr_tail":"panic","detail":{"restarts":2},"launch_age_ms":1200}`},
	{"POST", "/v1/events", "", `{"agent":"$AGENT","kind":"flapping","launch_age_ms":-1}`},
	{"POST", "/v1/events/{event}/ack", "", `{"delivery_kind":"paged"}`},
	{"GET", "/v1/processes", "kind=critic&status=alive&limit=20", ``},
	{"GET", "/v1/processes", "limit=0&started_within_s=NaN&cursor=%ff", ``},
	{"GET", "/v1/processes/{instance}", "", ``},
	{"GET", "/v1/process-status/{kind}", "", ``},
	{"GET", "/v1/tasks", "status=running&type=sleep&limit=2&cursor=9223372036854775807", ``},
	{"GET", "/v1/tasks/{task}", "", ``},
	{"GET", "/v1/tasks/stalled", "kind=research&after_s=1800", ``},
	{"GET", "/v1/heartbeat-versions", "window_s=86400", ``},
	{"GET", "/v1/heartbeat-versions", "window_s=1e-300", ``},
	{"GET", "/v1/agents/{agent}", "", ``},
	{"GET", "/v1/agents/{agent}/planned-stop", "", ``},
	{"GET", "/v1/events", "undelivered=true&limit=-1&agent=$AGENT", ``},
	{"GET", "/v1/timeline", "window_s=3600", ``},
	{"GET", "/v1/snapshot", "", ``},
}

// FuzzAPI drives the API's handler (httpapi.New over a real SQLite store)
// with arbitrary bodies, queries and path parameters on every route that
// reads one. Invariants: no panic and no 5xx; every 4xx is the documented
// error shape {"error":{"code","message"}}, nothing else, with a
// documented code and a message; a 4xx writes nothing (the store's
// data_version does not move); a 2xx body is JSON.
func FuzzAPI(f *testing.F) {
	routeOf := map[string]uint8{}
	for i, r := range fuzzRoutes {
		routeOf[r.method+" "+r.path] = uint8(i)
	}
	for _, s := range fuzzSeeds {
		i, ok := routeOf[s.method+" "+s.path]
		require.True(f, ok, "seed for unknown route %s %s", s.method, s.path)
		f.Add(i, "", s.query, []byte(s.body), uint8(0))
	}
	f.Add(routeOf["POST /v1/tasks/{task}/complete"], "0", "", []byte(`{"instance_id":"$INSTANCE","lease_epoch":$EPOCH}`), uint8(0))
	f.Add(routeOf["POST /v1/tasks/claim"], "", "", []byte(`{"instance_id":"$INSTANCE"}`), uint8(1))
	f.Add(routeOf["POST /v1/tasks/{task}/heartbeat"], "", "", []byte(`{"instance_id":"$INSTANCE","lease_epoch":$EPOCH}`), uint8(2))
	f.Add(routeOf["PATCH /v1/agents/{agent}"], "no such agent", "", []byte(`{"version":1,"function":"f"}`), uint8(0))
	f.Add(routeOf["POST /v1/events/{event}/ack"], "-7", "", []byte(`{"delivery_kind":""}`), uint8(0))

	fx := newFuzzFixture(f)
	f.Fuzz(func(t *testing.T, route uint8, param, query string, body []byte, tokenMode uint8) {
		fx.t = t
		fx.rebuild()
		r := fuzzRoutes[int(route)%len(fuzzRoutes)]
		values := strings.NewReplacer("$INSTANCE", fx.instance, "$TOKEN", fx.token, "$TASK", fx.task,
			"$EPOCH", fx.epoch, "$AGENT", fx.agent, "$VERSION", fx.version, "$EVENT", fx.event)
		path := r.path
		if i := strings.IndexByte(path, '{'); i >= 0 {
			j := strings.IndexByte(path, '}')
			v := param
			if v == "" {
				v = map[string]string{"instance": fx.instance, "task": fx.task, "agent": fx.agent,
					"event": fx.event, "kind": "fuzz"}[path[i+1:j]]
			}
			path = path[:i] + url.PathEscape(v) + path[j+1:]
		}
		target := path
		if query != "" {
			target += "?" + values.Replace(query)
		}
		if _, err := url.Parse(target); err != nil {
			t.Skip("not a request target")
		}
		body = []byte(values.Replace(string(body)))
		token := [...]string{fx.token, "", "vt_not_the_token"}[int(tokenMode)%3]

		before := fx.dataVersion()
		rec := fx.serve(r.method, target, token, body)
		status := rec.Code
		require.Less(t, status, 500, "%s %s (token %q) %q: %d %s", r.method, target, token, body, status, rec.Body)

		if status >= 400 {
			require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
			var e struct {
				Error *struct {
					Code    *string `json:"code"`
					Message *string `json:"message"`
				} `json:"error"`
			}
			dec := json.NewDecoder(bytes.NewReader(rec.Body.Bytes()))
			dec.DisallowUnknownFields()
			require.NoError(t, dec.Decode(&e), "error body %s", rec.Body)
			require.False(t, dec.More(), "error body %s", rec.Body)
			require.NotNil(t, e.Error, "error body %s", rec.Body)
			require.NotNil(t, e.Error.Code, "error body %s", rec.Body)
			require.NotNil(t, e.Error.Message, "error body %s", rec.Body)
			require.True(t, errorCodes[*e.Error.Code], "undocumented code in %s", rec.Body)
			require.NotEmpty(t, *e.Error.Message, "error body %s", rec.Body)
			require.Equal(t, before, fx.dataVersion(), "%s %s %q answered %d %s but wrote to the store",
				r.method, target, body, status, rec.Body)
			return
		}
		if status != http.StatusNoContent {
			require.True(t, json.Valid(rec.Body.Bytes()), "%s %s: %d %s", r.method, target, status, rec.Body)
		}
		if r.method != http.MethodGet {
			fx.dirty = true
		}
	})
}
