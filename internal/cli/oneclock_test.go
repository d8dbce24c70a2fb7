package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/dashboard"
	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// The supervisor and the server each keep their own clock: these tests run
// the server on a clock an hour ahead of the host's, or an hour behind, and
// a real `vigil supervise` beside it (DESIGN L10).

// offsetClock is the host's clock moved by a settable offset: a server on
// another host whose clock is wrong.
type offsetClock struct{ offset atomic.Int64 }

func newOffsetClock(d time.Duration) *offsetClock {
	c := &offsetClock{}
	c.offset.Store(int64(d))
	return c
}

func (c *offsetClock) Now() time.Time {
	return time.Now().UTC().Add(time.Duration(c.offset.Load()))
}

func (c *offsetClock) Advance(d time.Duration) { c.offset.Add(int64(d)) }

// agentHelperEnv makes the test binary a supervised agent (see
// TestAgentHelperProcess).
const agentHelperEnv = "VIGIL_TEST_AGENT_HELPER"

// TestAgentHelperProcess is not a test of its own: run by a supervisor as
// an agent (the os/exec helper-process pattern), it registers an instance
// of $VIGIL_KIND with $VIGIL_URL under its own pid, as the SDK does, sends
// liveness heartbeats, and on SIGTERM marks the instance exited and exits 0.
func TestAgentHelperProcess(t *testing.T) {
	if os.Getenv(agentHelperEnv) == "" {
		t.Skip("an agent process of the supervise tests")
	}
	os.Exit(agentHelper())
}

func agentHelper() int {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	c, err := vigilclient.New([]string{os.Getenv("VIGIL_URL")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	host, _ := os.Hostname()
	ctx := context.Background()
	const every = 100 * time.Millisecond
	reg, err := c.RegisterProcess(ctx, vigilclient.RegisterParams{
		ProcessKind: os.Getenv("VIGIL_KIND"), Hostname: host, PID: os.Getpid(), LivenessInterval: every,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Fprintf(os.Stderr, "registered pid=%d\n", os.Getpid())
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-term:
			_, _ = c.ProcessExit(ctx, reg.Instance())
			return 0
		case <-tick.C:
			_, _ = c.ProcessHeartbeat(ctx, reg.Instance())
		}
	}
}

// helperFleet writes a fleet file with one agent, name, run by the helper
// process, plus extra fleet-file lines for it; it returns the file's path.
func helperFleet(t *testing.T, name, extra string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fleet.yaml")
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd, err := json.Marshal([]string{exe, "-test.run=^TestAgentHelperProcess$"})
	require.NoError(t, err)
	body := fmt.Sprintf("agents:\n  - name: %s\n    command: %s\n    env:\n      %s: \"1\"\n%s", name, cmd, agentHelperEnv, extra)
	require.NoError(t, os.WriteFile(path, []byte(body), 0o644))
	return path
}

// starts counts agent's launches in a supervisor's log.
func starts(stderr *lockedBuffer, agent string) int {
	return strings.Count(stderr.String(), `msg="agent started" agent=`+agent+" ")
}

// lastPID is the pid of agent's latest launch in a supervisor's log.
func lastPID(t *testing.T, stderr *lockedBuffer, agent string) int {
	t.Helper()
	m := regexp.MustCompile(`msg="agent started" agent=`+regexp.QuoteMeta(agent)+` pid=(\d+)`).FindAllStringSubmatch(stderr.String(), -1)
	require.NotEmpty(t, m)
	pid, err := strconv.Atoi(m[len(m)-1][1])
	require.NoError(t, err)
	return pid
}

// An agent that registers in time is left alone whatever the server's
// clock says: the startup check looks for an instance of the launched
// process registered since the launch, measured as a duration, and never
// compares the server's started_at with the supervisor's clock. (It once
// did: with the server an hour behind, every launch was killed as "did not
// register".)
func TestStartupCheckIgnoresTheServersClock(t *testing.T) {
	for _, offset := range []time.Duration{-time.Hour, time.Hour} {
		t.Run("server "+offset.String(), func(t *testing.T) {
			t.Parallel()
			srv := testserver.Start(t, testserver.WithClock(newOffsetClock(offset)))
			fleet := helperFleet(t, "booter", "    startup_timeout: 3s\n")
			stderr := runCommand(t, "supervise", "--server", srv.URL, "--fleet", fleet, "--log-dir", t.TempDir(),
				"--log-level", "debug", "--backoff-min", "1h", "--backoff-max", "1h")
			const registered, killed = "agent registered within its startup timeout", "did not register"
			require.Eventually(t, func() bool {
				out := stderr.String()
				return strings.Contains(out, registered) || strings.Contains(out, killed)
			}, testWait, 10*time.Millisecond, "the startup check")
			require.NotContains(t, stderr.String(), killed)
			require.Contains(t, stderr.String(), "[booter] registered pid=")
			require.Equal(t, 1, starts(stderr, "booter"))

			c, err := vigilclient.New([]string{srv.URL})
			require.NoError(t, err)
			page, err := c.ListEvents(context.Background(), vigilclient.ListEventsParams{Agent: "booter"})
			require.NoError(t, err)
			require.Empty(t, page.Events, "no startup_timeout event")
		})
	}
}

// testWait bounds every wait of these tests; reaching it is a failure.
const testWait = 30 * time.Second

// pollCounter is a proxy in front of a server that counts the supervisor's
// control polls (its reads of planned-stop markers).
type pollCounter struct {
	polls atomic.Int64
	url   string
}

func newPollCounter(t *testing.T, target string) *pollCounter {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(u)
	pc := &pollCounter{}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/planned-stop") {
			pc.polls.Add(1)
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	pc.url = ts.URL
	return pc
}

// waitPolls waits for n more control polls.
func (pc *pollCounter) waitPolls(t *testing.T, n int64) {
	t.Helper()
	target := pc.polls.Load() + n
	require.Eventually(t, func() bool { return pc.polls.Load() >= target }, testWait, 5*time.Millisecond, "control polls")
}

// One vigil restart restarts the agent once, whatever the server's clock
// says: the supervisor acts on the marker by its identity, once, and places
// it on its own clock by its age. (It once compared the marker's
// created_at with its own clock: with the server an hour ahead, it
// restarted the agent every two polls until the TTL ended; an hour behind,
// never.)
func TestRestartActsOnceWhateverTheServersClock(t *testing.T) {
	for _, offset := range []time.Duration{-time.Hour, time.Hour} {
		t.Run("server "+offset.String(), func(t *testing.T) {
			t.Parallel()
			srv := testserver.Start(t, testserver.WithClock(newOffsetClock(offset)))
			pc := newPollCounter(t, srv.URL)
			fleet := filepath.Join(t.TempDir(), "fleet.yaml")
			require.NoError(t, os.WriteFile(fleet, []byte("agents:\n  - name: steady\n    command: [\"sleep\", \"1000\"]\n"), 0o644))
			stderr := runCommand(t, "supervise", "--server", pc.url, "--fleet", fleet, "--log-dir", t.TempDir(),
				"--control-poll", "20ms", "--backoff-min", "1h", "--backoff-max", "1h")
			require.Eventually(t, func() bool { return starts(stderr, "steady") == 1 }, testWait, 10*time.Millisecond, "the first start")
			pc.waitPolls(t, 3) // the supervisor has seen the agent without a marker

			code, _, errOut := run(t, "restart", "steady", "--reason", "config change", "--ttl", "20s", "--server", srv.URL)
			require.Equal(t, 0, code, errOut)
			require.Eventually(t, func() bool { return starts(stderr, "steady") == 2 }, testWait, 10*time.Millisecond, "the restart")
			pc.waitPolls(t, 20)
			require.Equal(t, 2, starts(stderr, "steady"), "one restart per vigil restart")
		})
	}
}

// A planned restart covers the process it was aimed at, not the one it
// started (DESIGN E2): a crash of the new process right after the restart
// is an ordinary, undelivered exit, drawn as a crash on the timeline, while
// the restart's own exit stays suppressed. (The marker once covered every
// exit until its TTL passed.) The server's clock runs an hour ahead.
func TestCrashAfterRestartIsNotSuppressed(t *testing.T) {
	t.Parallel()
	clk := newOffsetClock(time.Hour)
	srv := testserver.Start(t, testserver.WithClock(clk))
	fleet := helperFleet(t, "fragile", "")
	stderr := runCommand(t, "supervise", "--server", srv.URL, "--fleet", fleet, "--log-dir", t.TempDir(),
		"--control-poll", "20ms", "--backoff-min", "1h", "--backoff-max", "1h")
	registrations := func() int { return strings.Count(stderr.String(), "[fragile] registered pid=") }
	require.Eventually(t, func() bool { return registrations() == 1 }, testWait, 10*time.Millisecond, "the first instance")

	code, _, errOut := run(t, "restart", "fragile", "--reason", "deploy", "--server", srv.URL)
	require.Equal(t, 0, code, errOut)
	require.Eventually(t, func() bool { return registrations() == 2 }, testWait, 10*time.Millisecond, "the restarted instance")
	require.Equal(t, 2, starts(stderr, "fragile"))

	// The new process crashes well within the marker's TTL (120s).
	require.NoError(t, syscall.Kill(lastPID(t, stderr, "fragile"), syscall.SIGKILL))

	ctx := context.Background()
	c, err := vigilclient.New([]string{srv.URL})
	require.NoError(t, err)
	var evs []vigiltype.ProcessEvent
	require.Eventually(t, func() bool {
		page, err := c.ListEvents(ctx, vigilclient.ListEventsParams{Agent: "fragile"})
		require.NoError(t, err)
		evs = page.Events
		return len(evs) == 2
	}, testWait, 10*time.Millisecond, "the restart's exit and the crash")
	restart, crash := evs[1], evs[0]
	require.NotNil(t, restart.DeliveryKind)
	require.Equal(t, vigiltype.DeliverySuppressed, *restart.DeliveryKind, "the restart's own exit is suppressed")
	require.Equal(t, "killed", crash.Signal)
	require.Nil(t, crash.DeliveredAt, "the crash after the restart is an ordinary exit")
	require.Nil(t, crash.DeliveryKind)

	code, out, errOut := run(t, "events", "--undelivered", "--json", "--server", srv.URL)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, fmt.Sprintf(`"event_id": %d`, crash.EventID), "the crash waits for a consumer")

	// Later, once the crashed instance has gone silent, the timeline draws
	// the outage after the crash as down time, not as stopped on purpose.
	clk.Advance(10 * time.Minute)
	resp, err := http.Get(srv.URL + "/v1/timeline")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var tl dashboard.Timeline
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&tl))
	require.Len(t, tl.Agents, 1)
	strip := tl.Agents[0]
	require.Len(t, strip.Up, 2, "two instances, two up spans")
	for _, s := range strip.StoppedOnPurpose {
		require.False(t, s.To.After(crash.At), "a stopped-on-purpose span %v–%v covers the crash at %v", s.From, s.To, crash.At)
	}
	var crashMarked bool
	for _, m := range strip.Marks {
		if m.At.Equal(crash.At) {
			crashMarked = !m.Suppressed
		}
	}
	require.True(t, crashMarked, "the crash is drawn as an unsuppressed exit")
}
