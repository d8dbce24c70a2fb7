package httpapi_test

import (
	"database/sql"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/httpapi"
	"github.com/vigil-fleet/vigil/internal/store/pgstore/pgtest"
	"github.com/vigil-fleet/vigil/internal/testserver"
)

// cutProxy forwards TCP connections from a loopback port to upstream until
// cut, which closes the port and every connection through it: the server
// behind it then looks down (connections reset, new ones refused).
type cutProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newCutProxy(t *testing.T, upstream string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &cutProxy{ln: ln}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", upstream)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			p.wg.Go(func() { _, _ = io.Copy(u, c); _ = u.Close() })
			p.wg.Go(func() { _, _ = io.Copy(c, u); _ = c.Close() })
		}
	})
	t.Cleanup(p.cut)
	return p
}

// cut closes the port and every connection through it.
func (p *cutProxy) cut() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// Issue #12 case 7: with its PostgreSQL unreachable, every /v1 route (and
// /healthz) answers 503 with Retry-After and code unavailable, not 500
// internal, and no body carries the driver's text.
func TestStoreUnavailableIs503OnEveryRoute(t *testing.T) {
	t.Parallel()
	dbURL, err := url.Parse(pgtest.URL(t))
	require.NoError(t, err)
	proxy := newCutProxy(t, dbURL.Host)
	dbURL.Host = proxy.ln.Addr().String()
	q := dbURL.Query()
	q.Set("connect_timeout", "2")
	dbURL.RawQuery = q.Encode()
	b := setup(t, testserver.WithDB(dbURL.String()))

	in := b.register("worker", 30)
	task := b.enqueue(`{"task_type":"sleep"}`)
	held := b.claimTask(in, "sleep")
	require.Equal(t, http.StatusCreated, b.do("POST", "/v1/agents", `{"name":"research"}`).status)

	proxy.cut()

	tok := []string{"X-Vigil-Instance-Token", in.Token}
	id, epoch := itoa(task.TaskID), itoa(held.LeaseEpoch)
	lease := `{"instance_id":"` + in.ID + `","lease_epoch":` + epoch
	routes := []struct {
		method, path, body string
		headers            []string
	}{
		{"GET", "/healthz", "", nil},
		{"POST", "/v1/processes", `{"process_kind":"worker","hostname":"h","pid":1,"liveness_interval_s":30}`, nil},
		{"GET", "/v1/processes", "", nil},
		{"POST", "/v1/processes/prune", `{"older_than_s":60}`, nil},
		{"GET", "/v1/processes/" + in.ID, "", nil},
		{"POST", "/v1/processes/" + in.ID + "/heartbeat", "", tok},
		{"POST", "/v1/processes/" + in.ID + "/exit", "", tok},
		{"GET", "/v1/process-status/worker", "", nil},
		{"POST", "/v1/tasks", `{"task_type":"sleep"}`, nil},
		{"GET", "/v1/tasks", "", nil},
		{"GET", "/v1/tasks/" + id, "", nil},
		{"POST", "/v1/tasks/claim", `{"instance_id":"` + in.ID + `","task_types":["sleep"]}`, tok},
		{"POST", "/v1/tasks/claim", `{"instance_id":"` + in.ID + `","task_types":["sleep"],"max_tasks":2}`, tok},
		{"POST", "/v1/tasks/complete", `{"instance_id":"` + in.ID + `","items":[{"task_id":` + id + `,"lease_epoch":` + epoch + `}]}`, tok},
		{"POST", "/v1/tasks/" + id + "/heartbeat", lease + `}`, tok},
		{"POST", "/v1/tasks/" + id + "/complete", lease + `,"result":1}`, tok},
		{"POST", "/v1/tasks/" + id + "/fail", lease + `,"error":"boom"}`, tok},
		{"POST", "/v1/tasks/" + id + "/release", lease + `}`, tok},
		{"GET", "/v1/tasks/stalled?kind=worker", "", nil},
		{"POST", "/v1/tasks/" + id + "/reclaim", `{"lease_epoch":` + epoch + `,"reason":"stalled"}`, nil},
		{"GET", "/v1/sweepers", "", nil},
		{"GET", "/v1/heartbeat-versions", "", nil},
		{"POST", "/v1/agents", `{"name":"critic"}`, nil},
		{"GET", "/v1/agents", "", nil},
		{"GET", "/v1/agents/research", "", nil},
		{"PATCH", "/v1/agents/research", `{"version":1,"function":"f"}`, nil},
		{"POST", "/v1/agents/research/mark-stopped", "", nil},
		{"POST", "/v1/agents/research/mark-active", "", nil},
		{"POST", "/v1/agents/research/planned-stop", `{"reason":"redeploy"}`, nil},
		{"GET", "/v1/agents/research/planned-stop", "", nil},
		{"POST", "/v1/events", `{"agent":"research","kind":"exit","exit_code":3,"run_duration_ms":1500,"stderr_tail":""}`, nil},
		{"GET", "/v1/events", "", nil},
		{"POST", "/v1/events/1/ack", "", nil},
		{"GET", "/v1/snapshot", "", nil},
		{"GET", "/v1/timeline", "", nil},
	}
	for _, rt := range routes {
		name := rt.method + " " + rt.path
		r := b.doFull(rt.method, rt.path, rt.body, rt.headers...)
		require.Equal(t, http.StatusServiceUnavailable, r.status, "%s: %s", name, r.body)
		require.Equal(t, strconv.Itoa(httpapi.RetryAfterUnavailable), r.header.Get("Retry-After"), name)
		code, msg := response{status: r.status, body: r.body}.errorCode(t)
		require.Equal(t, "unavailable", code, name)
		for _, leak := range []string{proxy.ln.Addr().String(), "dial", "connect", "SQLSTATE", "EOF", "pgx", "pgconn", "refused", "reset"} {
			require.NotContains(t, strings.ToLower(msg), strings.ToLower(leak), "%s: driver text in the body", name)
		}
	}
}

// fullResponse is a response with its headers.
type fullResponse struct {
	status int
	header http.Header
	body   []byte
}

// doFull is do that keeps the response headers.
func (b *testBundle) doFull(method, path, body string, headers ...string) fullResponse {
	b.t.Helper()
	req, err := http.NewRequestWithContext(b.t.Context(), method, b.srv.URL+path, strings.NewReader(body))
	require.NoError(b.t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json") // /v1 writes are JSON only
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil && !errors.Is(err, io.EOF) {
		require.NoError(b.t, err)
	}
	return fullResponse{status: resp.StatusCode, header: resp.Header, body: data}
}

// On SQLite the honest outage is a lock another process holds past the
// busy timeout (10s): a write then answers 503 unavailable, not 500.
func TestSQLiteLockedPastBusyTimeoutIs503(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "vigil.db")
	b := setup(t, testserver.WithDB(path))
	b.enqueue(`{"task_type":"sleep"}`)

	// With a busy timeout of its own: the server writes every second (its
	// store pulse), and BEGIN EXCLUSIVE must wait for that, not fail.
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(20000)")
	require.NoError(t, err)
	defer db.Close()
	conn, err := db.Conn(t.Context())
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(t.Context(), "BEGIN EXCLUSIVE")
	require.NoError(t, err)

	r := b.doFull("POST", "/v1/tasks", `{"task_type":"sleep"}`)
	_, _ = conn.ExecContext(t.Context(), "ROLLBACK")
	require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
	require.Equal(t, strconv.Itoa(httpapi.RetryAfterUnavailable), r.header.Get("Retry-After"))
	code, msg := response{status: r.status, body: r.body}.errorCode(t)
	require.Equal(t, "unavailable", code)
	require.NotContains(t, msg, "locked")
	require.NotContains(t, msg, "SQLITE")
}
