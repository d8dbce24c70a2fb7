package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// outageTasks is how many short tasks an outage test runs.
const outageTasks = 150

// enqueueShort enqueues n sleep tasks of 0.2s through the SDK.
func enqueueShort(t *testing.T, url string, n int) {
	t.Helper()
	c, err := vigilclient.New([]string{url})
	require.NoError(t, err)
	for range n {
		_, err := c.Enqueue(context.Background(), vigilclient.EnqueueParams{TaskType: "sleep", Payload: map[string]float64{"seconds": 0.2}})
		require.NoError(t, err)
	}
}

// requireEachRanOnce checks that every task completed, by the instance
// that wrote its result, with no reclaim (no second holder) and, when
// noFailures, no failure either (the handler ran once to the end).
func requireEachRanOnce(t *testing.T, tasks []vigiltype.Task, noFailures bool) {
	t.Helper()
	require.Len(t, tasks, outageTasks, "no task lost or duplicated")
	requireResultsAreTheCompleters(t, tasks)
	for _, task := range tasks {
		why := ""
		if task.LastError != nil {
			why = *task.LastError
		}
		require.Zero(t, task.Reclaims, "task %d reclaimed (%s)", task.TaskID, why)
		if noFailures {
			require.Zero(t, task.Attempts, "task %d failed and ran again (%s)", task.TaskID, why)
		}
	}
}

// PostgreSQL goes away for 10s (immediate shutdown) under two servers and
// three workers at a 2s liveness interval: no worker is judged stopped, no
// lease is reclaimed, and every task runs once (DESIGN L8, issue #12 case 1:
// before, every worker was fenced and tasks ran twice with reclaims=1).
func TestPostgresOutageCausesNoDoubleWork(t *testing.T) {
	t.Parallel()
	pg := startPrivatePostgres(t)
	args := []string{"--sweep-interval", "500ms"}
	urlA, _ := startServerOn(t, pg.url(), args...)
	urlB, _ := startServerOn(t, pg.url(), args...)
	env := workerEnv(urlA+","+urlB, "2s", "1s")
	workers := startWorkers(t, urlA, 3, env)

	enqueueShort(t, urlA, outageTasks)
	eventually(t, 60*time.Second, "some work done before the outage", func() bool {
		return countStatus(allTasks(t, urlB), vigiltype.TaskCompleted) >= 20
	})
	pg.ctl("-m", "immediate", "-w", "stop")
	time.Sleep(10 * time.Second) // the outage being tested, not a wait for a condition
	pg.start()

	var tasks []vigiltype.Task
	eventually(t, 180*time.Second, fmt.Sprintf("all %d tasks to complete", outageTasks), func() bool {
		cmd := exec.Command(bins.vigil, "tasks", "ls", "--limit", "1", "--server", urlB)
		if cmd.Run() != nil {
			return false // the servers reconnect
		}
		tasks = allTasks(t, urlB)
		return countStatus(tasks, vigiltype.TaskCompleted) == outageTasks
	})
	requireEachRanOnce(t, tasks, true)
	alive := 0
	for _, p := range processes(t, urlB) {
		if p.Status == vigiltype.ProcessAlive && workers[p.PID] != nil {
			alive++
		}
	}
	require.Equal(t, len(workers), alive, "every worker kept its instance through the outage")
}

// The same on SQLite, where the server itself is the outage: it is killed
// with SIGKILL while three workers run tasks, and started again on the same
// file and address 10s later. The restarted server's first pulse finds the
// gap and gives every instance and lease a full window, so none is
// reclaimed; a worker that fenced itself while it could not reach any
// server hands its task back with a failure, never by a reclaim.
func TestSQLiteServerKillCausesNoDoubleRun(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "vigil.db")
	args := []string{"--sweep-interval", "500ms"}
	url, server := startServerOn(t, db, args...)
	addr := url[len("http://"):]
	workers := startWorkers(t, url, 3, workerEnv(url, "2s", "1s"))

	enqueueShort(t, url, outageTasks)
	eventually(t, 60*time.Second, "some work done before the kill", func() bool {
		return countStatus(allTasks(t, url), vigiltype.TaskCompleted) >= 20
	})
	require.NoError(t, syscall.Kill(server.cmd.Process.Pid, syscall.SIGKILL))
	<-server.done
	time.Sleep(10 * time.Second) // the outage being tested, not a wait for a condition
	start(t, nil, bins.vigil, append([]string{"serve", "--db", db, "--addr", addr}, args...)...)

	var tasks []vigiltype.Task
	eventually(t, 180*time.Second, fmt.Sprintf("all %d tasks to complete", outageTasks), func() bool {
		if exec.Command(bins.vigil, "tasks", "ls", "--limit", "1", "--server", url).Run() != nil {
			return false
		}
		tasks = allTasks(t, url)
		return countStatus(tasks, vigiltype.TaskCompleted) == outageTasks
	})
	requireEachRanOnce(t, tasks, false)
	require.Len(t, workers, 3)
}
