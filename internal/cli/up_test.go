package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/supervisor"
	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// lockedBuffer is an io.Writer safe for the supervisor's and the logger's
// concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// vigil up registers the fleet's agents and records an agent's crash as a
// process event with its exit code and last stderr lines.
func TestUpRegistersAgentsAndRecordsExits(t *testing.T) {
	dir := t.TempDir()
	fleet := filepath.Join(dir, "fleet.yaml")
	require.NoError(t, os.WriteFile(fleet, []byte(`agents:
  - name: crasher
    command: ["sh", "-c", "echo 'giving up' >&2; exit 4"]
`), 0o644))

	stderr := runCommand(t, "up", "--fleet", fleet, "--db", filepath.Join(dir, "v.db"), "--addr", "127.0.0.1:0",
		"--backoff-min", "1h", "--backoff-max", "1h")
	ctx := context.Background()

	url := serverURL(t, stderr)
	c, err := vigilclient.New([]string{url})
	require.NoError(t, err)

	var page *vigilclient.EventPage
	require.Eventually(t, func() bool {
		page, err = c.ListEvents(ctx, vigilclient.ListEventsParams{Agent: "crasher"})
		require.NoError(t, err)
		return len(page.Events) == 1
	}, 15*time.Second, 20*time.Millisecond, "the crash event")
	e := page.Events[0]
	require.Equal(t, vigiltype.EventExit, e.Kind)
	require.Equal(t, 4, *e.ExitCode)
	require.Equal(t, "giving up\n", e.StderrTail)
	require.Nil(t, e.DeliveredAt, "an unplanned exit waits for a consumer")

	agents, err := c.ListAgents(ctx)
	require.NoError(t, err)
	require.Len(t, agents, 1)
	require.Equal(t, "crasher", agents[0].Name)
	require.Equal(t, vigiltype.AgentActive, agents[0].Status)
}

// A supervisor's start registers only the agents the registry does not
// know: an operator's stop or config outlives a restart of the supervisor.
func TestRegisterFleetKeepsExistingRecords(t *testing.T) {
	fleet := &supervisor.Fleet{Agents: []supervisor.Agent{
		{Name: "known", Command: []string{"a"}}, {Name: "new", Command: []string{"b", "--x"}},
	}}
	var registered []string
	err := registerFleet(context.Background(), fleet, func(_ context.Context, name string) (bool, error) {
		return name == "known", nil
	}, func(_ context.Context, name, function string) error {
		registered = append(registered, name+": "+function)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, []string{"new: b --x"}, registered)
}

// vigil restart produces a suppressed exit and a new process at once;
// vigil stop keeps the agent down (its exit suppressed too); vigil start
// brings it back.
func TestStopStartRestart(t *testing.T) {
	dir := t.TempDir()
	fleet := filepath.Join(dir, "fleet.yaml")
	require.NoError(t, os.WriteFile(fleet, []byte("agents:\n  - name: steady\n    command: [\"sleep\", \"1000\"]\n"), 0o644))

	stderr := runCommand(t, "up", "--fleet", fleet, "--db", filepath.Join(dir, "v.db"), "--addr", "127.0.0.1:0",
		"--control-poll", "20ms", "--backoff-min", "1h", "--backoff-max", "1h")
	ctx := context.Background()
	url := serverURL(t, stderr)
	starts := func() int { return strings.Count(stderr.String(), `msg="agent started" agent=steady`) }
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		require.Eventually(t, cond, 15*time.Second, 10*time.Millisecond, what)
	}
	c, err := vigilclient.New([]string{url})
	require.NoError(t, err)
	exits := func() []vigiltype.ProcessEvent {
		page, err := c.ListEvents(ctx, vigilclient.ListEventsParams{Agent: "steady"})
		require.NoError(t, err)
		return page.Events
	}
	waitFor("the first start", func() bool { return starts() == 1 })

	code, _, errOut := run(t, "restart", "steady", "--reason", "config change", "--server", url)
	require.Equal(t, 0, code, errOut)
	waitFor("the restart", func() bool { return starts() == 2 })
	evs := exits()
	require.Len(t, evs, 1)
	require.Equal(t, vigiltype.DeliverySuppressed, *evs[0].DeliveryKind, "a restart's exit is suppressed")

	code, _, errOut = run(t, "stop", "steady", "--reason", "maintenance", "--server", url)
	require.Equal(t, 0, code, errOut)
	waitFor("the agent to be held down", func() bool {
		return strings.Contains(stderr.String(), "not starting it until it is active")
	})
	evs = exits()
	require.Len(t, evs, 2)
	require.Equal(t, vigiltype.DeliverySuppressed, *evs[0].DeliveryKind, "a stop's exit is suppressed")
	require.Equal(t, 2, starts(), "a stopped agent is not restarted")

	code, _, errOut = run(t, "start", "steady", "--server", url)
	require.Equal(t, 0, code, errOut)
	waitFor("the start", func() bool { return starts() == 3 })

	code, _, errOut = run(t, "stop", "steady", "--server", url)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "--reason is required")
	code, _, errOut = run(t, "stop", "nosuch", "--reason", "x", "--server", url)
	require.Equal(t, exitNotFound, code)
	require.Contains(t, errOut, `no agent "nosuch" is registered`)
	code, _, errOut = run(t, "restart", "nosuch", "--reason", "x", "--server", url)
	require.Equal(t, exitNotFound, code, errOut)
	code, _, errOut = run(t, "stop", "steady", "--reason", "x", "--ttl", "100000h", "--server", url)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "--ttl must be between 1s and 24h")
	code, _, errOut = run(t, "stop", "steady", "--reason", "again", "--server", url)
	require.Equal(t, 0, code, errOut)
	code, _, errOut = run(t, "restart", "steady", "--reason", "x", "--server", url)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "agent steady is stopped: use vigil start steady")
}

// An agent with startup_timeout that never registers an instance is
// killed and a startup_timeout event recorded.
func TestUpStartupTimeout(t *testing.T) {
	dir := t.TempDir()
	fleet := filepath.Join(dir, "fleet.yaml")
	require.NoError(t, os.WriteFile(fleet, []byte("agents:\n  - name: mute\n    command: [\"sleep\", \"1000\"]\n    startup_timeout: 200ms\n"), 0o644))
	stderr := runCommand(t, "up", "--fleet", fleet, "--db", filepath.Join(dir, "v.db"), "--addr", "127.0.0.1:0",
		"--backoff-min", "1h", "--backoff-max", "1h")
	ctx := context.Background()
	url := serverURL(t, stderr)
	c, err := vigilclient.New([]string{url})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		page, err := c.ListEvents(ctx, vigilclient.ListEventsParams{Agent: "mute"})
		require.NoError(t, err)
		return len(page.Events) == 1 && page.Events[0].Kind == vigiltype.EventStartupTimeout
	}, 15*time.Second, 20*time.Millisecond, "a startup_timeout event")
}

// runCommand runs the CLI with args in-process until the test ends (then it
// is cancelled and must return nil) and returns its stderr.
func runCommand(t *testing.T, args ...string) *lockedBuffer {
	t.Helper()
	var stdout, stderr lockedBuffer
	root := NewRoot(strings.NewReader(""), &stdout, &stderr)
	root.SetArgs(args)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return &stderr
}

// serverURL waits for the server's URL in a command's log.
func serverURL(t *testing.T, stderr *lockedBuffer) string {
	t.Helper()
	var url string
	re := regexp.MustCompile(`url=(https?://127\.0\.0\.1:\d+)`)
	require.Eventually(t, func() bool {
		m := re.FindStringSubmatch(stderr.String())
		if m != nil {
			url = m[1]
		}
		return m != nil
	}, 15*time.Second, 10*time.Millisecond, "the server's URL in the log")
	return url
}

// A second vigil up on the same SQLite database is refused, naming the
// first one's pid: both would run every agent.
func TestSecondUpOnOneDatabaseIsRefused(t *testing.T) {
	dir := t.TempDir()
	fleet := filepath.Join(dir, "fleet.yaml")
	require.NoError(t, os.WriteFile(fleet, []byte("agents:\n  - name: steady\n    command: [\"sleep\", \"1000\"]\n"), 0o644))
	db := filepath.Join(dir, "v.db")
	stderr := runCommand(t, "up", "--fleet", fleet, "--db", db, "--addr", "127.0.0.1:0")
	serverURL(t, stderr)
	started := func() int { return strings.Count(stderr.String(), `msg="agent started" agent=steady`) }
	require.Eventually(t, func() bool { return started() == 1 }, 15*time.Second, 10*time.Millisecond, "the first one's agent")

	code, _, errOut := run(t, "up", "--fleet", fleet, "--db", db, "--addr", "127.0.0.1:0")
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, fmt.Sprintf("another vigil up (pid %d) already supervises the fleet on %s", os.Getpid(), db))
	require.Equal(t, 1, started(), "the first one's agent runs once")
}
