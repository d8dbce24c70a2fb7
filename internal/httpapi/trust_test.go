package httpapi_test

import (
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/httpapi"
	"github.com/vigil-fleet/vigil/internal/store/pgstore/pgtest"
	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// hostPort is the server's own host:port, e.g. 127.0.0.1:41234.
func (b *testBundle) hostPort() string { return strings.TrimPrefix(b.srv.URL, "http://") }

// agentCount is how many agents the registry holds.
func (b *testBundle) agentCount() int {
	b.t.Helper()
	r := b.do("GET", "/v1/agents", "")
	require.Equal(b.t, http.StatusOK, r.status, "%s", r.body)
	var list struct {
		Agents []vigiltype.Agent `json:"agents"`
	}
	r.decode(b.t, &list)
	return len(list.Agents)
}

// taskCount is how many tasks the store holds.
func (b *testBundle) taskCount() int {
	b.t.Helper()
	r := b.do("GET", "/v1/tasks", "")
	require.Equal(b.t, http.StatusOK, r.status, "%s", r.body)
	var list struct {
		Tasks []vigiltype.Task `json:"tasks"`
	}
	r.decode(b.t, &list)
	return len(list.Tasks)
}

// What a browser can send — a "simple" cross-site POST (text/plain, a form
// encoding), a request for another Host (DNS rebinding), a request from a
// foreign Origin — is refused before any handler and writes nothing; the
// dashboard's page and same-origin requests still work.
func TestBrowserHolesAreClosed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	self := b.hostPort()
	_, port, _ := strings.Cut(self, ":")
	agent := `{"name":"a1","function":"x","tick_cron":""}`
	task := `{"task_type":"sleep"}`

	cases := []struct {
		name, method, path, body string
		headers                  []string
		status                   int
		code                     string
	}{
		// Content-Type on /v1 writes.
		{"text/plain POST", "POST", "/v1/agents", agent, []string{"Content-Type", "text/plain;charset=UTF-8"}, 415, "unsupported_media_type"},
		{"form POST", "POST", "/v1/tasks", task, []string{"Content-Type", "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"},
		{"multipart POST", "POST", "/v1/tasks", task, []string{"Content-Type", "multipart/form-data; boundary=x"}, 415, "unsupported_media_type"},
		{"no Content-Type with a body", "POST", "/v1/tasks", task, []string{"Content-Type", ""}, 415, "unsupported_media_type"},
		{"JSON in another charset", "POST", "/v1/tasks", task, []string{"Content-Type", "application/json; charset=utf-16"}, 415, "unsupported_media_type"},
		{"JSON look-alike", "POST", "/v1/tasks", task, []string{"Content-Type", "application/jsonx"}, 415, "unsupported_media_type"},
		{"text/plain PATCH", "PATCH", "/v1/agents/a1", `{"version":1,"function":"y"}`, []string{"Content-Type", "text/plain"}, 415, "unsupported_media_type"},
		{"text/plain DELETE", "DELETE", "/v1/agents/a1", "", []string{"Content-Type", "text/plain"}, 415, "unsupported_media_type"},
		// Host (DNS rebinding).
		{"foreign Host GET", "GET", "/v1/agents", "", []string{"Host", "attacker.example:" + port}, 421, "misdirected_request"},
		{"foreign Host POST", "POST", "/v1/tasks", task, []string{"Host", "attacker.example:" + port}, 421, "misdirected_request"},
		{"foreign Host dashboard", "GET", "/", "", []string{"Host", "attacker.example:" + port}, 421, "misdirected_request"},
		{"foreign Host metrics", "GET", "/metrics", "", []string{"Host", "attacker.example"}, 421, "misdirected_request"},
		{"foreign Host MCP", "POST", "/mcp", `{}`, []string{"Host", "attacker.example:" + port}, 421, "misdirected_request"},
		// Origin.
		{"foreign Origin POST", "POST", "/v1/tasks", task, []string{"Origin", "http://evil.example"}, 403, "forbidden_origin"},
		{"foreign Origin GET", "GET", "/v1/agents", "", []string{"Origin", "http://evil.example"}, 403, "forbidden_origin"},
		{"other loopback origin", "GET", "/v1/agents", "", []string{"Origin", "http://localhost:" + port}, 403, "forbidden_origin"},
		{"same host, other port", "POST", "/v1/tasks", task, []string{"Origin", "http://127.0.0.1:1"}, 403, "forbidden_origin"},
		{"null Origin", "POST", "/v1/tasks", task, []string{"Origin", "null"}, 403, "forbidden_origin"},
		{"foreign Origin metrics", "GET", "/metrics", "", []string{"Origin", "http://evil.example"}, 403, "forbidden_origin"},
		{"foreign Origin MCP", "POST", "/mcp", `{}`, []string{"Origin", "http://evil.example"}, 403, "forbidden_origin"},
		{"cross-site fetch metadata", "GET", "/v1/agents", "", []string{"Sec-Fetch-Site", "cross-site"}, 403, "forbidden_origin"},
		{"same-site fetch metadata", "GET", "/v1/agents", "", []string{"Sec-Fetch-Site", "same-site"}, 403, "forbidden_origin"},
		// What still works.
		{"JSON POST", "POST", "/v1/tasks", task, nil, 201, ""},
		{"JSON POST with charset", "POST", "/v1/tasks", task, []string{"Content-Type", "application/json; charset=utf-8"}, 201, ""},
		{"JSON POST with charset, any case", "POST", "/v1/tasks", task, []string{"Content-Type", "Application/JSON;Charset=UTF-8"}, 201, ""},
		{"bodyless POST without Content-Type", "POST", "/v1/agents/nope/mark-stopped", "", []string{"Content-Type", ""}, 404, "not_found"},
		{"same-origin POST", "POST", "/v1/tasks", task, []string{"Origin", "http://" + self, "Sec-Fetch-Site", "same-origin"}, 201, ""},
		{"same-origin GET", "GET", "/v1/agents", "", []string{"Origin", "http://" + self}, 200, ""},
		{"typed-in navigation", "GET", "/v1/agents", "", []string{"Sec-Fetch-Site", "none"}, 200, ""},
		{"localhost Host", "GET", "/v1/agents", "", []string{"Host", "localhost:" + port}, 200, ""},
		{"localhost Host and Origin", "POST", "/v1/tasks", task, []string{"Host", "localhost:" + port, "Origin", "http://localhost:" + port}, 201, ""},
		{"Host in capitals", "GET", "/v1/agents", "", []string{"Host", "LOCALHOST:" + port}, 200, ""},
		{"IPv6 loopback Host", "GET", "/v1/agents", "", []string{"Host", "[::1]:" + port}, 200, ""},
		{"loopback name on another port (a port forward)", "GET", "/v1/agents", "", []string{"Host", "localhost:9000"}, 200, ""},
		{"port forward, its own Origin", "POST", "/v1/tasks", task, []string{"Host", "localhost:9000", "Origin", "http://localhost:9000"}, 201, ""},
		{"healthz for any Host", "GET", "/healthz", "", []string{"Host", "lb-check.internal"}, 200, ""},
		{"dashboard page, foreign Origin", "GET", "/", "", []string{"Origin", "http://evil.example"}, 200, ""},
		{"dashboard asset, cross-site", "GET", "/assets/app.js", "", []string{"Origin", "http://evil.example", "Sec-Fetch-Site", "cross-site"}, 200, ""},
	}
	for _, tc := range cases {
		agentsBefore, tasksBefore := b.agentCount(), b.taskCount()
		r := b.do(tc.method, tc.path, tc.body, tc.headers...)
		require.Equal(t, tc.status, r.status, "%s: %s", tc.name, r.body)
		if tc.code != "" {
			code, msg := r.errorCode(t)
			require.Equal(t, tc.code, code, "%s: %s", tc.name, msg)
			require.NotEmpty(t, msg, tc.name)
		}
		if tc.status >= 400 {
			require.Equal(t, agentsBefore, b.agentCount(), "%s wrote an agent", tc.name)
			require.Equal(t, tasksBefore, b.taskCount(), "%s wrote a task", tc.name)
		}
	}
}

// The attack: one cross-site text/plain POST registering an agent
// with a launch config. Refused, with or without the Origin a browser adds,
// and nothing is written.
func TestCrossSiteLaunchRegistrationIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := `{"name":"evil","function":"x","tick_cron":"","config":{"launch":{"host":"h","command":["/bin/sh","-c","id > /tmp/pwned"]}}}`
	for _, headers := range [][]string{
		{"Content-Type", "text/plain;charset=UTF-8", "Origin", "http://evil.example"},
		{"Content-Type", "text/plain;charset=UTF-8"},
		{"Content-Type", "application/json", "Origin", "http://evil.example"},
		{"Content-Type", "application/json", "Host", "evil.example:7711"},
	} {
		r := b.do("POST", "/v1/agents", body, headers...)
		require.GreaterOrEqual(t, r.status, 400, "%v: %s", headers, r.body)
		require.Less(t, r.status, 500, "%v: %s", headers, r.body)
		require.Equal(t, 0, b.agentCount(), "%v", headers)
	}
	r := b.do("GET", "/v1/agents/evil", "")
	require.Equal(t, http.StatusNotFound, r.status)
}

// The bearer token is matched exactly: the "Bearer" scheme as written, one
// space, the token with nothing trimmed from it. A 401 says how to
// authenticate (RFC 6750).
func TestBearerTokenIsMatchedExactly(t *testing.T) {
	t.Parallel()
	const token = "s3cret-token-0123456789"
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(token+"\n"), 0o600))
	b := setup(t, testserver.WithTokenFile(tokenFile))

	for _, auth := range []string{
		"", "Bearer", "Bearer ", "bearer " + token, "BEARER " + token, "Basic " + token,
		"Bearer  " + token, "Bearer\t" + token, "Bearer " + token + " x", "Bearer " + token[:10],
		"Bearer " + token + "0", token,
	} {
		r := b.do("GET", "/v1/processes", "", "Authorization", auth)
		require.Equal(t, http.StatusUnauthorized, r.status, "Authorization: %q", auth)
		require.Equal(t, `Bearer realm="vigil"`, r.header.Get("WWW-Authenticate"), "Authorization: %q", auth)
		code, _ := r.errorCode(t)
		require.Equal(t, "unauthorized", code)
	}
	r := b.do("GET", "/v1/processes", "", "Authorization", "Bearer "+token)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Empty(t, r.header.Get("WWW-Authenticate"))
}

// --allowed-host adds names: NAME on any port, NAME:PORT on that one.
func TestAllowedHostsAreServed(t *testing.T) {
	t.Parallel()
	b := setup(t, testserver.WithAllowedHosts("vigil.internal", "Tunnel.Example.:9000", "[fd00::1]:7711"))
	for host, want := range map[string]int{
		"vigil.internal":        200,
		"vigil.internal:443":    200,
		"VIGIL.internal.:1234":  200,
		"tunnel.example:9000":   200,
		"tunnel.example:9001":   421,
		"tunnel.example":        421,
		"[fd00::1]:7711":        200,
		"[fd00:0::1]:7711":      200,
		"[fd00::1]:7712":        421,
		"vigil.internal.evil":   421,
		"evil.vigil.internal":   421,
		"127.0.0.1.nip.io:7711": 421,
	} {
		require.Equal(t, want, b.do("GET", "/v1/agents", "", "Host", host).status, "Host %s", host)
	}
}

// A server listening on every interface answers for its own addresses and
// names with its port, never for any name at all; a malformed
// --allowed-host is refused with what to write instead.
func TestServedHosts(t *testing.T) {
	t.Parallel()
	hostname, err := os.Hostname()
	require.NoError(t, err)
	for _, listen := range []string{"0.0.0.0:7711", "[::]:7711"} {
		hosts, err := httpapi.ServedHosts(listen, []string{"vigil.internal"})
		require.NoError(t, err)
		require.Subset(t, hosts, httpapi.LoopbackHosts)
		require.Contains(t, hosts, net.JoinHostPort(hostname, "7711"))
		require.Contains(t, hosts, "vigil.internal")
		addrs, err := net.InterfaceAddrs()
		require.NoError(t, err)
		for _, a := range addrs {
			require.Contains(t, hosts, net.JoinHostPort(a.(*net.IPNet).IP.String(), "7711"))
		}
		for _, h := range hosts {
			require.NotContains(t, []string{"0.0.0.0:7711", "[::]:7711", ":7711"}, h)
		}
	}
	hosts, err := httpapi.ServedHosts("10.1.2.3:7711", nil)
	require.NoError(t, err)
	require.Contains(t, hosts, "10.1.2.3:7711")
	require.Subset(t, hosts, httpapi.LoopbackHosts)

	for _, bad := range []string{"", "http://vigil.internal", "vigil.internal/x", "vigil.internal:0", "vigil.internal:http", "a b", "user@host"} {
		_, err := httpapi.ServedHosts("127.0.0.1:7711", []string{bad})
		require.Error(t, err, "%q", bad)
	}
}
