// Package e2e runs vigil as its users do: the real vigil binary serving a
// real SQLite file, real example worker processes on the Go SDK, killed with
// real signals, and observed through the vigil CLI.
package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
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

	"github.com/vigil-fleet/vigil/internal/store/pgstore/pgtest"
	"github.com/vigil-fleet/vigil/vigiltype"
)

var bins struct {
	vigil, worker string
}

func TestMain(m *testing.M) {
	// The binaries are built with -race: a race in them ends them at once
	// (and so fails the test), and they skip the race runtime's default
	// one-second pause at exit, which would slow every CLI call.
	os.Setenv("GORACE", "halt_on_error=1 atexit_sleep_ms=0")
	dir, err := os.MkdirTemp("", "vigil-e2e-bin")
	if err != nil {
		panic(err)
	}
	bins.vigil = filepath.Join(dir, "vigil")
	bins.worker = filepath.Join(dir, "worker")
	for out, pkg := range map[string]string{bins.vigil: "../../cmd/vigil", bins.worker: "../../examples/worker"} {
		cmd := exec.Command("go", "build", "-race", "-o", out, pkg)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: build %s: %v\n", pkg, err)
			os.Exit(1)
		}
	}
	pgtest.Announce()
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a child process whose combined output is kept for assertions.
type proc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{} // closed once the process has exited and been reaped
}

// running reports whether the process has not exited.
func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// start runs name with args and env in its own process group; the group is
// killed when the test ends.
func start(t *testing.T, env []string, name string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	p := &proc{cmd: cmd, out: out, done: done}
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT)
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		if t.Failed() {
			t.Logf("output of %s %v:\n%s", filepath.Base(name), args, out.String())
		}
	})
	return p
}

var servingRe = regexp.MustCompile(`url=(http://127\.0\.0\.1:\d+)`)

// startServer runs `vigil serve` on a free loopback port over a fresh SQLite
// file and returns its URL.
func startServer(t *testing.T, args ...string) string {
	t.Helper()
	url, _ := startServerOn(t, filepath.Join(t.TempDir(), "vigil.db"), args...)
	return url
}

// startServerOn runs `vigil serve --db db` on a free loopback port and
// returns its URL and process.
func startServerOn(t *testing.T, db string, args ...string) (string, *proc) {
	t.Helper()
	p := start(t, nil, bins.vigil, append([]string{"serve", "--db", db, "--addr", "127.0.0.1:0"}, args...)...)
	var url string
	eventually(t, 30*time.Second, "the server to log its URL", func() bool {
		m := servingRe.FindStringSubmatch(p.out.String())
		if m != nil {
			url = m[1]
		}
		return m != nil
	})
	return url, p
}

// vigil runs the CLI against url and decodes its --json output into out.
func vigil(t *testing.T, url string, out any, args ...string) {
	t.Helper()
	cmd := exec.Command(bins.vigil, append(args, "--server", url, "--json")...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	require.NoError(t, err, "vigil %v: %s", args, stderr.String())
	require.NoError(t, json.Unmarshal(stdout, out), "vigil %v printed %s", args, stdout)
}

func processes(t *testing.T, url string) map[string]vigiltype.Process {
	var page struct {
		Processes []vigiltype.Process `json:"processes"`
	}
	vigil(t, url, &page, "ps", "--kind", "worker", "--limit", "1000")
	byID := map[string]vigiltype.Process{}
	for _, p := range page.Processes {
		byID[p.InstanceID] = p
	}
	return byID
}

func task(t *testing.T, url string, id int64) vigiltype.Task {
	var task vigiltype.Task
	vigil(t, url, &task, "tasks", "show", strconv.FormatInt(id, 10))
	return task
}

// eventually polls cond until it holds; the timeout only guards against a
// hung test, it is not what the test measures.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func workerEnv(url string, liveness, heartbeat string) []string {
	return []string{
		"VIGIL_URL=" + url,
		"VIGIL_KIND=worker",
		"VIGIL_WORKER_LIVENESS_INTERVAL=" + liveness,
		"VIGIL_WORKER_HEARTBEAT_INTERVAL=" + heartbeat,
		"VIGIL_WORKER_POLL_INTERVAL=100ms",
	}
}

// startWorkers starts n example workers and waits until all show alive,
// returning them by pid.
func startWorkers(t *testing.T, url string, n int, env []string) map[int]*proc {
	t.Helper()
	workers := map[int]*proc{}
	for range n {
		p := start(t, env, bins.worker)
		workers[p.cmd.Process.Pid] = p
	}
	eventually(t, 60*time.Second, fmt.Sprintf("%d alive workers", n), func() bool {
		alive := 0
		for _, p := range processes(t, url) {
			if p.Status == vigiltype.ProcessAlive && workers[p.PID] != nil {
				alive++
			}
		}
		return alive == n
	})
	return workers
}

func enqueue(t *testing.T, url, payload string) vigiltype.Task {
	var task vigiltype.Task
	vigil(t, url, &task, "tasks", "add", "sleep", "--payload", payload)
	return task
}

// holder waits until the task is running and returns its lease owner's row.
func holder(t *testing.T, url string, id int64, notOwner string) (vigiltype.Task, vigiltype.Process) {
	t.Helper()
	var running vigiltype.Task
	eventually(t, 30*time.Second, "the task to be claimed", func() bool {
		running = task(t, url, id)
		return running.Status == vigiltype.TaskRunning && running.LeaseOwner != nil && *running.LeaseOwner != notOwner
	})
	owner, ok := processes(t, url)[*running.LeaseOwner]
	require.True(t, ok, "lease owner %s has no process row", *running.LeaseOwner)
	return running, owner
}

// A worker killed with SIGKILL while holding a task shows stopped once 3× its
// liveness interval has passed, not before; its task is reclaimed as soon as
// it shows stopped (not after the 5-minute lease window) and completed by a
// live worker.
func TestKilledWorkerShowsStoppedAndItsTaskMovesOn(t *testing.T) {
	t.Parallel()
	const interval = time.Second
	url := startServer(t, "--sweep-interval", "200ms") // default 5 min lease window
	workers := startWorkers(t, url, 3, workerEnv(url, "1s", "1s"))

	// Long enough that the holder is still working when the kill lands.
	queued := enqueue(t, url, `{"seconds":6}`)
	_, victim := holder(t, url, queued.TaskID, "")
	require.NoError(t, syscall.Kill(victim.PID, syscall.SIGKILL))

	var stopped vigiltype.Process
	eventually(t, 30*time.Second, "the killed worker to show stopped", func() bool {
		procs := processes(t, url)
		// The server decided the status at some instant before this one,
		// on the same machine's clock: if it said stopped too early, the
		// row's heartbeat is less than 3 intervals old even now.
		answeredBy := time.Now()
		stopped = procs[victim.InstanceID]
		if stopped.Status != vigiltype.ProcessStopped {
			return false
		}
		require.GreaterOrEqual(t, answeredBy.Sub(stopped.LastHeartbeatAt), 3*interval,
			"shown stopped before 3× its liveness interval had passed")
		for id, p := range procs {
			if id != victim.InstanceID && workers[p.PID] != nil {
				require.Equal(t, vigiltype.ProcessAlive, p.Status, "worker pid %d", p.PID)
			}
		}
		return true
	})
	stoppedAt := time.Now()

	var done vigiltype.Task
	eventually(t, 60*time.Second, "the task to be completed by a live worker", func() bool {
		done = task(t, url, queued.TaskID)
		return done.Status == vigiltype.TaskCompleted
	})
	require.Less(t, time.Since(stoppedAt), 2*time.Minute, "the task waited out the lease window")
	require.Equal(t, 1, done.Reclaims)
	require.NotNil(t, done.CompletedBy)
	require.NotEqual(t, victim.InstanceID, *done.CompletedBy)
	finisher := processes(t, url)[*done.CompletedBy]
	require.Equal(t, vigiltype.ProcessAlive, finisher.Status)
	require.NotNil(t, workers[finisher.PID], "completed_by names one of the live workers")
	var result struct {
		InstanceID string `json:"instance_id"`
	}
	require.NoError(t, json.Unmarshal(done.Result, &result))
	require.Equal(t, *done.CompletedBy, result.InstanceID)
}

// A worker frozen (SIGSTOP) past its lease window and then resumed cannot
// heartbeat or complete the task reclaimed from it: both get 409, its
// handler's context is cancelled, and the task's result is the new holder's.
func TestFrozenWorkerIsFencedOff(t *testing.T) {
	t.Parallel()
	const leaseWindow = 2 * time.Second
	url := startServer(t, "--sweep-interval", "200ms", "--lease-timeout", leaseWindow.String())
	// A 1s liveness interval (a 3s alive window): the successor must not be
	// fenced by a loaded machine while the frozen one is.
	workers := startWorkers(t, url, 2, workerEnv(url, "1s", "300ms"))

	// The handler ignores cancellation so that the frozen worker, once
	// resumed, really tries to complete.
	// It also outlasts the freeze, so that the resumed holder is still
	// working (and renewing its lease) when it learns it lost the task.
	queued := enqueue(t, url, `{"seconds":15,"ignore_cancel":true}`)
	first, frozen := holder(t, url, queued.TaskID, "")
	frozenProc := workers[frozen.PID]
	require.NotNil(t, frozenProc)
	require.NoError(t, syscall.Kill(frozen.PID, syscall.SIGSTOP))
	frozeAt := time.Now()

	second, successor := holder(t, url, queued.TaskID, frozen.InstanceID)
	require.Greater(t, second.LeaseEpoch, first.LeaseEpoch)
	eventually(t, 30*time.Second, "the lease window to pass", func() bool { return time.Since(frozeAt) > leaseWindow+500*time.Millisecond })
	require.NoError(t, syscall.Kill(frozen.PID, syscall.SIGCONT))

	taskLog := fmt.Sprintf("task_id=%d", queued.TaskID)
	eventually(t, 30*time.Second, "the resumed worker to be refused", func() bool {
		out := frozenProc.out.String()
		return linesWith(out, taskLog, "heartbeat refused") && linesWith(out, taskLog, "complete refused")
	})
	// Its handler's context was cancelled: by its own fence (it saw its
	// liveness window pass while frozen), its own lease deadline, or the 409.
	out := frozenProc.out.String()
	require.True(t, linesWith(out, taskLog, "lease lost") || linesWith(out, taskLog, "handler cancelled"),
		"the handler's context was not cancelled:\n%s", out)

	var done vigiltype.Task
	eventually(t, 60*time.Second, "the successor to complete the task", func() bool {
		done = task(t, url, queued.TaskID)
		return done.Status == vigiltype.TaskCompleted
	})
	require.Equal(t, successor.InstanceID, *done.CompletedBy)
	var result struct {
		InstanceID string `json:"instance_id"`
	}
	require.NoError(t, json.Unmarshal(done.Result, &result))
	require.Equal(t, successor.InstanceID, result.InstanceID, "the result is the new holder's")
}

// linesWith reports whether one line of out contains every word.
func linesWith(out string, words ...string) bool {
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
lines:
	for sc.Scan() {
		for _, w := range words {
			if !strings.Contains(sc.Text(), w) {
				continue lines
			}
		}
		return true
	}
	return false
}
