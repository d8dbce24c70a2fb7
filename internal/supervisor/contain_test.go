//go:build linux

package supervisor

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// escapeScript double-forks a grandchild that calls setsid(), so that it
// leaves the agent's process group and session and is orphaned at once. The
// grandchild prints its pid and its /proc stat, and signals through the fifo
// $SYNC that it is in place; the leader waits for that, then runs leaderEnd.
func escapeScript(leaderEnd string) string {
	return `( setsid sh -c 'echo "grandchild $$"; echo "stat $(cat /proc/$$/stat)"; echo x > "$SYNC"; exec sleep 1000' & ); ` +
		`read _ < "$SYNC"; echo "leader $$"; ` + leaderEnd
}

// newFifo creates a fifo in a test directory and returns its path.
func newFifo(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sync")
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	return path
}

// requireEscaped checks, from the "stat …" line the grandchild printed, that
// it had left the leader's process group and session.
func requireEscaped(t *testing.T, b *testBundle, name string, grandchild, leader int) {
	t.Helper()
	line := strings.TrimPrefix(b.stdout.waitLine(t, "["+name+"] stat "), "["+name+"] stat ")
	p, ok := parseProcStatFull([]byte(line))
	require.True(t, ok, line)
	require.Equal(t, grandchild, p.sid, "the grandchild leads its own session")
	require.Equal(t, grandchild, p.pgid, "the grandchild left the agent's group")
	require.NotEqual(t, leader, p.ppid, "the grandchild was double-forked")
}

// waitReaped waits until the supervisor reports that it reaped pid, and
// returns its status.
func (b *testBundle) waitReaped(t *testing.T, pid int) syscall.WaitStatus {
	t.Helper()
	for {
		if ws, ok := b.reaped[pid]; ok {
			return ws
		}
		r := recv(t, b.sup.testSignals.orphanReaped.ch, "reap of "+strconv.Itoa(pid))
		b.reaped[r.pid] = r.ws
	}
}

// DESIGN S3 + containment: a grandchild that escaped the group with setsid
// and a double fork is stopped when the agent exits, before the restart, and
// reaped by the supervisor (no zombie).
func TestSupervisorStopsEscapedDescendantBeforeRestart(t *testing.T) {
	b := setup(t, Config{
		Agents: []Agent{{
			Name:    "escaper",
			Command: []string{"sh", "-c", escapeScript("exit 3")},
			Env:     map[string]string{"SYNC": newFifo(t)},
		}},
		Backoff:   BackoffPolicy{Min: time.Hour, Max: time.Hour}, // one run
		StopGrace: 5 * time.Second,
	})
	b.run(t)

	pid := recv(t, b.sup.testSignals.started.ch, "start")
	grandchild := b.stdout.waitPID(t, "[escaper] grandchild ")
	require.Equal(t, pid, b.stdout.waitPID(t, "[escaper] leader "))
	requireEscaped(t, b, "escaper", grandchild, pid)
	require.Contains(t, recv(t, b.sup.testSignals.exited.ch, "exit"), "exit status 3 after ")
	require.Equal(t, time.Hour, recv(t, b.sup.testSignals.restartScheduled.ch, "restart"))

	// Gone by the time the restart is scheduled, reaped by the supervisor.
	ws := b.waitReaped(t, grandchild)
	require.True(t, ws.Signaled())
	require.Equal(t, syscall.SIGTERM, ws.Signal())
	require.ErrorIs(t, syscall.Kill(grandchild, 0), syscall.ESRCH, "no process, not even a zombie")
	require.Equal(t, 1, b.logs.count(`msg="agent left processes in its group; stopping them" agent=escaper`))
	b.stop(t)
}

// The supervisor's shutdown stops an escaped grandchild too, and Run returns
// only after reaping it.
func TestSupervisorShutdownStopsEscapedDescendant(t *testing.T) {
	b := setup(t, Config{
		Agents: []Agent{{
			Name:    "escaper",
			Command: []string{"sh", "-c", escapeScript("exec sleep 1000")},
			Env:     map[string]string{"SYNC": newFifo(t)},
		}},
		StopGrace: 5 * time.Second,
	})
	b.run(t)

	pid := recv(t, b.sup.testSignals.started.ch, "start")
	grandchild := b.stdout.waitPID(t, "[escaper] grandchild ")
	b.stdout.waitLine(t, "[escaper] leader ")
	requireEscaped(t, b, "escaper", grandchild, pid)
	requireRunning(t, grandchild)

	require.Less(t, b.stop(t), 5*time.Second, "SIGTERM was enough")
	requireGone(t, pid)
	b.sup.reaper.mu.Lock()
	ws := b.reapedBySupervisor(t, grandchild) // before Run returned
	b.sup.reaper.mu.Unlock()
	require.Equal(t, syscall.SIGTERM, ws.Signal())
	require.ErrorIs(t, syscall.Kill(grandchild, 0), syscall.ESRCH)
}

// An escaped descendant that exits on its own while the agent runs is reaped
// as soon as it dies: adopted orphans do not pile up as zombies.
func TestSupervisorReapsAdoptedOrphans(t *testing.T) {
	release := newFifo(t)
	b := setup(t, Config{
		Agents: []Agent{{
			Name: "forker",
			Command: []string{"sh", "-c",
				`( setsid sh -c 'echo "helper $$"; read _ < "$RELEASE"; exit 0' & ); exec sleep 1000`},
			Env: map[string]string{"RELEASE": release},
		}},
	})
	b.run(t)

	recv(t, b.sup.testSignals.started.ch, "start")
	helper := b.stdout.waitPID(t, "[forker] helper ")
	requireRunning(t, helper)
	b.sup.reaper.pass() // as its ticker would: the helper is seen alive
	require.NoError(t, os.WriteFile(release, []byte("go\n"), 0o600))

	ws := b.waitReaped(t, helper) // on SIGCHLD
	require.True(t, ws.Exited())
	require.Zero(t, ws.ExitStatus())
	require.ErrorIs(t, syscall.Kill(helper, 0), syscall.ESRCH, "not left a zombie")
	require.True(t, b.sup.Status()[0].Running, "the agent itself runs on")
	b.stop(t)
}

// The reaper never reaps a child of this process that os/exec waits for,
// even a zombie in a session or a group of its own (as the heartbeat loop,
// or another supervisor's agent in the same process): its status belongs
// to whoever started it.
func TestReaperLeavesOtherChildren(t *testing.T) {
	b := setup(t, Config{Agents: []Agent{{Name: "a", Command: []string{"sleep", "1000"}}}})
	b.run(t)
	recv(t, b.sup.testSignals.started.ch, "start")

	for name, attr := range map[string]*syscall.SysProcAttr{
		"session": {Setsid: true},
		"group":   {Setpgid: true},
	} {
		p, err := os.StartProcess("/bin/sh", []string{"sh", "-c", "exit 7"}, &os.ProcAttr{Sys: attr})
		require.NoError(t, err, name)
		waitZombie(t, p.Pid)
		b.sup.reaper.pass()
		state, err := p.Wait()
		require.NoError(t, err, "%s: the reaper did not steal the status", name)
		require.Equal(t, 7, state.ExitCode(), name)
	}
	b.sup.reaper.pass()
	b.stop(t)
}

// waitZombie polls until pid, a child of this process, has exited and
// waits to be reaped.
func waitZombie(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for {
		st, ok := readLaunchProcStat(pid)
		require.True(t, ok, "process %d was reaped", pid)
		if st.state == 'Z' {
			return
		}
		require.True(t, time.Now().Before(deadline), "process %d still runs after %s", pid, testTimeout)
		time.Sleep(time.Millisecond)
	}
}

// An escaped grandchild that ignores SIGTERM gets SIGKILL after StopGrace,
// as the group does.
func TestSupervisorKillsStubbornEscapedDescendant(t *testing.T) {
	const grace = 200 * time.Millisecond
	b := setup(t, Config{
		Agents: []Agent{{
			Name: "stubborn",
			Command: []string{"sh", "-c",
				`( setsid sh -c 'trap "" TERM; echo "grandchild $$"; echo x > "$SYNC"; exec sleep 1000' & ); ` +
					`read _ < "$SYNC"; echo ready; exec sleep 1000`},
			Env: map[string]string{"SYNC": newFifo(t)},
		}},
		StopGrace: grace,
	})
	b.run(t)

	recv(t, b.sup.testSignals.started.ch, "start")
	grandchild := b.stdout.waitPID(t, "[stubborn] grandchild ")
	b.stdout.waitLine(t, "[stubborn] ready")

	require.GreaterOrEqual(t, b.stop(t), grace, "SIGKILL only after the grace period")
	b.sup.reaper.mu.Lock()
	ws := b.reapedBySupervisor(t, grandchild)
	b.sup.reaper.mu.Unlock()
	require.True(t, ws.Signaled())
	require.Equal(t, syscall.SIGKILL, ws.Signal())
	require.ErrorIs(t, syscall.Kill(grandchild, 0), syscall.ESRCH)
	require.Equal(t, 1, b.logs.count(`msg="agent did not stop within grace; sending SIGKILL" agent=stubborn`))
}

func TestParseGeneration(t *testing.T) {
	sup, agent, ok := parseGeneration("123-456.abcdefabcdef.my.agent-1.7")
	require.True(t, ok)
	require.Equal(t, "123-456", sup)
	require.Equal(t, "my.agent-1", agent)
	for _, bad := range []string{"", "123", "123-4.rand", "123-4.rand.7"} {
		_, _, ok := parseGeneration(bad)
		require.False(t, ok, bad)
	}
}
