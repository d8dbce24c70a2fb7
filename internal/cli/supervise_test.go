package cli

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// vigil supervise runs a fleet for a server elsewhere: the agents are
// registered there and their exits recorded there.
func TestSuperviseReportsToARemoteServer(t *testing.T) {
	srv := testserver.Start(t)
	dir := t.TempDir()
	fleet := filepath.Join(dir, "fleet.yaml")
	require.NoError(t, os.WriteFile(fleet, []byte(`agents:
  - name: remote-crasher
    command: ["sh", "-c", "echo \"url=$VIGIL_URL\" >&2; exit 5"]
`), 0o644))

	runCommand(t, "supervise", "--server", srv.URL, "--fleet", fleet, "--log-dir", filepath.Join(dir, "logs"),
		"--backoff-min", "1h", "--backoff-max", "1h")
	ctx := context.Background()

	c, err := vigilclient.New([]string{srv.URL})
	require.NoError(t, err)
	var page *vigilclient.EventPage
	require.Eventually(t, func() bool {
		page, err = c.ListEvents(ctx, vigilclient.ListEventsParams{Agent: "remote-crasher"})
		require.NoError(t, err)
		return len(page.Events) == 1
	}, 15*time.Second, 20*time.Millisecond, "the exit event on the server")
	e := page.Events[0]
	require.Equal(t, vigiltype.EventExit, e.Kind)
	require.Equal(t, 5, *e.ExitCode)
	require.Equal(t, "url="+srv.URL+"\n", e.StderrTail, "the agent was pointed at --server")

	a, err := c.GetAgent(ctx, "remote-crasher")
	require.NoError(t, err)
	require.Equal(t, vigiltype.AgentActive, a.Status)
}

func TestSuperviseNeedsAServer(t *testing.T) {
	dir := t.TempDir()
	fleet := filepath.Join(dir, "fleet.yaml")
	require.NoError(t, os.WriteFile(fleet, []byte("agents:\n  - name: a\n    command: [\"true\"]\n"), 0o644))
	code, _, errOut := run(t, "supervise", "--server", "http://127.0.0.1:1", "--fleet", fleet, "--log-dir", dir, "--server-wait", "0s")
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "--server http://127.0.0.1:1")
	code, _, errOut = run(t, "supervise", "--server", "http://127.0.0.1:1", "--fleet", fleet, "--stall-after", "0s")
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "--stall-after must be at least 1s")
}

// An agent registered later through the API, whose config asks this host to
// launch it, is picked up without a restart; one for another host is not.
func TestSupervisePicksUpRegisteredAgents(t *testing.T) {
	srv := testserver.Start(t)
	dir := t.TempDir()
	fleet := filepath.Join(dir, "fleet.yaml")
	require.NoError(t, os.WriteFile(fleet, []byte("agents:\n  - name: base\n    command: [\"sleep\", \"1000\"]\n"), 0o644))

	stderr := runCommand(t, "supervise", "--server", srv.URL, "--fleet", fleet, "--log-dir", filepath.Join(dir, "logs"),
		"--control-poll", "20ms", "--backoff-min", "1h", "--backoff-max", "1h")
	ctx := context.Background()

	c, err := vigilclient.New([]string{srv.URL})
	require.NoError(t, err)
	launch := func(host string) map[string]any {
		return map[string]any{"launch": map[string]any{
			"host": host, "command": []string{"sh", "-c", "echo late arrival >&2; exit 6"},
		}}
	}
	_, err = c.RegisterAgent(ctx, vigilclient.AgentParams{Name: "late", Config: launch(hostname())})
	require.NoError(t, err)
	_, err = c.RegisterAgent(ctx, vigilclient.AgentParams{Name: "elsewhere", Config: launch("another-host")})
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		page, err := c.ListEvents(ctx, vigilclient.ListEventsParams{Agent: "late"})
		require.NoError(t, err)
		return len(page.Events) == 1 && *page.Events[0].ExitCode == 6 && page.Events[0].StderrTail == "late arrival\n"
	}, 15*time.Second, 20*time.Millisecond, "the late agent launched and its exit recorded")
	page, err := c.ListEvents(ctx, vigilclient.ListEventsParams{Agent: "elsewhere"})
	require.NoError(t, err)
	require.Empty(t, page.Events, "an agent for another host is not launched here")
	require.NotContains(t, stderr.String(), `agent=elsewhere`)
}

// A supervisor started before its server waits for it (--server-wait).
func TestWaitForServerRetries(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) < 3 {
			http.Error(w, `{"error":{"code":"unavailable","message":"starting"}}`, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	}))
	defer srv.Close()
	c, err := vigilclient.New([]string{srv.URL})
	require.NoError(t, err)
	quiet := slog.New(slog.DiscardHandler)
	require.NoError(t, waitForServer(context.Background(), c, time.Minute, quiet))
	require.EqualValues(t, 3, calls.Load())
	calls.Store(0)
	require.Error(t, waitForServer(context.Background(), c, 0, quiet), "no wait: the first failure is final")
}
