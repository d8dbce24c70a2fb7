package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/heartbeat"
	"github.com/vigil-fleet/vigil/internal/lease"
	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// hbCounter counts the heartbeat POSTs that pass through a proxy in front
// of the real server: what the server receives, tick by tick.
type hbCounter struct {
	mu       sync.Mutex
	lease    int // POST /v1/tasks/{id}/heartbeat
	liveness int // POST /v1/processes/{id}/heartbeat
	lastBody map[string]any
}

func (c *hbCounter) counts() (lease, liveness int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lease, c.liveness
}

func (c *hbCounter) last() map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastBody
}

var (
	leaseHBPath    = regexp.MustCompile(`^/v1/tasks/\d+/heartbeat$`)
	livenessHBPath = regexp.MustCompile(`^/v1/processes/[^/]+/heartbeat$`)
)

// countingServer starts a real in-process server behind a counting proxy
// and returns the proxy's URL.
func countingServer(t *testing.T) (string, *hbCounter) {
	t.Helper()
	srv := testserver.Start(t)
	target, err := url.Parse(srv.URL)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	c := &hbCounter{}
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			switch {
			case leaseHBPath.MatchString(r.URL.Path):
				body, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(bytes.NewReader(body))
				var m map[string]any
				_ = json.Unmarshal(body, &m)
				c.mu.Lock()
				c.lease++
				c.lastBody = m
				c.mu.Unlock()
			case livenessHBPath.MatchString(r.URL.Path):
				c.mu.Lock()
				c.liveness++
				c.mu.Unlock()
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	return front.URL, c
}

// runVigil runs the vigil binary to completion and returns its exit code
// and output.
func runVigil(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(bins.vigil, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), stdout.String(), stderr.String()
	}
	require.NoError(t, err)
	return 0, stdout.String(), stderr.String()
}

// loopOf returns the heartbeat loop recorded in dir and makes sure it is
// killed when the test ends.
func loopOf(t *testing.T, dir string) heartbeat.ProcRef {
	t.Helper()
	st, err := heartbeat.Open(dir)
	require.NoError(t, err)
	ref, err := st.ReadProcRef(heartbeat.PIDFile)
	require.NoError(t, err)
	t.Cleanup(func() {
		if heartbeat.Alive(ref) {
			_ = syscall.Kill(ref.PID, syscall.SIGKILL)
		}
	})
	return ref
}

// loopsIn lists the live heartbeat loop processes whose workdir is dir.
func loopsIn(t *testing.T, dir string) []heartbeat.LoopProcess {
	t.Helper()
	all, err := heartbeat.Scan()
	require.NoError(t, err)
	var out []heartbeat.LoopProcess
	for _, lp := range all {
		if lp.Workdir == dir {
			out = append(out, lp)
		}
	}
	return out
}

func requireNoPIDFile(t *testing.T, dir string) {
	t.Helper()
	_, err := os.Stat(filepath.Join(dir, heartbeat.StateDirName, heartbeat.PIDFile))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func claimSession(t *testing.T, url, dir string, parentPID int, extra ...string) {
	t.Helper()
	code, _, errOut := runVigil(t, "tasks", "add", "review", "--server", url)
	require.Equal(t, 0, code, errOut)
	args := append([]string{"tasks", "claim", "review", "--workdir", dir, "--parent-pid", strconv.Itoa(parentPID), "--server", url, "--json"}, extra...)
	code, out, errOut := runVigil(t, args...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `"heartbeat_pid"`)
}

// The parent shell is killed: the loop exits within one tick, removes its
// pid file, and the server sees no further heartbeat of any kind.
func TestHeartbeatLoopEndsWithItsParent(t *testing.T) {
	t.Parallel()
	url, cnt := countingServer(t)
	dir := t.TempDir()
	shell := start(t, nil, "sleep", "1000")
	claimSession(t, url, dir, shell.cmd.Process.Pid, "--interval", "200ms")
	ref := loopOf(t, dir)
	eventually(t, 30*time.Second, "two lease heartbeats", func() bool { l, _ := cnt.counts(); return l >= 2 })

	require.NoError(t, syscall.Kill(-shell.cmd.Process.Pid, syscall.SIGKILL))
	<-shell.done // reaped: its pid is free
	lease0, live0 := cnt.counts()

	eventually(t, 30*time.Second, "the loop to exit", func() bool { return !heartbeat.Alive(ref) })
	requireNoPIDFile(t, dir)
	lease1, live1 := cnt.counts()
	// A tick that had checked the parent just before the kill may still
	// land; nothing after it.
	require.LessOrEqual(t, lease1-lease0, 1, "lease heartbeats after the parent died")
	require.LessOrEqual(t, live1-live0, 1, "liveness heartbeats after the parent died")
	log, err := os.ReadFile(filepath.Join(dir, heartbeat.StateDirName, heartbeat.LogFile))
	require.NoError(t, err)
	require.Contains(t, string(log), "parent is gone")

	code, _, _ := runVigil(t, "heartbeat", "status", "--workdir", dir)
	require.Equal(t, 3, code, "status exits 3 when no loop runs")
}

// Stale activity: ticks go on (liveness) but send no lease heartbeat;
// touch-activity resumes them with the new activity_at.
func TestHeartbeatLoopIsActivityGated(t *testing.T) {
	t.Parallel()
	url, cnt := countingServer(t)
	dir := t.TempDir()
	shell := start(t, nil, "sleep", "1000")
	claimSession(t, url, dir, shell.cmd.Process.Pid, "--interval", "100ms", "--staleness", "5s")
	loopOf(t, dir)
	eventually(t, 30*time.Second, "a lease heartbeat", func() bool { l, _ := cnt.counts(); return l >= 1 })

	activity := filepath.Join(dir, heartbeat.StateDirName, heartbeat.ActivityFile)
	old := time.Now().Add(-time.Hour)
	require.NoError(t, os.Chtimes(activity, old, old))
	lease0, live0 := cnt.counts()
	eventually(t, 30*time.Second, "five more ticks", func() bool { _, lv := cnt.counts(); return lv >= live0+5 })
	lease1, _ := cnt.counts()
	require.LessOrEqual(t, lease1-lease0, 1, "lease heartbeats while activity is stale")

	code, _, errOut := runVigil(t, "touch-activity", "--workdir", dir)
	require.Equal(t, 0, code, errOut)
	fi, err := os.Stat(activity)
	require.NoError(t, err)
	touched := fi.ModTime().UTC().Truncate(time.Millisecond)
	eventually(t, 30*time.Second, "lease heartbeats to resume", func() bool { l, _ := cnt.counts(); return l > lease1 })

	// The activity goes as its age on this host's clock (DESIGN T7), and
	// the server places it on its own: here the same machine's clock, so
	// within a request's time of the touch.
	body := cnt.last()
	require.EqualValues(t, 2, body["schema_version"])
	require.Contains(t, body, "activity_age_ms")
	require.NotContains(t, body, "activity_at")

	var task vigiltype.Task
	vigil(t, url, &task, "tasks", "show", "1")
	require.NotNil(t, task.LastActivityAt)
	require.WithinDuration(t, touched, *task.LastActivityAt, time.Second, "last_activity_at %s, touched %s", task.LastActivityAt, touched)
	require.Equal(t, 2, task.HeartbeatSchemaVersion)

	code, out, errOut := runVigil(t, "tasks", "complete", "--workdir", dir, "--server", url)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "completed task 1")
	require.Empty(t, loopsIn(t, dir), "complete stops the loop")

	var versions struct {
		Hosts []struct {
			SchemaVersion int   `json:"schema_version"`
			Heartbeats    int64 `json:"heartbeats"`
		} `json:"hosts"`
	}
	vigil(t, url, &versions, "heartbeat", "versions")
	require.Len(t, versions.Hosts, 1)
	require.Equal(t, 2, versions.Hosts[0].SchemaVersion)
}

// A parent pid now held by an unrelated process (start time differs) is a
// dead parent: the loop exits at its first tick without a write.
func TestHeartbeatLoopPIDReuse(t *testing.T) {
	t.Parallel()
	url, cnt := countingServer(t)
	dir := t.TempDir()
	shell := start(t, nil, "sleep", "1000")
	claimSession(t, url, dir, shell.cmd.Process.Pid, "--no-heartbeat")
	unrelated := start(t, nil, "sleep", "1000")
	real, err := heartbeat.Capture(unrelated.cmd.Process.Pid)
	require.NoError(t, err)
	code, _, errOut := runVigil(t, "heartbeat", "loop", "--workdir", dir, "--task", "1", "--epoch", "1",
		"--parent-pid", strconv.Itoa(real.PID), "--parent-start", strconv.FormatUint(real.StartTime+1, 10),
		"--interval", "100ms", "--server", url)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "parent is gone")
	lease, live := cnt.counts()
	require.Zero(t, lease)
	require.Zero(t, live)
}

// vigil run: CMD exits 3, is SIGKILLed, or succeeds — no loop survives and
// the exit code passes through; a claimed task is failed or completed.
func TestRunReapsTheLoop(t *testing.T) {
	t.Parallel()
	url, _ := countingServer(t)
	for _, tc := range []struct {
		name   string
		script string
		code   int
		status vigiltype.TaskStatus
	}{
		{"exit 3", "exit 3", 3, vigiltype.TaskScheduled},
		{"SIGKILL", "kill -9 $$", 128 + 9, vigiltype.TaskScheduled},
		{"success", "vigil_touch=1; exit 0", 0, vigiltype.TaskCompleted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var added vigiltype.Task
			vigil(t, url, &added, "tasks", "add", "job-"+strings.ReplaceAll(tc.name, " ", ""))
			code, _, errOut := runVigil(t, "run", "--workdir", dir, "--claim", added.TaskType, "--interval", "100ms",
				"--server", url, "--", "sh", "-c", `test -n "$VIGIL_WORKDIR" && test -f "$VIGIL_WORKDIR/.vigil/heartbeat.pid" || exit 99; `+tc.script)
			require.Equal(t, tc.code, code, errOut)
			require.Empty(t, loopsIn(t, dir), "a loop survived")
			requireNoPIDFile(t, dir)
			got := task(t, url, added.TaskID)
			require.Equal(t, tc.status, got.Status)
			if tc.code != 0 {
				require.Equal(t, 1, got.Attempts)
				require.NotNil(t, got.LastError)
			}
		})
	}
}

// vigil run stopped by SIGTERM passes it on, reaps the loop and exits
// 128+15; vigil run killed by SIGKILL leaves the loop to notice within a
// tick that its parent is gone.
func TestRunSignals(t *testing.T) {
	t.Parallel()
	url, _ := countingServer(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			var added vigiltype.Task
			vigil(t, url, &added, "tasks", "add", "sig"+strconv.Itoa(int(sig)))
			childPID := filepath.Join(dir, "child.pid")
			p := start(t, nil, bins.vigil, "run", "--workdir", dir, "--claim", added.TaskType, "--interval", "100ms",
				"--server", url, "--", "sh", "-c", `echo $$ > "`+childPID+`"; exec sleep 1000`)
			eventually(t, 30*time.Second, "the loop and CMD to start", func() bool {
				_, err := os.Stat(childPID)
				return err == nil && len(loopsIn(t, dir)) == 1
			})
			ref := loopOf(t, dir)
			require.NoError(t, syscall.Kill(p.cmd.Process.Pid, sig))
			if sig == syscall.SIGTERM {
				<-p.done
				require.Equal(t, 128+15, p.cmd.ProcessState.ExitCode(), p.out.String())
				require.False(t, heartbeat.Alive(ref), "vigil run returned with its loop alive")
			} else {
				// CMD outlives a SIGKILLed vigil run (and holds its output
				// pipe): only the loop is vigil's to end.
				eventually(t, 30*time.Second, "the orphaned loop to exit", func() bool { return !heartbeat.Alive(ref) })
				b, err := os.ReadFile(childPID)
				require.NoError(t, err)
				pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
				require.NoError(t, err)
				_ = syscall.Kill(pid, syscall.SIGKILL)
				<-p.done
			}
			requireNoPIDFile(t, dir)
			require.Empty(t, loopsIn(t, dir))
		})
	}
}

// The watchdog terminates the loop whose workdir was deleted and leaves
// alone the one whose workdir exists and whose parent lives.
func TestWatchdog(t *testing.T) {
	t.Parallel()
	url, _ := countingServer(t)
	root := t.TempDir()
	keep, gone := filepath.Join(root, "keep"), filepath.Join(root, "gone")
	shell := start(t, nil, "sleep", "1000")
	var refs []heartbeat.ProcRef
	for _, d := range []string{keep, gone} {
		require.NoError(t, os.Mkdir(d, 0o755))
		claimSession(t, url, d, shell.cmd.Process.Pid, "--interval", "100ms")
		refs = append(refs, loopOf(t, d))
		// A loop started after its workdir is gone exits on its own; this
		// test wants one that was running when the workdir went.
		eventually(t, 30*time.Second, "the loop's first tick", func() bool {
			log, _ := os.ReadFile(filepath.Join(d, heartbeat.StateDirName, heartbeat.LogFile))
			return strings.Contains(string(log), "lease heartbeat sent")
		})
	}
	require.NoError(t, os.RemoveAll(gone))

	var report struct {
		Loops []struct {
			PID    int    `json:"pid"`
			Action string `json:"action"`
			Reason string `json:"reason"`
		} `json:"loops"`
	}
	cmd := exec.Command(bins.vigil, "watchdog", "--root", root, "--json")
	out, err := cmd.Output()
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(out, &report), string(out))
	actions := map[int]string{}
	for _, l := range report.Loops {
		actions[l.PID] = l.Action
	}
	require.Equal(t, map[int]string{refs[0].PID: heartbeat.SweepLeftAlone, refs[1].PID: heartbeat.SweepTerminated}, actions)
	eventually(t, 30*time.Second, "the deleted workdir's loop to exit", func() bool { return !heartbeat.Alive(refs[1]) })
	require.True(t, heartbeat.Alive(refs[0]))
}

// heartbeat spawn / status / kill on a session claimed without a loop.
func TestHeartbeatSpawnStatusKill(t *testing.T) {
	t.Parallel()
	url, cnt := countingServer(t)
	dir := t.TempDir()
	shell := start(t, nil, "sleep", "1000")
	claimSession(t, url, dir, shell.cmd.Process.Pid, "--no-heartbeat")
	pid := strconv.Itoa(shell.cmd.Process.Pid)

	code, out, errOut := runVigil(t, "heartbeat", "spawn", "--workdir", dir, "--parent-pid", pid, "--interval", "100ms", "--server", url)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "started for task 1 (epoch 1)")
	ref := loopOf(t, dir)
	eventually(t, 30*time.Second, "a lease heartbeat", func() bool { l, _ := cnt.counts(); return l >= 1 })

	code, _, errOut = runVigil(t, "heartbeat", "spawn", "--workdir", dir, "--parent-pid", pid, "--server", url)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "already runs")

	code, out, errOut = runVigil(t, "heartbeat", "status", "--workdir", dir, "--json")
	require.Equal(t, 0, code, errOut)
	var st struct {
		Running     bool   `json:"running"`
		PID         int    `json:"pid"`
		ParentPID   int    `json:"parent_pid"`
		ParentAlive bool   `json:"parent_alive"`
		TaskID      int64  `json:"task_id"`
		InstanceID  string `json:"instance_id"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.True(t, st.Running)
	require.Equal(t, ref.PID, st.PID)
	require.Equal(t, shell.cmd.Process.Pid, st.ParentPID)
	require.True(t, st.ParentAlive)
	require.Equal(t, int64(1), st.TaskID)

	code, out, errOut = runVigil(t, "heartbeat", "kill", "--workdir", dir)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "stopped")
	require.False(t, heartbeat.Alive(ref))
	requireNoPIDFile(t, dir)
}

// vigil run on the task a session claimed: the session's loop is replaced
// by one bound to vigil run, none survives it, and the task stays the
// session's to finish.
func TestRunOnASessionTask(t *testing.T) {
	t.Parallel()
	url, _ := countingServer(t)
	dir := t.TempDir()
	shell := start(t, nil, "sleep", "1000")
	claimSession(t, url, dir, shell.cmd.Process.Pid, "--interval", "100ms")
	sessionLoop := loopOf(t, dir)

	code, _, errOut := runVigil(t, "run", "--workdir", dir, "--interval", "100ms", "--server", url, "--",
		"sh", "-c", `test "$VIGIL_TASK_ID" = 1 || exit 99; test -f "$VIGIL_WORKDIR/.vigil/heartbeat.pid"`)
	require.Equal(t, 0, code, errOut)
	require.False(t, heartbeat.Alive(sessionLoop))
	require.Empty(t, loopsIn(t, dir))
	requireNoPIDFile(t, dir)
	require.Equal(t, vigiltype.TaskRunning, task(t, url, 1).Status)

	code, _, errOut = runVigil(t, "tasks", "complete", "--workdir", dir, "--server", url)
	require.Equal(t, 0, code, errOut)
}

// A command that cannot start costs its task no attempt: the task is
// released, and vigil run exits 127.
func TestRunCommandNotFoundReleasesTheTask(t *testing.T) {
	t.Parallel()
	url, _ := countingServer(t)
	dir := t.TempDir()
	var added vigiltype.Task
	vigil(t, url, &added, "tasks", "add", "typo")
	code, _, errOut := runVigil(t, "run", "--workdir", dir, "--claim", "typo", "--interval", "100ms",
		"--server", url, "--", "/nonexistent/cmd")
	require.Equal(t, 127, code, errOut)
	got := task(t, url, added.TaskID)
	require.Equal(t, vigiltype.TaskScheduled, got.Status)
	require.Zero(t, got.Attempts, "a typo is not a failed attempt")
	require.Empty(t, loopsIn(t, dir))
}

// When the task's lease is lost, vigil run stops CMD instead of letting it
// work on a task that is someone else's now.
func TestRunStopsTheCommandWhenTheLeaseIsLost(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t, testserver.WithLeaseExpiry(lease.ExpiryActivity), testserver.WithSweepInterval(50*time.Millisecond))
	dir := t.TempDir()
	var added vigiltype.Task
	vigil(t, srv.URL, &added, "tasks", "add", "lapse", "--activity-gated", "--lease-timeout", "1s")
	// No activity after the claim: under the activity policy the lease
	// lapses after 1s although the loop keeps sending heartbeats.
	code, _, errOut := runVigil(t, "run", "--workdir", dir, "--claim", "lapse", "--interval", "200ms",
		"--server", srv.URL, "--", "sleep", "120")
	require.Equal(t, 128+int(syscall.SIGTERM), code, "sleep was stopped by SIGTERM, not waited out: %s", errOut)
	require.Contains(t, errOut, "heartbeat loop of task")
	require.Empty(t, loopsIn(t, dir))
	got := task(t, srv.URL, added.TaskID)
	require.Equal(t, 1, got.Reclaims)
}

// vigil run killed with SIGKILL takes CMD with it (parent-death signal), so
// no command outlives its reaper while its task is reclaimed.
func TestRunKilledTakesTheCommandWithIt(t *testing.T) {
	t.Parallel()
	url, _ := countingServer(t)
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "cmd.pid")
	var added vigiltype.Task
	vigil(t, url, &added, "tasks", "add", "orphan")
	p := start(t, nil, bins.vigil, "run", "--workdir", dir, "--claim", "orphan", "--interval", "100ms",
		"--server", url, "--", "sh", "-c", `echo $$ > "$0"; exec sleep 1000`, pidFile)
	var cmdPID int
	eventually(t, 30*time.Second, "the command to start", func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil || len(bytes.TrimSpace(b)) == 0 {
			return false
		}
		cmdPID, err = strconv.Atoi(string(bytes.TrimSpace(b)))
		return err == nil
	})
	require.NoError(t, syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL))
	eventually(t, 30*time.Second, "the command to die with vigil run", func() bool {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmdPID))
		if err != nil {
			return true // gone
		}
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		return len(fields) > 0 && fields[0] == "Z" // dead, waiting for a reaper
	})
}
