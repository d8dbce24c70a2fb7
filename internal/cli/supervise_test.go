package cli

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/store"
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
// launch it, is picked up without a restart when the supervisor runs with
// --allow-registered-launch and an operator wrote the config; one for
// another host is not. Launch commands are operator data (issue #13).
func TestSupervisePicksUpRegisteredAgents(t *testing.T) {
	srv := testserver.Start(t)
	dir := t.TempDir()
	fleet := filepath.Join(dir, "fleet.yaml")
	require.NoError(t, os.WriteFile(fleet, []byte("agents:\n  - name: base\n    command: [\"sleep\", \"1000\"]\n"), 0o644))

	stderr := runCommand(t, "supervise", "--server", srv.URL, "--fleet", fleet, "--log-dir", filepath.Join(dir, "logs"),
		"--control-poll", "20ms", "--backoff-min", "1h", "--backoff-max", "1h", "--allow-registered-launch")
	ctx := context.Background()

	c, err := vigilclient.New([]string{srv.URL})
	require.NoError(t, err)
	_, err = c.RegisterAgent(ctx, vigilclient.AgentParams{Name: "late", Config: launchAt(hostname(), "late arrival", 6)})
	require.NoError(t, err)
	_, err = c.RegisterAgent(ctx, vigilclient.AgentParams{Name: "elsewhere", Config: launchAt("another-host", "elsewhere", 7)})
	require.NoError(t, err)
	// A record from before roles: nobody knows who wrote its command.
	legacy, err := json.Marshal(launchAt(hostname(), "legacy", 8))
	require.NoError(t, err)
	_, err = srv.Store().AgentRegister(ctx, store.AgentRegisterParams{Name: "legacy", Function: "x", Config: legacy, Now: time.Now()})
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		page, err := c.ListEvents(ctx, vigilclient.ListEventsParams{Agent: "late"})
		require.NoError(t, err)
		return len(page.Events) == 1 && page.Events[0].ExitCode != nil && *page.Events[0].ExitCode == 6 &&
			page.Events[0].StderrTail == "late arrival\n"
	}, 15*time.Second, 20*time.Millisecond, "the late agent launched and its exit recorded")
	refusal := eventuallyRefused(t, c, "legacy")
	require.Contains(t, refusal, "written with no known role (written before roles)")
	page, err := c.ListEvents(ctx, vigilclient.ListEventsParams{Agent: "elsewhere"})
	require.NoError(t, err)
	require.Empty(t, page.Events, "an agent for another host is not launched here")
	require.NotContains(t, stderr.String(), `agent=elsewhere`)
	require.NotContains(t, stderr.String(), "legacy\n", "the legacy command never ran")
}

// Without --allow-registered-launch (the default) a supervisor runs only its
// fleet file's agents: the attack — an agent registered with a
// launch command for this host — launches nothing, and an event says why.
func TestSuperviseDoesNotLaunchRegisteredAgentsByDefault(t *testing.T) {
	srv := testserver.Start(t)
	dir := t.TempDir()
	fleet := filepath.Join(dir, "fleet.yaml")
	require.NoError(t, os.WriteFile(fleet, []byte("agents:\n  - name: base\n    command: [\"sleep\", \"1000\"]\n"), 0o644))
	pwned := filepath.Join(dir, "pwned")

	stderr := runCommand(t, "supervise", "--server", srv.URL, "--fleet", fleet, "--log-dir", filepath.Join(dir, "logs"),
		"--control-poll", "20ms", "--backoff-min", "1h", "--backoff-max", "1h")
	ctx := context.Background()
	c, err := vigilclient.New([]string{srv.URL})
	require.NoError(t, err)
	_, err = c.RegisterAgent(ctx, vigilclient.AgentParams{Name: "evil", Config: map[string]any{"launch": map[string]any{
		"host": hostname(), "command": []string{"sh", "-c", "id > " + pwned},
	}}})
	require.NoError(t, err)

	refusal := eventuallyRefused(t, c, "evil")
	require.Contains(t, refusal, "--allow-registered-launch")
	require.NoFileExists(t, pwned)
	require.Contains(t, stderr.String(), "registered agent not launched")
}

// launchAt is an agent config asking host to run a command that says
// what on stderr and exits with code.
func launchAt(host, what string, code int) map[string]any {
	return map[string]any{"launch": map[string]any{
		"host": host, "command": []string{"sh", "-c", "echo " + what + " >&2; exit " + strconv.Itoa(code)},
	}}
}

// eventuallyRefused waits for agent's one event, a launch_failure that
// says it was refused, and returns why.
func eventuallyRefused(t *testing.T, c *vigilclient.Client, agent string) string {
	t.Helper()
	var e vigiltype.ProcessEvent
	require.Eventually(t, func() bool {
		page, err := c.ListEvents(context.Background(), vigilclient.ListEventsParams{Agent: agent})
		require.NoError(t, err)
		if len(page.Events) == 0 {
			return false
		}
		e = page.Events[0]
		return true
	}, 15*time.Second, 20*time.Millisecond, "an event says why %s was not launched", agent)
	require.Equal(t, vigiltype.EventLaunchFailure, e.Kind)
	var detail struct {
		Error   string `json:"error"`
		Refused bool   `json:"refused"`
	}
	require.NoError(t, json.Unmarshal(e.Detail, &detail))
	require.True(t, detail.Refused)
	return detail.Error
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
