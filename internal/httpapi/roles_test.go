package httpapi_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/httpapi"
	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigiltype"
)

const (
	operatorToken = "operator-token-0123456789"
	agentToken    = "agent-token-0123456789abc"
	readToken     = "read-token-0123456789abcd"
	wrongToken    = "wrong-token-0123456789abc"
)

// withRoles serves with one token file per role, the operator's holding
// a second, rotated-in token before the one the tests use.
func withRoles(t *testing.T) testserver.Option {
	t.Helper()
	dir := t.TempDir()
	file := func(name, content string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		return path
	}
	return testserver.WithRoleTokenFiles(
		file("operator", "# operators\noperator-token-rotated-in-01\n"+operatorToken+"\n"),
		file("agent", agentToken+"\n"),
		file("read", readToken+"\n"))
}

// roleSpec is what the API's routes are meant to need, written here apart
// from the route table so that the table is checked, not copied: the role
// of each route, and whether the task's holder may call it with its
// instance token.
var roleSpec = map[string]struct {
	need   string // "" public, "read", "agent", "operator"
	holder bool
}{
	"GET /healthz":                        {"", false},
	"GET /{$}":                            {"", false},
	"GET /assets/":                        {"", false},
	"GET /metrics":                        {"read", false},
	"/mcp":                                {"read", false},
	"GET /v1/processes":                   {"read", false},
	"GET /v1/processes/prune":             {"read", false},
	"GET /v1/processes/{id}":              {"read", false},
	"GET /v1/process-status/{kind}":       {"read", false},
	"GET /v1/tasks":                       {"read", false},
	"GET /v1/tasks/claim":                 {"read", false},
	"GET /v1/tasks/{id}":                  {"read", false},
	"GET /v1/tasks/stalled":               {"read", false},
	"GET /v1/sweepers":                    {"read", false},
	"GET /v1/heartbeat-versions":          {"read", false},
	"GET /v1/agents":                      {"read", false},
	"GET /v1/agents/{name}":               {"read", false},
	"GET /v1/agents/{name}/planned-stop":  {"read", false},
	"GET /v1/events":                      {"read", false},
	"GET /v1/snapshot":                    {"read", false},
	"GET /v1/timeline":                    {"read", false},
	"POST /v1/processes":                  {"agent", false},
	"POST /v1/processes/{id}/heartbeat":   {"agent", false},
	"POST /v1/processes/{id}/exit":        {"agent", false},
	"POST /v1/tasks":                      {"agent", false},
	"POST /v1/tasks/claim":                {"agent", false},
	"POST /v1/tasks/complete":             {"agent", false},
	"POST /v1/tasks/{id}/{op}":            {"agent", false},
	"POST /v1/events":                     {"agent", false},
	"POST /v1/processes/prune":            {"operator", false},
	"POST /v1/tasks/{id}/reclaim":         {"operator", true},
	"POST /v1/agents":                     {"operator", false},
	"PATCH /v1/agents/{name}":             {"operator", false},
	"POST /v1/agents/{name}/mark-stopped": {"operator", false},
	"POST /v1/agents/{name}/mark-active":  {"operator", false},
	"POST /v1/agents/{name}/planned-stop": {"operator", false},
	"POST /v1/events/{id}/ack":            {"operator", false},
}

var roleRank = map[string]int{"": 0, "read": 1, "agent": 2, "operator": 3}

// request turns a route pattern into a request a test can send: a method
// and a concrete path, with a body that every handler refuses or answers
// without writing, so that every token meets the same state.
func request(pattern string) (method, path, body string) {
	method, path, ok := strings.Cut(pattern, " ")
	if !ok {
		method, path = http.MethodPost, pattern // "/mcp": every method; GET would open a stream
	}
	path = strings.NewReplacer("{id}", "1", "{name}", "nobody", "{kind}", "nobody", "{op}", "heartbeat", "{$}", "").Replace(path)
	if strings.HasSuffix(path, "/assets/") {
		path += "app.js"
	}
	if method != http.MethodGet {
		body = `{}`
	}
	return method, path, body
}

// Every route with no token, a wrong token and each role's token: no token
// and a wrong one get 401 but on the public routes; a role the route does
// not need is 403 forbidden naming both roles; a role it needs gets the
// operator's own answer. Then a server without token files: every request
// gets the operator's answer.
func TestEveryRouteByRole(t *testing.T) {
	t.Parallel()
	b := setup(t, withRoles(t))
	open := setup(t)

	routes := httpapi.Routes()
	seen := map[string]bool{}
	for _, rt := range routes {
		spec, ok := roleSpec[rt.Pattern]
		require.True(t, ok, "route %s is not in this test's roleSpec: decide the role it needs, here and in docs/api.md", rt.Pattern)
		require.Equal(t, spec.need, string(rt.Need), "role of %s", rt.Pattern)
		require.Equal(t, spec.holder, rt.Holder, "holder rule of %s", rt.Pattern)
		seen[rt.Pattern] = true
	}
	for pattern := range roleSpec {
		require.True(t, seen[pattern], "roleSpec names %s, which the API does not serve", pattern)
	}

	for _, rt := range routes {
		method, path, body := request(rt.Pattern)
		ref := b.as(operatorToken).do(method, path, body)
		require.NotEqual(t, http.StatusUnauthorized, ref.status, "%s as operator: %s", rt.Pattern, ref.body)
		if ref.status == http.StatusForbidden {
			code, _ := ref.errorCode(t)
			require.Equal(t, "invalid_token", code, "%s as operator: only a missing instance token: %s", rt.Pattern, ref.body)
		}
		if method == http.MethodPost && path == "/mcp" {
			ref.status = 0 // MCP's answer to a bare {} varies with its session state; only the refusals count
		}
		same := func(who string, r response) {
			t.Helper()
			if ref.status == 0 {
				require.NotEqual(t, http.StatusUnauthorized, r.status, "%s %s", rt.Pattern, who)
				if r.status == http.StatusForbidden {
					code, _ := r.errorCode(t)
					require.NotEqual(t, "forbidden", code, "%s %s", rt.Pattern, who)
				}
				return
			}
			require.Equal(t, ref.status, r.status, "%s %s gets the operator's answer: %s", rt.Pattern, who, r.body)
		}

		for _, who := range []struct{ name, token string }{{"with no token", ""}, {"with a wrong token", wrongToken}} {
			r := b.as(who.token).do(method, path, body)
			if rt.Need == "" {
				same(who.name, r)
				continue
			}
			require.Equal(t, http.StatusUnauthorized, r.status, "%s %s: %s", rt.Pattern, who.name, r.body)
			require.Equal(t, `Bearer realm="vigil"`, r.header.Get("WWW-Authenticate"))
		}
		for _, role := range []struct{ name, token string }{{"read", readToken}, {"agent", agentToken}, {"operator", operatorToken}} {
			r := b.as(role.token).do(method, path, body)
			if roleRank[role.name] >= roleRank[string(rt.Need)] {
				same("as "+role.name, r)
				continue
			}
			require.Equal(t, http.StatusForbidden, r.status, "%s as %s: %s", rt.Pattern, role.name, r.body)
			code, msg := r.errorCode(t)
			require.Equal(t, "forbidden", code)
			require.Contains(t, msg, rt.Pattern+" needs the "+string(rt.Need)+" role")
			require.Contains(t, msg, "this token has the "+role.name+" role")
		}
		same("on a server without token files", open.do(method, path, body))
	}
}

// An agent token cannot reclaim, prune, stop, register a launch, change
// one, plan a stop or ack: each is 403 naming the operator role, and
// nothing is written. The operator's token can.
func TestAgentTokenCannotTakeOperatorActions(t *testing.T) {
	t.Parallel()
	b := setup(t, withRoles(t))
	op, ag := b.as(operatorToken), b.as(agentToken)

	op.do("POST", "/v1/agents", `{"name":"worker","function":"w","tick_cron":""}`)
	worker := op.agent("worker")
	in := ag.register("worker", 30)
	ag.enqueue(`{"task_type":"work"}`)
	held := ag.claimTask(in, "work")
	ev := ag.do("POST", "/v1/events", `{"agent":"worker","kind":"exit","exit_code":1}`)
	require.Equal(t, http.StatusCreated, ev.status, "%s", ev.body)
	var event vigiltype.ProcessEvent
	ev.decode(t, &event)

	launch := `{"launch":{"host":"` + must(os.Hostname()) + `","command":["/bin/sh","-c","id > /tmp/pwned"]}}`
	calls := []struct{ name, method, path, body string }{
		{"reclaim", "POST", "/v1/tasks/" + itoa(held.TaskID) + "/reclaim", `{"lease_epoch":` + itoa(held.LeaseEpoch) + `,"reason":"mine now"}`},
		{"prune", "POST", "/v1/processes/prune", `{"older_than_s":1}`},
		{"stop", "POST", "/v1/agents/worker/mark-stopped", ``},
		{"start", "POST", "/v1/agents/worker/mark-active", ``},
		{"planned stop", "POST", "/v1/agents/worker/planned-stop", `{"reason":"deploy"}`},
		{"register a launch", "POST", "/v1/agents", `{"name":"evil","function":"x","tick_cron":"","config":` + launch + `}`},
		{"change a launch", "PATCH", "/v1/agents/worker", `{"version":` + itoa(worker.Version) + `,"config":` + launch + `}`},
		{"ack", "POST", "/v1/events/" + itoa(event.EventID) + "/ack", `{}`},
	}
	for _, c := range calls {
		r := ag.do(c.method, c.path, c.body)
		require.Equal(t, http.StatusForbidden, r.status, "%s: %s", c.name, r.body)
		code, msg := r.errorCode(t)
		require.Equal(t, "forbidden", code, c.name)
		require.Contains(t, msg, "needs the operator role", c.name)
		require.Contains(t, msg, "this token has the agent role", c.name)
	}
	// Nothing was written.
	require.Equal(t, vigiltype.TaskRunning, op.task(held.TaskID).Status)
	require.Equal(t, worker, op.agent("worker"), "the record is as it was")
	require.Equal(t, 1, op.agentCount())
	require.Equal(t, http.StatusNotFound, op.do("GET", "/v1/agents/worker/planned-stop", "").status)
	require.Nil(t, op.events("").Events[0].DeliveredAt)

	// The operator may do each of them.
	for _, c := range calls {
		if c.name == "change a launch" {
			c.body = `{"version":` + itoa(op.agent("worker").Version) + `,"config":` + launch + `}`
		}
		r := op.do(c.method, c.path, c.body)
		require.Less(t, r.status, 300, "%s as operator: %s", c.name, r.body)
	}
	// The registry keeps who wrote each launch command.
	require.Equal(t, "operator", op.agent("evil").ConfigWrittenBy)
	require.Equal(t, "operator", op.agent("worker").ConfigWrittenBy)
}

// Attack 2: a second instance cannot take another's running task, not
// with its own instance token, not without one, not by guessing the next
// epoch; the holder can with its own, and so can the operator.
func TestOnlyTheHolderOrAnOperatorReclaims(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		opts   []testserver.Option
		second string // the second instance's bearer token
	}{
		{"token files", nil, agentToken},
		{"open loopback server", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var b *testBundle
			if tc.second == "" {
				b = setup(t)
			} else {
				b = setup(t, withRoles(t))
			}
			ag := b.as(tc.second)
			holder, second := ag.register("worker", 30), ag.register("worker", 30)
			ag.enqueue(`{"task_type":"work"}`)
			held := ag.claimTask(holder, "work")
			path := "/v1/tasks/" + itoa(held.TaskID) + "/reclaim"
			body := func(epoch int64) string { return `{"lease_epoch":` + itoa(epoch) + `,"reason":"taken"}` }

			r := ag.do("POST", path, body(held.LeaseEpoch), "X-Vigil-Instance-Token", second.Token)
			require.Equal(t, http.StatusForbidden, r.status, "%s", r.body)
			code, msg := r.errorCode(t)
			require.Equal(t, "invalid_token", code)
			require.Contains(t, msg, "only its holder (instance "+holder.ID+") or an operator may")
			r = ag.do("POST", path, body(held.LeaseEpoch+1), "X-Vigil-Instance-Token", second.Token)
			require.Equal(t, http.StatusConflict, r.status, "the next epoch: %s", r.body)
			if tc.second != "" {
				r = ag.do("POST", path, body(held.LeaseEpoch))
				require.Equal(t, http.StatusForbidden, r.status, "%s", r.body)
				code, _ = r.errorCode(t)
				require.Equal(t, "forbidden", code)
			}
			task := ag.task(held.TaskID)
			require.Equal(t, vigiltype.TaskRunning, task.Status)
			require.Equal(t, holder.ID, *task.LeaseOwner)
			require.Equal(t, http.StatusOK, ag.leaseOp(holder, held.TaskID, held.LeaseEpoch, "heartbeat", "").status,
				"the holder still holds it")

			r = ag.do("POST", path, body(held.LeaseEpoch), "X-Vigil-Instance-Token", holder.Token)
			require.Equal(t, http.StatusOK, r.status, "the holder gives its own task up: %s", r.body)
			require.Equal(t, vigiltype.TaskScheduled, ag.task(held.TaskID).Status)

			again := ag.claimTask(second, "work")
			op := b.as(operatorToken)
			if tc.second == "" {
				op = b
			}
			r = op.do("POST", path, body(again.LeaseEpoch))
			require.Equal(t, http.StatusOK, r.status, "the operator reclaims without an instance token: %s", r.body)
		})
	}
}

// lockedBuffer is an io.Writer safe for the server's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// lines are the JSON log lines written so far whose msg is msg.
func (l *lockedBuffer) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.buf.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// Every write leaves an audit line with its route, status, the role of its
// token and the instance it acted for; a refusal for want of a role too, at
// WARN; routine agent traffic at DEBUG; never a token.
func TestAuditLineCarriesTheRole(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	b := setup(t, withRoles(t), testserver.WithLogger(logger))
	ag := b.as(agentToken)

	in := ag.register("worker", 30)
	ag.enqueue(`{"task_type":"work"}`)
	held := ag.claimTask(in, "work")
	require.Equal(t, http.StatusOK, ag.leaseOp(in, held.TaskID, held.LeaseEpoch, "complete", `,"result":{}`).status)
	require.Equal(t, http.StatusForbidden, ag.do("POST", "/v1/processes/prune", `{"older_than_s":1}`).status)
	require.Equal(t, http.StatusOK, b.as(operatorToken).do("POST", "/v1/processes/prune", `{"older_than_s":1}`).status)
	require.Equal(t, http.StatusOK, b.as(readToken).do("GET", "/v1/tasks", "").status)

	type line struct{ level, route, role, instance string }
	var got []line
	for _, m := range logs.lines(t, "audit") {
		instance, _ := m["instance"].(string)
		got = append(got, line{m["level"].(string), m["route"].(string), m["role"].(string), instance})
	}
	require.Equal(t, []line{
		{"INFO", "POST /v1/processes", "agent", in.ID},
		{"INFO", "POST /v1/tasks", "agent", ""},
		{"INFO", "POST /v1/tasks/claim", "agent", in.ID},
		{"INFO", "POST /v1/tasks/{id}/{op}", "agent", in.ID},
		{"WARN", "POST /v1/processes/prune", "agent", ""},
		{"INFO", "POST /v1/processes/prune", "operator", ""},
	}, got, "one line a write, none for the read")

	require.Equal(t, http.StatusOK, ag.do("POST", "/v1/processes/"+in.ID+"/heartbeat", "", "X-Vigil-Instance-Token", in.Token).status)
	last := logs.lines(t, "audit")
	require.Equal(t, "DEBUG", last[len(last)-1]["level"], "a heartbeat's line is at DEBUG")
	require.Equal(t, in.ID, last[len(last)-1]["instance"])

	require.Equal(t, http.StatusUnauthorized, b.as(wrongToken).do("POST", "/v1/tasks", `{"task_type":"work"}`).status)
	require.Len(t, logs.lines(t, "refused request: no or wrong bearer token"), 1)
	for _, tok := range []string{operatorToken, agentToken, readToken, wrongToken, in.Token} {
		require.NotContains(t, logs.buf.String(), tok, "no token in the log")
	}
}
