//go:build linux

package supervisor

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// testTimeout guards every wait; reaching it is a failure, never a way to let
// time pass.
const testTimeout = 15 * time.Second

func TestMain(m *testing.M) {
	// Make this test process the subreaper of its descendants: grandchildren
	// orphaned by an agent's exit are reparented here instead of to PID 1,
	// which in some containers never reaps them. The tests can then reap
	// them and check that they are gone with kill(pid, 0) == ESRCH, and with
	// which signal they died.
	// Run does this too; the tests need it before any Run.
	if err := becomeSubreaper(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func TestSupervisorRestartsAfterCleanExit(t *testing.T) {
	starts := filepath.Join(t.TempDir(), "starts")
	b := setup(t, Config{
		Agents: []Agent{{
			Name:    "worker-1",
			Command: []string{"sh", "-c", `echo "$VIGIL_KIND $EXTRA $OWN" >> "$STARTS"; echo out; echo err >&2`},
			Env:     map[string]string{"STARTS": starts, "OWN": "own"},
		}},
		ExtraEnv: map[string]string{"EXTRA": "extra", "OWN": "overridden by the agent's env"},
	})
	b.run(t)

	for range 3 {
		recv(t, b.sup.testSignals.started.ch, "start")
		require.Contains(t, recv(t, b.sup.testSignals.exited.ch, "exit"), "exit status 0 after ")
	}
	var delays []time.Duration
	for range 3 {
		delays = append(delays, recv(t, b.sup.testSignals.restartScheduled.ch, "restart"))
	}
	require.Equal(t, []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond}, delays,
		"each clean exit after a short run is a fast failure (DESIGN S2)")
	b.stop(t)

	data, err := os.ReadFile(starts)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	require.GreaterOrEqual(t, len(lines), 3)
	for _, line := range lines {
		require.Equal(t, "worker-1 extra own", line, "VIGIL_KIND, ExtraEnv and the agent's env reach the child")
	}
	require.Contains(t, b.stdout.all(), "[worker-1] out\n")
	require.Contains(t, b.stderr.all(), "[worker-1] err\n")
	require.NotContains(t, b.stdout.all(), "err")

	st := b.sup.Status()
	require.Len(t, st, 1)
	require.Equal(t, "worker-1", st[0].Name)
	require.False(t, st[0].Running)
	require.Positive(t, st[0].PID)
	require.GreaterOrEqual(t, st[0].Restarts, 2)
	require.NotEmpty(t, st[0].LastExit)

	require.GreaterOrEqual(t, b.logs.count(`msg="agent started" agent=worker-1 pid=`), 3)
	require.GreaterOrEqual(t, b.logs.count(`msg="agent exited" agent=worker-1 pid=`), 3)
	require.GreaterOrEqual(t, b.logs.count(" code=0 run_time="), 3)
	require.GreaterOrEqual(t, b.logs.count(`msg="agent restart scheduled" agent=worker-1 delay=10ms`), 1)
}

func TestSupervisorStopKillsWholeProcessGroup(t *testing.T) {
	b := setup(t, Config{
		Agents: []Agent{{
			Name: "tree",
			// The leader ends up as sleep, which never reaps, so the dead
			// grandchild is reparented to this process and its status
			// reaches requireGone.
			Command: []string{"sh", "-c", `sleep 1000 & echo "grandchild $!"; echo "leader $$"; exec sleep 1000`},
		}},
		StopGrace: 5 * time.Second,
	})
	b.run(t)

	pid := recv(t, b.sup.testSignals.started.ch, "start")
	leader := b.stdout.waitPID(t, "[tree] leader ")
	grandchild := b.stdout.waitPID(t, "[tree] grandchild ")
	require.Equal(t, pid, leader)
	requireRunning(t, leader)
	requireRunning(t, grandchild)
	st := b.sup.Status()[0]
	require.True(t, st.Running)
	require.Equal(t, pid, st.PID)

	elapsed := b.stop(t)
	require.Less(t, elapsed, 5*time.Second, "SIGTERM to the group was enough; no wait for the grace period")

	requireGone(t, leader)
	ws := b.requireGone(t, grandchild)
	require.True(t, ws.Signaled())
	require.Equal(t, syscall.SIGTERM, ws.Signal(), "the grandchild got the group's SIGTERM")

	st = b.sup.Status()[0]
	require.False(t, st.Running)
	require.Zero(t, st.Restarts)
	require.Contains(t, st.LastExit, "signal: terminated after ")
	require.Equal(t, 1, b.logs.count(`msg="agent stopped" agent=tree pid=`+strconv.Itoa(pid)+" signal=terminated run_time="))
	require.Zero(t, b.logs.count("SIGKILL"))
	require.Zero(t, b.logs.count("agent restart scheduled"))
}

func TestSupervisorKillsGroupAfterStopGrace(t *testing.T) {
	const grace = 200 * time.Millisecond
	b := setup(t, Config{
		Agents: []Agent{{
			Name:    "stubborn",
			Command: []string{"sh", "-c", `trap "" TERM; sleep 1000 & echo "grandchild $!"; echo ready; exec sleep 1000`},
		}},
		StopGrace: grace,
	})
	b.run(t)

	pid := recv(t, b.sup.testSignals.started.ch, "start")
	grandchild := b.stdout.waitPID(t, "[stubborn] grandchild ")
	b.stdout.waitLine(t, "[stubborn] ready") // TERM is ignored from here on

	elapsed := b.stop(t)
	require.GreaterOrEqual(t, elapsed, grace, "SIGKILL only after the grace period")
	require.Contains(t, recv(t, b.sup.testSignals.exited.ch, "exit"), "signal: killed after ")

	requireGone(t, pid)
	ws := b.requireGone(t, grandchild)
	require.True(t, ws.Signaled())
	require.Equal(t, syscall.SIGKILL, ws.Signal(), "the grandchild, ignoring TERM too, got the group's SIGKILL")

	require.Equal(t, 1, b.logs.count(`msg="agent did not stop within grace; sending SIGKILL" agent=stubborn pgid=`+strconv.Itoa(pid)+" grace=200ms"))
	require.Equal(t, 1, b.logs.count(`msg="agent stopped" agent=stubborn`))
	require.Equal(t, 1, b.logs.count("signal=killed"))
}

func TestSupervisorLaunchFailureBacksOff(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-agent")
	b := setup(t, Config{Agents: []Agent{{Name: "ghost", Command: []string{missing, "--flag"}}}})
	b.run(t)

	for range 2 {
		err := recv(t, b.sup.testSignals.launchFailed.ch, "launch failure")
		require.ErrorIs(t, err, os.ErrNotExist)
	}
	first := recv(t, b.sup.testSignals.restartScheduled.ch, "restart")
	second := recv(t, b.sup.testSignals.restartScheduled.ch, "restart")
	require.Equal(t, []time.Duration{10 * time.Millisecond, 20 * time.Millisecond}, []time.Duration{first, second},
		"a launch failure backs off like a fast failure")
	b.stop(t)

	st := b.sup.Status()[0]
	require.False(t, st.Running)
	require.Zero(t, st.PID)
	require.GreaterOrEqual(t, st.Restarts, 1)
	require.True(t, strings.HasPrefix(st.LastExit, "launch failed: "), st.LastExit)
	require.Contains(t, st.LastExit, missing)
	require.GreaterOrEqual(t, b.logs.count(`level=ERROR msg="agent launch failed" agent=ghost`), 2)
	require.Zero(t, b.logs.count("agent started"))
	require.Empty(t, b.sup.testSignals.started.ch)
}

func TestSupervisorStopsLeftoversWhenLeaderExits(t *testing.T) {
	b := setup(t, Config{
		Agents: []Agent{{
			Name:    "leaky",
			Command: []string{"sh", "-c", `sleep 1000 & echo "grandchild $!"; exit 3`},
		}},
		// One start only: the restart delay outlasts the test, so stopping
		// also shows that the delay wait honours cancellation.
		Backoff:   BackoffPolicy{Min: time.Hour, Max: time.Hour},
		StopGrace: 5 * time.Second,
	})
	b.run(t)

	require.Contains(t, recv(t, b.sup.testSignals.exited.ch, "exit"), "exit status 3 after ")
	grandchild := b.stdout.waitPID(t, "[leaky] grandchild ")
	ws := b.requireGone(t, grandchild) // before any stop: the exit itself cleared the group
	require.Equal(t, syscall.SIGTERM, ws.Signal())
	require.Equal(t, time.Hour, recv(t, b.sup.testSignals.restartScheduled.ch, "restart"))

	require.Less(t, b.stop(t), testTimeout)
	require.Equal(t, 1, b.logs.count(`msg="agent left processes in its group; stopping them" agent=leaky`))
	require.Equal(t, 1, b.logs.count(`msg="agent exited" agent=leaky pid=`))
	require.Equal(t, 1, b.logs.count(" code=3 run_time="))
	require.Equal(t, 1, b.logs.count(`msg="agent restart scheduled" agent=leaky delay=1h0m0s`))
	require.Zero(t, b.sup.Status()[0].Restarts)
}

func TestSupervisorRunsEveryAgent(t *testing.T) {
	b := setup(t, Config{
		Agents: []Agent{
			{Name: "a", Command: []string{"sh", "-c", `echo "hello from $VIGIL_KIND in $PWD"; exec sleep 1000`}, Dir: "/"},
			// A last line without newline is completed when the pipe closes.
			{Name: "b", Command: []string{"sh", "-c", `printf 'no newline from %s' "$VIGIL_KIND"`}},
		},
		Backoff: BackoffPolicy{Min: time.Hour, Max: time.Hour},
	})
	b.run(t)

	require.Contains(t, recv(t, b.sup.testSignals.exited.ch, "exit of b"), "exit status 0")
	require.Equal(t, "[a] hello from a in /", b.stdout.waitLine(t, "[a] "))
	require.Contains(t, b.stdout.all(), "[b] no newline from b\n")
	st := b.sup.Status()
	require.True(t, st[0].Running)
	require.False(t, st[1].Running)
	b.stop(t)

	st = b.sup.Status()
	require.False(t, st[0].Running)
	require.Contains(t, st[0].LastExit, "signal: terminated")
	require.Contains(t, st[1].LastExit, "exit status 0")
}

func TestSupervisorRunWithCancelledContext(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	sup, err := New(Config{Agents: []Agent{{Name: "a", Command: []string{"true"}}}, Logger: discardLogger()})
	require.NoError(t, err)
	sup.testSignals.init()

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.NoError(t, sup.Run(ctx))
	require.Empty(t, sup.testSignals.started.ch)
	require.Equal(t, []AgentStatus{{Name: "a"}}, sup.Status())

	require.ErrorContains(t, sup.Run(t.Context()), "Run called more than once")
}

func TestNew(t *testing.T) {
	t.Parallel()

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		sup, err := New(Config{Agents: []Agent{{Name: "a", Command: []string{"true"}}}})
		require.NoError(t, err)
		require.Equal(t, StopGraceDefault, sup.stopGrace)
		require.Equal(t, 30*time.Second, StopGraceDefault)
		require.Equal(t, BackoffPolicy{Min: BackoffMinDefault, FastFailure: FastFailureDefault, Reset: BackoffResetDefault, Max: BackoffMaxDefault, Jitter: JitterDefault}, sup.backoff)
		require.Equal(t, slog.Default(), sup.logger)
		require.Equal(t, os.Stdout, sup.stdout.(syncWriter).w)
		require.Equal(t, os.Stderr, sup.stderr.(syncWriter).w)
		require.Equal(t, []AgentStatus{{Name: "a"}}, sup.Status())
	})

	t.Run("CopiesConfig", func(t *testing.T) {
		t.Parallel()
		cfg := Config{
			Agents:   []Agent{{Name: "a", Command: []string{"true"}, Env: map[string]string{"K": "v"}}},
			ExtraEnv: map[string]string{"E": "v"},
		}
		sup, err := New(cfg)
		require.NoError(t, err)
		cfg.Agents[0].Command[0] = "false"
		cfg.Agents[0].Env["K"] = "changed"
		cfg.ExtraEnv["E"] = "changed"
		require.Equal(t, []string{"true"}, sup.agents[0].Command)
		require.Equal(t, "v", sup.agents[0].Env["K"])
		require.Equal(t, "v", sup.extraEnv["E"])
	})

	t.Run("ChildEnvOrder", func(t *testing.T) {
		t.Parallel()
		sup, err := New(Config{
			Agents:   []Agent{{Name: "a", Command: []string{"true"}, Env: map[string]string{"B": "agent"}}},
			ExtraEnv: map[string]string{"B": "extra", "A": "extra"},
		})
		require.NoError(t, err)
		env := sup.childEnv(sup.agents[0])
		require.Equal(t, []string{"A=extra", "B=extra", "VIGIL_KIND=a", "B=agent"}, env[len(env)-4:])
	})

	ok := []Agent{{Name: "a", Command: []string{"true"}}}
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"NoAgents", Config{}, []string{"supervisor config: agents: must list at least one agent"}},
		{"BadAgents", Config{Agents: []Agent{{Name: "a"}, {Name: "a", Command: []string{"x"}}}}, []string{
			`agents[0].command: must not be empty (agent "a")`,
			`agents[1].name: "a" is already used by agents[0]`,
		}},
		{"ExtraEnvSetsKind", Config{Agents: ok, ExtraEnv: map[string]string{"VIGIL_KIND": "x"}}, []string{
			"ExtraEnv: VIGIL_KIND is set by the supervisor",
		}},
		{"ExtraEnvBadName", Config{Agents: ok, ExtraEnv: map[string]string{"A=B": "x"}}, []string{
			`ExtraEnv: variable name "A=B" must not contain '=' or NUL`,
		}},
		{"NegativeBackoff", Config{Agents: ok, Backoff: BackoffPolicy{Min: -time.Second}}, []string{
			"Backoff.Min: must not be negative, got -1s",
		}},
		{"MinAboveMax", Config{Agents: ok, Backoff: BackoffPolicy{Min: time.Hour}}, []string{
			"Backoff.Min: 1h0m0s must not exceed Backoff.Max (5m0s)",
		}},
		{"JitterOutOfRange", Config{Agents: ok, Backoff: BackoffPolicy{Jitter: 1.5}}, []string{
			"Backoff.Jitter: must be between 0 and 1 (or JitterOff), got 1.5",
		}},
		{"BadFlapping", Config{Agents: ok, Flapping: FlapPolicy{Exits: 1}}, []string{
			"Flapping.Exits: must be at least 2, got 1",
		}},
		{"NegativeLogLimits", Config{Agents: ok, LogMaxBytes: -1, LogKeep: -1}, []string{
			"LogMaxBytes: must not be negative, got -1", "LogKeep: must not be negative, got -1",
		}},
		{"NegativeStopGrace", Config{Agents: ok, StopGrace: -time.Second}, []string{
			"StopGrace: must not be negative, got -1s",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sup, err := New(tt.cfg)
			require.Nil(t, sup)
			for _, want := range tt.want {
				require.ErrorContains(t, err, want)
			}
		})
	}
}

// testBundle is a supervisor under test with everything it writes captured.
type testBundle struct {
	reaped map[int]syscall.WaitStatus // orphans the supervisor reaped, from orphanReaped
	sup    *Supervisor
	stdout *lineSink
	stderr *lineSink
	logs   *logSink
	stop   func(t *testing.T) time.Duration // cancels Run, waits for it; returns how long stopping took
}

// setup builds a supervisor from cfg with test defaults: tiny backoff (10ms
// doubling to 40ms, every run a fast failure), captured output and logs, and
// test signals. It registers a goroutine-leak check that runs after the
// supervisor has been stopped.
func setup(t *testing.T, cfg Config) *testBundle {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) }) // registered first, so it runs last

	b := &testBundle{stdout: newLineSink(), stderr: newLineSink(), logs: &logSink{t: t}, reaped: map[int]syscall.WaitStatus{}}
	if cfg.Backoff == (BackoffPolicy{}) {
		cfg.Backoff = BackoffPolicy{Min: 10 * time.Millisecond, FastFailure: time.Hour, Max: 40 * time.Millisecond}
	}
	if cfg.Backoff.Jitter == 0 {
		cfg.Backoff.Jitter = JitterOff // exact delays, unless the test asks for jitter
	}
	cfg.Logger = slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	cfg.Stdout, cfg.Stderr = b.stdout, b.stderr
	sup, err := New(cfg)
	require.NoError(t, err)
	sup.testSignals.init()
	b.sup = sup
	return b
}

// run starts Run in a goroutine and sets b.stop; stopping also happens at
// cleanup if the test did not do it.
func (b *testBundle) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.sup.Run(ctx) }()

	var once sync.Once
	var elapsed time.Duration
	b.stop = func(t *testing.T) time.Duration {
		t.Helper()
		once.Do(func() {
			begin := time.Now()
			cancel()
			select {
			case err := <-done:
				elapsed = time.Since(begin)
				require.NoError(t, err)
			case <-time.After(testTimeout):
				t.Fatalf("Run did not return within %s of cancellation", testTimeout)
			}
		})
		return elapsed
	}
	t.Cleanup(func() { b.stop(t) })
}

// recv waits for a value on ch.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(testTimeout):
		t.Fatalf("timed out after %s waiting for %s", testTimeout, what)
		panic("unreachable")
	}
}

// requireRunning checks that pid is a live (not zombie) process.
func requireRunning(t *testing.T, pid int) {
	t.Helper()
	require.NoError(t, syscall.Kill(pid, 0), "process %d", pid)
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	state, _, ok := parseProcStat(stat)
	require.True(t, ok)
	require.NotEqual(t, byte('Z'), state, "process %d is a zombie", pid)
}

// requireGone checks that pid has exited, reaping it if it is an orphan
// reparented to this (subreaper) process, and then that kill(pid, 0) fails
// with ESRCH. It returns the wait status when it reaped the process.
func requireGone(t *testing.T, pid int) syscall.WaitStatus {
	t.Helper()
	var ws syscall.WaitStatus
	wpid, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
	if err != nil {
		require.ErrorIs(t, err, syscall.ECHILD, "wait4(%d)", pid) // reaped already (by its parent or the supervisor)
	} else {
		require.Equal(t, pid, wpid, "process %d is still running", pid)
	}
	require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "process %d still exists", pid)
	return ws
}

// requireGone is requireGone for a descendant that the supervisor's reaper
// may have reaped first: it then returns the status the reaper saw. It holds
// off the reaper meanwhile, so that a reap and its record are never seen
// half done.
func (b *testBundle) requireGone(t *testing.T, pid int) syscall.WaitStatus {
	t.Helper()
	b.sup.reaper.mu.Lock()
	var ws syscall.WaitStatus
	wpid, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
	if err == nil {
		require.Equal(t, pid, wpid, "process %d is still running", pid)
	} else {
		require.ErrorIs(t, err, syscall.ECHILD, "wait4(%d)", pid)
		ws = b.reapedBySupervisor(t, pid)
	}
	b.sup.reaper.mu.Unlock()
	require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "process %d still exists", pid)
	return ws
}

// reapedBySupervisor returns the status with which the supervisor reaped
// pid, which it must have done already.
func (b *testBundle) reapedBySupervisor(t *testing.T, pid int) syscall.WaitStatus {
	t.Helper()
	for {
		select {
		case r := <-b.sup.testSignals.orphanReaped.ch:
			b.reaped[r.pid] = r.ws
			continue
		default:
		}
		break
	}
	ws, ok := b.reaped[pid]
	require.True(t, ok, "process %d was reaped, but not by the supervisor", pid)
	return ws
}

// lineSink is an io.Writer that keeps every write (the supervisor writes one
// prefixed line per call) and lets a test wait for a given line.
type lineSink struct {
	mu    sync.Mutex
	lines []string
	added chan struct{} // closed and replaced on every write
}

func newLineSink() *lineSink { return &lineSink{added: make(chan struct{})} }

func (s *lineSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lines = append(s.lines, string(p))
	close(s.added)
	s.added = make(chan struct{})
	return len(p), nil
}

func (s *lineSink) all() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.lines, "")
}

// waitLine waits for a line starting with prefix and returns it without the
// trailing newline.
func (s *lineSink) waitLine(t *testing.T, prefix string) string {
	t.Helper()
	deadline := time.After(testTimeout)
	for {
		s.mu.Lock()
		added := s.added
		for _, l := range s.lines {
			if strings.HasPrefix(l, prefix) {
				s.mu.Unlock()
				return strings.TrimSuffix(l, "\n")
			}
		}
		s.mu.Unlock()
		select {
		case <-added:
		case <-deadline:
			t.Fatalf("timed out after %s waiting for output line %q; got %q", testTimeout, prefix, s.all())
		}
	}
}

// waitPID waits for a line "<prefix><pid>" and returns the pid.
func (s *lineSink) waitPID(t *testing.T, prefix string) int {
	t.Helper()
	pid, err := strconv.Atoi(strings.TrimPrefix(s.waitLine(t, prefix), prefix))
	require.NoError(t, err)
	require.Greater(t, pid, 1)
	return pid
}

// logSink collects the supervisor's log lines and echoes them to the test log.
type logSink struct {
	t     *testing.T
	mu    sync.Mutex
	lines []string
}

func (s *logSink) Write(p []byte) (int, error) {
	line := strings.TrimSuffix(string(p), "\n")
	s.mu.Lock()
	s.lines = append(s.lines, line)
	s.mu.Unlock()
	s.t.Log(line)
	return len(p), nil
}

// count returns how many log lines contain sub.
func (s *logSink) count(sub string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, l := range s.lines {
		if strings.Contains(l, sub) {
			n++
		}
	}
	return n
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestSupervisorJittersRestartDelays(t *testing.T) {
	policy := BackoffPolicy{Min: 10 * time.Millisecond, FastFailure: time.Hour, Max: 40 * time.Millisecond, Jitter: 0.5}
	b := setup(t, Config{Agents: []Agent{{Name: "a", Command: []string{"true"}}}, Backoff: policy})
	b.run(t)
	for _, want := range []time.Duration{10, 20, 40, 40} {
		lo, hi := policy.withDefaults().JitterBand(want * time.Millisecond)
		d := recv(t, b.sup.testSignals.restartScheduled.ch, "restart")
		require.GreaterOrEqual(t, d, lo)
		require.LessOrEqual(t, d, hi)
	}
	b.stop(t)
}

func TestSupervisorWritesLogFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "logs")
	b := setup(t, Config{
		Agents:  []Agent{{Name: "talker", Command: []string{"sh", "-c", `echo "to out"; echo "to err" >&2; exec sleep 1000`}}},
		LogDir:  dir,
		LogKeep: 1, LogMaxBytes: 1 << 20,
	})
	b.run(t)
	b.stdout.waitLine(t, "[talker] to out")
	b.stderr.waitLine(t, "[talker] to err")
	b.stop(t) // the output is drained and the file closed by then

	data, err := os.ReadFile(filepath.Join(dir, "talker.log"))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	require.Len(t, lines, 2, string(data))
	var streams []string
	for _, l := range lines {
		ts, rest, ok := strings.Cut(l, " ")
		require.True(t, ok)
		_, err := time.Parse(time.RFC3339Nano, ts)
		require.NoError(t, err, l)
		streams = append(streams, rest)
	}
	require.ElementsMatch(t, []string{"stdout to out", "stderr to err"}, streams)
}

func TestSupervisorLogDirUnusable(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	sup, err := New(Config{Agents: []Agent{{Name: "a", Command: []string{"true"}}}, LogDir: file, Logger: discardLogger()})
	require.NoError(t, err)
	require.ErrorContains(t, sup.Run(t.Context()), "supervisor: agent a: log dir: ")
}
