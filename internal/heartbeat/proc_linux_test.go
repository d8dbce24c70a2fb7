package heartbeat

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestProcReadingReal(t *testing.T) {
	t.Parallel()
	self, err := Capture(os.Getpid())
	require.NoError(t, err)
	require.NotZero(t, self.StartTime)
	require.True(t, Alive(self))

	child := startHelper(t, t.TempDir())
	ref, err := Capture(child.Process.Pid)
	require.NoError(t, err)
	require.True(t, Alive(ref))
	// The same pid captured with another start time is another process:
	// what a reused pid looks like.
	require.False(t, Alive(ProcRef{PID: ref.PID, StartTime: ref.StartTime + 1}), "pid now held by an unrelated process")

	// Killed but not yet reaped: a zombie counts as gone.
	require.NoError(t, child.Process.Signal(syscall.SIGKILL))
	require.Eventually(t, func() bool { return Observe(ref.PID).Zombie }, 5*time.Second, time.Millisecond)
	require.False(t, Alive(ref))
	_, _ = child.Process.Wait()
	require.False(t, Observe(ref.PID).Exists)
}

func TestSpawnDetachedAndKill(t *testing.T) {
	t.Parallel()
	st, err := Open(t.TempDir())
	require.NoError(t, err)
	exe, err := os.Executable()
	require.NoError(t, err)
	parent, err := Capture(os.Getpid())
	require.NoError(t, err)
	env := append(os.Environ(), helperEnv+"=wait")
	p, ref, err := Spawn(SpawnParams{State: st, Parent: parent, Env: env,
		Argv: []string{exe, "heartbeat", "loop", "--workdir", st.Workdir, "--parent-pid", strconv.Itoa(parent.PID)}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Kill(); _, _ = p.Wait() })
	go func() { _, _ = p.Wait() }() // reap, as a long-lived spawner must

	got, err := st.ReadProcRef(PIDFile)
	require.NoError(t, err)
	require.Equal(t, ref, got)
	pp, err := st.ReadProcRef(ParentPIDFile)
	require.NoError(t, err)
	require.Equal(t, parent, pp)

	// Own session: the session id (stat field 6) is its own pid.
	b, err := os.ReadFile("/proc/" + strconv.Itoa(ref.PID) + "/stat")
	require.NoError(t, err)
	f := strings.Fields(string(b)[strings.LastIndexByte(string(b), ')')+1:])
	require.Equal(t, strconv.Itoa(ref.PID), f[3], "session id")
	// cwd is the workdir.
	cwd, err := os.Readlink("/proc/" + strconv.Itoa(ref.PID) + "/cwd")
	require.NoError(t, err)
	require.Equal(t, st.Workdir, cwd)

	_, _, err = Spawn(SpawnParams{State: st, Parent: parent, Env: env, Argv: []string{exe}})
	require.ErrorIs(t, err, ErrLoopRunning)

	res, err := Kill(st, time.Second)
	require.NoError(t, err)
	require.True(t, res.Running)
	require.False(t, Alive(ref))
	_, err = os.Stat(st.Path(PIDFile))
	require.ErrorIs(t, err, os.ErrNotExist)

	res, err = Kill(st, time.Second)
	require.NoError(t, err)
	require.Nil(t, res.Loop, "no pid file: nothing to do")
}

func TestSweep(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	keep := filepath.Join(root, "keep")
	gone := filepath.Join(root, "gone")
	orphan := filepath.Join(root, "orphan")
	for _, d := range []string{keep, gone, orphan} {
		require.NoError(t, os.Mkdir(d, 0o700))
	}
	self, err := Capture(os.Getpid())
	require.NoError(t, err)
	loopArgs := func(dir string, parent ProcRef) []string {
		return []string{"heartbeat", "loop", "--workdir", dir, "--parent-pid", strconv.Itoa(parent.PID), "--parent-start", strconv.FormatUint(parent.StartTime, 10)}
	}
	kept := startHelper(t, keep, loopArgs(keep, self)...)
	deleted := startHelper(t, gone, loopArgs(gone, self)...)
	dead := startHelper(t, orphan, loopArgs(orphan, ProcRef{PID: self.PID, StartTime: self.StartTime + 1})...)
	require.NoError(t, os.RemoveAll(gone))

	// Wait until the helpers run (their cmdline is readable).
	require.Eventually(t, func() bool {
		loops, err := Sweep([]string{root}, true)
		return err == nil && len(loops) == 3
	}, 10*time.Second, 5*time.Millisecond)

	reports, err := Sweep([]string{root}, false)
	require.NoError(t, err)
	byPID := map[int]SweepReport{}
	for _, r := range reports {
		byPID[r.PID] = r
	}
	require.Equal(t, SweepLeftAlone, byPID[kept.Process.Pid].Action)
	require.Equal(t, SweepTerminated, byPID[deleted.Process.Pid].Action)
	require.True(t, byPID[deleted.Process.Pid].WorkdirGone)
	require.Equal(t, SweepTerminated, byPID[dead.Process.Pid].Action)
	require.Contains(t, byPID[dead.Process.Pid].Reason, "dead")

	// The terminated ones end (exit 0 from the helper's handler, or by the
	// signal if it came before the handler was set up); the kept one runs.
	for _, c := range []*exec.Cmd{deleted, dead} {
		err := c.Wait()
		if err != nil {
			require.Equal(t, syscall.SIGTERM, c.ProcessState.Sys().(syscall.WaitStatus).Signal(), err)
		}
	}
	require.True(t, Alive(ProcRef{PID: kept.Process.Pid}))
}
