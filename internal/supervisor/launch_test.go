//go:build linux

package supervisor

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// launchedCmd starts argv in its own process group, the way the supervisor
// does. If ready is set, spawn returns only once the process has printed its
// first line (so that it has, say, installed a trap), which it records.
type launchedCmd struct {
	cmd       *exec.Cmd
	firstLine string
}

func (c *launchedCmd) spawn(t *testing.T, ready bool, argv ...string) func() (*os.Process, error) {
	return func() (*os.Process, error) {
		t.Helper()
		c.cmd = exec.Command(argv[0], argv[1:]...)
		c.cmd.SysProcAttr = groupSysProcAttr()
		var out *bufio.Reader
		if ready {
			r, err := c.cmd.StdoutPipe()
			require.NoError(t, err)
			out = bufio.NewReader(r)
		}
		if err := c.cmd.Start(); err != nil {
			return nil, err
		}
		pgid := c.cmd.Process.Pid
		t.Cleanup(func() { // a no-op after a rollback, but for the reaping
			_ = killGroup(pgid)
			_ = c.cmd.Wait()
			reapGroupZombies(t, pgid)
		})
		if ready {
			line, err := out.ReadString('\n')
			require.NoError(t, err, "reading the first line of %q", argv)
			c.firstLine = strings.TrimSpace(line)
		}
		return c.cmd.Process, nil
	}
}

// waitStatus waits for (reaps) the command and returns its status.
func (c *launchedCmd) waitStatus(t *testing.T) syscall.WaitStatus {
	t.Helper()
	_ = c.cmd.Wait() // an error when killed by a signal
	require.NotNil(t, c.cmd.ProcessState)
	return c.cmd.ProcessState.Sys().(syscall.WaitStatus)
}

// reapGroupZombies reaps the zombies of group pgid reparented to this test
// process (the subreaper), such as a shell's killed children.
func reapGroupZombies(t *testing.T, pgid int) {
	t.Helper()
	procs, err := listProcs()
	require.NoError(t, err)
	for _, p := range procs {
		if p.pgid == pgid && !p.live() && p.ppid == os.Getpid() {
			requireGone(t, p.pid)
		}
	}
}

// requireExitedUnreaped checks that pid has exited but is still waiting for
// its parent (this test) to reap it: RegisterAndLaunch never reaps.
func requireExitedUnreaped(t *testing.T, pid int) {
	t.Helper()
	st, ok := readLaunchProcStat(pid)
	require.True(t, ok, "process %d was reaped", pid)
	require.Equal(t, byte('Z'), st.state, "process %d is still running", pid)
}

func shortWaits() []LaunchOption {
	return []LaunchOption{WithTerminateWait(testTimeout), WithKillWait(testTimeout)}
}

var errRegister = errors.New("registry write failed")

func TestRegisterAndLaunchRegistersRunningProcess(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	var c launchedCmd
	type key struct{}
	ctx := context.WithValue(context.Background(), key{}, "v")
	var registered *os.Process
	p, err := RegisterAndLaunch(ctx, c.spawn(t, false, "sleep", "1000"),
		func(ctx context.Context, p *os.Process) error {
			require.Equal(t, "v", ctx.Value(key{}))
			requireRunning(t, p.Pid) // spawned before the record is written
			registered = p
			return nil
		}, shortWaits()...)
	require.NoError(t, err)
	require.Same(t, c.cmd.Process, p)
	require.Same(t, p, registered)
	requireRunning(t, p.Pid)
}

func TestRegisterAndLaunchRollsBackOnRegisterFailure(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	var c launchedCmd
	p, err := RegisterAndLaunch(context.Background(), c.spawn(t, false, "sleep", "1000"),
		func(context.Context, *os.Process) error { return errRegister }, shortWaits()...)
	require.ErrorIs(t, err, errRegister)
	require.Len(t, unwrapAll(err), 1, "only the registration error: %v", err)
	require.Same(t, c.cmd.Process, p)
	pid := p.Pid
	requireExitedUnreaped(t, pid)
	require.Equal(t, syscall.SIGTERM, c.waitStatus(t).Signal())
	requireGone(t, pid)
}

func TestRegisterAndLaunchRollbackStopsWholeGroup(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	var c launchedCmd
	p, err := RegisterAndLaunch(context.Background(),
		c.spawn(t, true, "sh", "-c", "sleep 1000 & echo $!; wait"),
		func(context.Context, *os.Process) error { return errRegister }, shortWaits()...)
	require.ErrorIs(t, err, errRegister)
	child, convErr := strconv.Atoi(c.firstLine)
	require.NoError(t, convErr)
	requireExitedUnreaped(t, p.Pid)
	if st, ok := readLaunchProcStat(child); ok {
		require.False(t, st.live(), "the leader's child %d is still running", child)
	}
	require.Equal(t, syscall.SIGTERM, c.waitStatus(t).Signal())
	requireGone(t, child) // reparented to this test process, or reaped by sh
}

func TestRegisterAndLaunchKillsProcessIgnoringSIGTERM(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	const terminateWait = 100 * time.Millisecond
	var c launchedCmd
	begin := time.Now()
	p, err := RegisterAndLaunch(context.Background(),
		c.spawn(t, true, "sh", "-c", `trap "" TERM; echo ready; while :; do sleep 1; done`),
		func(context.Context, *os.Process) error { return errRegister },
		WithTerminateWait(terminateWait), WithKillWait(testTimeout))
	elapsed := time.Since(begin)
	require.ErrorIs(t, err, errRegister)
	require.Len(t, unwrapAll(err), 1, "still running after SIGTERM is no rollback error: %v", err)
	require.Equal(t, "ready", c.firstLine)
	require.GreaterOrEqual(t, elapsed, terminateWait, "SIGKILL came before TerminateWait")
	requireExitedUnreaped(t, p.Pid)
	require.Equal(t, syscall.SIGKILL, c.waitStatus(t).Signal())
}

func TestRegisterAndLaunchRollbackWhileCallerWaits(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	// The caller reaps the process itself as soon as it exits: the rollback
	// must see it gone (os.ErrProcessDone), not wait out TerminateWait.
	var c launchedCmd
	waited := make(chan syscall.WaitStatus, 1)
	spawn := c.spawn(t, false, "sleep", "1000")
	begin := time.Now()
	p, err := RegisterAndLaunch(context.Background(),
		func() (*os.Process, error) {
			p, err := spawn()
			if err == nil {
				cmd := c.cmd
				go func() {
					_ = cmd.Wait() // an error when killed by a signal
					waited <- cmd.ProcessState.Sys().(syscall.WaitStatus)
				}()
			}
			return p, err
		},
		func(context.Context, *os.Process) error { return errRegister },
		WithTerminateWait(time.Hour), WithKillWait(time.Hour))
	require.ErrorIs(t, err, errRegister)
	require.Less(t, time.Since(begin), testTimeout)
	require.Equal(t, syscall.SIGTERM, recv(t, waited, "the caller's Wait").Signal())
	requireGone(t, p.Pid)
}

func TestRegisterAndLaunchSpawnFailure(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	errSpawn := errors.New("exec failed")
	p, err := RegisterAndLaunch(context.Background(),
		func() (*os.Process, error) { return nil, errSpawn },
		func(context.Context, *os.Process) error {
			t.Error("register called after a failed spawn")
			return nil
		})
	require.ErrorIs(t, err, errSpawn)
	require.Nil(t, p)

	// A real exec failure, too.
	var c launchedCmd
	p, err = RegisterAndLaunch(context.Background(),
		c.spawn(t, false, "/nonexistent/vigil-agent"),
		func(context.Context, *os.Process) error {
			t.Error("register called after a failed spawn")
			return nil
		})
	require.ErrorIs(t, err, os.ErrNotExist)
	require.Nil(t, p)
}

func TestRegisterAndLaunchCancelledContext(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p, err := RegisterAndLaunch(ctx,
		func() (*os.Process, error) {
			t.Error("spawn called with a cancelled context")
			return nil, nil
		},
		func(context.Context, *os.Process) error {
			t.Error("register called with a cancelled context")
			return nil
		})
	require.ErrorIs(t, err, context.Canceled)
	require.Nil(t, p)
}

func TestRegisterAndLaunchJoinsRollbackFailure(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	// A register that releases the process makes it unsignallable: the
	// rollback fails, and says so without hiding the registration error.
	var c launchedCmd
	var pid int
	p, err := RegisterAndLaunch(context.Background(), c.spawn(t, false, "sleep", "1000"),
		func(_ context.Context, p *os.Process) error {
			pid = p.Pid
			require.NoError(t, p.Release())
			return errRegister
		}, shortWaits()...)
	require.ErrorIs(t, err, errRegister)
	require.ErrorContains(t, err, "already released")
	require.ErrorContains(t, err, "roll back launch of process "+strconv.Itoa(pid))
	require.NotNil(t, p)
	requireRunning(t, pid) // left for the cleanup: the rollback could not reach it
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	// The released handle cannot Wait; reap by pid.
	var ws syscall.WaitStatus
	_, werr := syscall.Wait4(pid, &ws, 0, nil)
	require.NoError(t, werr)
	require.Equal(t, syscall.SIGKILL, ws.Signal())
}

func TestLaunchOptionsDefaults(t *testing.T) {
	require.Equal(t, 10*time.Second, DefaultTerminateWait)
	require.Equal(t, 10*time.Second, DefaultKillWait)
}

// unwrapAll returns the leaves of err's tree that are not themselves
// wrappers, for counting how many errors were joined.
func unwrapAll(err error) []error {
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		var out []error
		for _, e := range u.Unwrap() {
			out = append(out, unwrapAll(e)...)
		}
		return out
	case interface{ Unwrap() error }:
		return unwrapAll(u.Unwrap())
	default:
		return []error{err}
	}
}
