package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/store/pgstore/pgtest"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func allTasks(t *testing.T, url string) []vigiltype.Task {
	var page struct {
		Tasks []vigiltype.Task `json:"tasks"`
	}
	vigil(t, url, &page, "tasks", "ls", "--limit", "1000")
	return page.Tasks
}

func countStatus(tasks []vigiltype.Task, status vigiltype.TaskStatus) int {
	n := 0
	for _, task := range tasks {
		if task.Status == status {
			n++
		}
	}
	return n
}

// requireResultsAreTheCompleters checks every completed task's result was
// written by the instance named in completed_by.
func requireResultsAreTheCompleters(t *testing.T, tasks []vigiltype.Task) {
	t.Helper()
	for _, task := range tasks {
		require.Equal(t, vigiltype.TaskCompleted, task.Status, "task %d", task.TaskID)
		var result struct {
			InstanceID string `json:"instance_id"`
		}
		require.NoError(t, json.Unmarshal(task.Result, &result), "task %d", task.TaskID)
		require.Equal(t, *task.CompletedBy, result.InstanceID, "task %d", task.TaskID)
	}
}

// Two servers share one PostgreSQL database, each with real workers. One
// server is killed with SIGKILL: its workers move to the other (they were
// given both URLs), no task is lost, and the lease of a worker killed too is
// reclaimed exactly once although both servers ran the reclaimer.
func TestTwoServersOneDiesNothingIsLost(t *testing.T) {
	t.Parallel()
	db := pgtest.URL(t)
	args := []string{"--sweep-interval", "200ms", "--lease-timeout", "3s"}
	urlA, serverA := startServerOn(t, db, args...)
	urlB, _ := startServerOn(t, db, args...)

	workers := map[int]*proc{}
	for _, order := range []string{urlA + "," + urlB, urlA + "," + urlB, urlB + "," + urlA, urlB + "," + urlA} {
		p := start(t, workerEnv(order, "500ms", "300ms"), bins.worker)
		workers[p.cmd.Process.Pid] = p
	}
	eventually(t, 60*time.Second, "4 alive workers", func() bool {
		alive := 0
		for _, p := range processes(t, urlB) {
			if p.Status == vigiltype.ProcessAlive && workers[p.PID] != nil {
				alive++
			}
		}
		return alive == len(workers)
	})

	const total = 16
	for range total {
		// 4s: the task the test picks is still running when the SIGKILL
		// lands, even on a loaded machine (with 2s it sometimes finished
		// in between, and its reclaim count was 0).
		enqueue(t, urlB, `{"seconds":4}`)
	}
	eventually(t, 30*time.Second, "work to start", func() bool {
		return countStatus(allTasks(t, urlB), vigiltype.TaskRunning) >= 2
	})
	require.NoError(t, syscall.Kill(serverA.cmd.Process.Pid, syscall.SIGKILL))

	// Kill a worker that holds a task: its lease must be reclaimed once.
	var victimTask vigiltype.Task
	var victim vigiltype.Process
	eventually(t, 30*time.Second, "a running task to kill the holder of", func() bool {
		procs := processes(t, urlB)
		for _, task := range allTasks(t, urlB) {
			if task.Status == vigiltype.TaskRunning && task.LeaseOwner != nil {
				if p, ok := procs[*task.LeaseOwner]; ok && workers[p.PID] != nil && p.Status == vigiltype.ProcessAlive {
					victimTask, victim = task, p
					return true
				}
			}
		}
		return false
	})
	require.NoError(t, syscall.Kill(victim.PID, syscall.SIGKILL))

	var tasks []vigiltype.Task
	eventually(t, 120*time.Second, fmt.Sprintf("all %d tasks to complete", total), func() bool {
		tasks = allTasks(t, urlB)
		return countStatus(tasks, vigiltype.TaskCompleted) == total
	})
	require.Len(t, tasks, total, "no task is lost or duplicated")
	requireResultsAreTheCompleters(t, tasks)
	for _, task := range tasks {
		require.LessOrEqual(t, task.Reclaims, 1, "task %d reclaimed more than once", task.TaskID)
		if task.TaskID == victimTask.TaskID {
			require.Equal(t, 1, task.Reclaims, "the killed worker's task")
			require.NotEqual(t, victim.InstanceID, *task.CompletedBy)
		}
	}
	alive := 0
	for _, p := range processes(t, urlB) {
		if p.Status == vigiltype.ProcessAlive && workers[p.PID] != nil {
			alive++
		}
	}
	require.Equal(t, len(workers)-1, alive, "the surviving workers are alive on the remaining server")
}

// pgCluster is a private PostgreSQL server in a temporary directory, so a
// test may restart it without disturbing the shared one.
type pgCluster struct {
	t       *testing.T
	bin     string
	dataDir string
	logFile string // the server's output: never our pipe, which it would hold open
	port    int
	opts    string // the server's options (port, socket directory), for a start after a stop
}

// start starts the stopped server again on its port.
func (c *pgCluster) start() { c.ctl("-o", c.opts, "-w", "start") }

func (c *pgCluster) ctl(args ...string) {
	c.t.Helper()
	cmd := exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(c.bin, "pg_ctl"),
		"-D", c.dataDir, "-l", c.logFile}, args...)...)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	require.NoError(c.t, err, "pg_ctl %v: %s", args, out)
}

func (c *pgCluster) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// startPrivatePostgres runs initdb and starts a server as the postgres user.
// It skips (fails under CI=true) when PostgreSQL's binaries are not here.
func startPrivatePostgres(t *testing.T) *pgCluster {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	pgUser, err := user.Lookup("postgres")
	if len(bins) == 0 || err != nil || os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("PostgreSQL restart test needs PostgreSQL's binaries, a postgres user and root")
		}
		t.Skip("PostgreSQL restart test SKIPPED: needs /usr/lib/postgresql/*/bin, a postgres user and root")
	}
	uid, _ := strconv.Atoi(pgUser.Uid)
	gid, _ := strconv.Atoi(pgUser.Gid)
	dir, err := os.MkdirTemp("", "vigil-pg-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o755))
	require.NoError(t, os.Chown(dir, uid, gid))

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()

	c := &pgCluster{t: t, bin: filepath.Dir(bins[0]), dataDir: filepath.Join(dir, "data"), logFile: filepath.Join(dir, "log"), port: port}
	out, err := exec.Command("runuser", "-u", "postgres", "--", bins[0], "-D", c.dataDir,
		"-A", "trust", "-U", "postgres", "--no-sync").CombinedOutput()
	require.NoError(t, err, "initdb: %s", out)
	c.opts = fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on", port, dir)
	c.start()
	t.Cleanup(func() {
		_ = exec.Command("runuser", "-u", "postgres", "--", filepath.Join(c.bin, "pg_ctl"), "-D", c.dataDir, "-m", "immediate", "-w", "stop").Run()
		os.RemoveAll(dir)
	})
	return c
}

// PostgreSQL restarts while workers heartbeat and tasks run: the server
// recovers by itself (its pool reconnects), workers carry on, and no write
// the server acknowledged is lost.
func TestPostgresRestartLosesNoAcknowledgedWrite(t *testing.T) {
	t.Parallel()
	pg := startPrivatePostgres(t)
	url, server := startServerOn(t, pg.url(), "--sweep-interval", "200ms", "--lease-timeout", "5s")
	workers := startWorkers(t, url, 2, workerEnv(url, "1s", "500ms"))

	// Enough work that some is running when the database goes away.
	acked := map[int64]bool{}
	for range 6 {
		acked[enqueue(t, url, `{"seconds":4}`).TaskID] = true
	}
	eventually(t, 30*time.Second, "work to start", func() bool {
		return countStatus(allTasks(t, url), vigiltype.TaskRunning) >= 1
	})

	pg.ctl("-m", "fast", "-w", "restart")

	// Writes acknowledged after the restart, once the server answers again.
	eventually(t, 60*time.Second, "the server to accept writes again", func() bool {
		cmd := exec.Command(bins.vigil, "tasks", "add", "sleep", "--payload", `{"seconds":1}`, "--json", "--server", url)
		out, err := cmd.Output()
		if err != nil {
			return false
		}
		var task vigiltype.Task
		require.NoError(t, json.Unmarshal(out, &task))
		acked[task.TaskID] = true
		return true
	})
	for range 4 {
		acked[enqueue(t, url, `{"seconds":1}`).TaskID] = true
	}

	var tasks []vigiltype.Task
	eventually(t, 120*time.Second, "every acknowledged task to complete", func() bool {
		tasks = allTasks(t, url)
		return countStatus(tasks, vigiltype.TaskCompleted) == len(acked)
	})
	for _, task := range tasks {
		require.True(t, acked[task.TaskID], "task %d was never acknowledged", task.TaskID)
	}
	require.Len(t, tasks, len(acked))
	requireResultsAreTheCompleters(t, tasks)

	alive := 0
	for _, p := range processes(t, url) {
		if p.Status == vigiltype.ProcessAlive && workers[p.PID] != nil {
			alive++
		}
	}
	require.Equal(t, len(workers), alive, "both workers are alive again after the restart")
	require.True(t, server.running(), "the server kept running through the restart")
}
