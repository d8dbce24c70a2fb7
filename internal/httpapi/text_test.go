package httpapi_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/store/pgstore/pgtest"
	"github.com/vigil-fleet/vigil/internal/testserver"
)

// One text rule for every stored string — valid UTF-8, no control
// characters — is applied before the store, so SQLite and PostgreSQL give
// the same 400 naming the field (before it, a NUL in a signal was stored by
// SQLite and refused by PostgreSQL with driver text; an escape sequence was
// stored by both; invalid UTF-8 became U+FFFD). The two fields holding a
// program's output, stderr_tail and a failure's error, keep newlines and
// tabs and have the rest cleaned, alike on both. A planned stop for an
// unknown agent is a 404, and a bad time names its field.
func TestTextRuleIsTheSameOnBothStores(t *testing.T) {
	t.Parallel()
	for name, db := range map[string]func(t *testing.T) []testserver.Option{
		"sqlite":   func(*testing.T) []testserver.Option { return nil },
		"postgres": func(t *testing.T) []testserver.Option { return []testserver.Option{testserver.WithDB(pgtest.URL(t))} },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, db(t)...)
			exerciseTextRule(t, b)
		})
	}
}

func exerciseTextRule(t *testing.T, b *testBundle) {
	in := b.register("worker", 30)
	require.Equal(t, http.StatusCreated, b.do("POST", "/v1/agents", `{"name":"a1","function":"x"}`).status)
	b.enqueue(`{"task_type":"sleep"}`)
	held := b.claimTask(in, "sleep")
	tok := []string{"X-Vigil-Instance-Token", in.Token}
	lease := func(extra string) string {
		return `{"instance_id":"` + in.ID + `","lease_epoch":` + itoa(held.LeaseEpoch) + extra + `}`
	}
	taskPath := "/v1/tasks/" + itoa(held.TaskID)
	const text = "must be UTF-8 text without control characters"
	const utf8 = "must be valid UTF-8"

	cases := []struct {
		name, method, path, body string
		headers                  []string
		status                   int
		code, msg                string
	}{
		{"signal NUL", "POST", "/v1/events", `{"agent":"a1","kind":"stall_kill","signal":"SIG\u0000KILL"}`, nil, 400, "invalid", "signal: " + text},
		{"signal escape", "POST", "/v1/events", `{"agent":"a1","kind":"stall_kill","signal":"\u001b[2J"}`, nil, 400, "invalid", "signal: " + text},
		{"signal DEL", "POST", "/v1/events", `{"agent":"a1","kind":"stall_kill","signal":"SIG\u007f"}`, nil, 400, "invalid", "signal: " + text},
		{"signal C1 control", "POST", "/v1/events", `{"agent":"a1","kind":"stall_kill","signal":"SIG\u009b"}`, nil, 400, "invalid", "signal: " + text},
		{"signal invalid UTF-8", "POST", "/v1/events", "{\"agent\":\"a1\",\"kind\":\"stall_kill\",\"signal\":\"SIG\xff\"}", nil, 400, "invalid", "signal: " + utf8},
		{"hostname invalid UTF-8", "POST", "/v1/processes", "{\"process_kind\":\"k\",\"hostname\":\"h\xc3\x28\",\"pid\":1,\"liveness_interval_s\":5}", nil, 400, "invalid", "hostname: " + utf8},
		{"function escape", "POST", "/v1/agents", `{"name":"a2","function":"\u001b]0;title\u0007"}`, nil, 400, "invalid", "function: " + text},
		{"function invalid UTF-8", "POST", "/v1/agents", "{\"name\":\"a2\",\"function\":\"\xfe\"}", nil, 400, "invalid", "function: " + utf8},
		{"tick_cron newline", "POST", "/v1/agents", `{"name":"a2","function":"x","tick_cron":"*/5\n* * * *"}`, nil, 400, "invalid", "tick_cron: " + text},
		{"config invalid UTF-8", "POST", "/v1/agents", "{\"name\":\"a2\",\"function\":\"x\",\"config\":{\"launch\":{\"host\":\"\xff\",\"command\":[\"x\"]}}}", nil, 400, "invalid", "config.launch.host: " + utf8},
		{"nested error field invalid UTF-8", "POST", "/v1/tasks", "{\"task_type\":\"sleep\",\"payload\":{\"error\":\"\xff\"}}", nil, 400, "invalid", "payload.error: " + utf8},
		{"key invalid UTF-8", "POST", "/v1/tasks", "{\"task_type\":\"sleep\",\"payload\":{\"a\":{\"\xff\":1}}}", nil, 400, "invalid", "payload.a: " + utf8},
		{"payload invalid UTF-8", "POST", "/v1/tasks", "{\"task_type\":\"sleep\",\"payload\":{\"list\":[1,\"\xff\"]}}", nil, 400, "invalid", "payload.list[1]: " + utf8},
		{"planned stop reason escape", "POST", "/v1/agents/a1/planned-stop", `{"reason":"deploy\u001b[1A"}`, nil, 400, "invalid", "reason: " + text},
		{"planned stop reason NUL", "POST", "/v1/agents/a1/planned-stop", `{"reason":"deploy\u0000"}`, nil, 400, "invalid", "reason: " + text},
		{"planned stop unknown agent", "POST", "/v1/agents/nope/planned-stop", `{"reason":"deploy"}`, nil, 404, "not_found", `agent "nope"`},
		{"reclaim reason escape", "POST", taskPath + "/reclaim", `{"lease_epoch":1,"reason":"stall\u001b[2K"}`, nil, 400, "invalid", "reason: " + text},
		{"activity_at not a time", "POST", taskPath + "/heartbeat", lease(`,"schema_version":2,"activity_at":"yesterday"`), tok, 400, "invalid", "activity_at: must be an RFC 3339 time"},
		{"activity_at not a string", "POST", taskPath + "/heartbeat", lease(`,"schema_version":2,"activity_at":17`), tok, 400, "invalid", "activity_at: must be an RFC 3339 time"},
		// An instance id the server could never have issued is refused the
		// same way on both stores, before the store (attacker finding F4:
		// PostgreSQL answered 400 with driver text, SQLite 404).
		{"instance id NUL in path", "POST", "/v1/processes/a%00b/heartbeat", "", tok, 400, "invalid", "instance_id: " + text},
		{"instance id invalid UTF-8 in path", "POST", "/v1/processes/a%FFb/heartbeat", "", tok, 400, "invalid", "instance_id: " + text},
		{"instance id NUL on read", "GET", "/v1/processes/a%00b", "", nil, 400, "invalid", "instance_id: " + text},
		{"instance id NUL on exit", "POST", "/v1/processes/a%00b/exit", "", tok, 400, "invalid", "instance_id: " + text},
		{"instance id NUL in claim", "POST", "/v1/tasks/claim", `{"instance_id":"a\u0000","task_types":["x"]}`, tok, 400, "invalid", "instance_id: " + text},
		{"instance id NUL in lease call", "POST", taskPath + "/heartbeat", `{"instance_id":"a\u0000","lease_epoch":1}`, tok, 400, "invalid", "instance_id: " + text},
	}
	for _, tc := range cases {
		r := b.do(tc.method, tc.path, tc.body, tc.headers...)
		require.Equal(t, tc.status, r.status, "%s: %s", tc.name, r.body)
		if tc.code != "" {
			code, msg := r.errorCode(t)
			require.Equal(t, tc.code, code, tc.name)
			require.Contains(t, msg, tc.msg, tc.name)
			require.NotContains(t, msg, "UTF8", tc.name)
			require.NotContains(t, msg, "0x00", tc.name)
		}
	}
	// Nothing refused was stored.
	require.Empty(t, b.events("").Events)
	require.Equal(t, http.StatusNotFound, b.do("GET", "/v1/agents/nope/planned-stop", "").status)
	require.Equal(t, http.StatusNotFound, b.do("GET", "/v1/agents/a2", "").status)

	// Captured output: lines and tabs kept, CR and other controls cleaned.
	r := b.do("POST", "/v1/events", "{\"agent\":\"a1\",\"kind\":\"exit\",\"stderr_tail\":\"panic: \\u001b[31mx\\u0000\\r\\n\\tat main.go:3\xff\\n\"}")
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.Equal(t, "panic: \uFFFD[31mx\uFFFD\n\tat main.go:3\uFFFD\n", b.events("").Events[0].StderrTail)
	r = b.leaseOp(in, held.TaskID, held.LeaseEpoch, "fail", `,"error":"Traceback:\n\tline 1\u001b[0m\r","retry_after_s":60`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, "Traceback:\n\tline 1\uFFFD[0m\n", *b.task(held.TaskID).LastError)
}
