//go:build linux

package supervisor

import (
	"errors"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// zombieSoakEnv sets how long TestSupervisorReapsSetsidChurn keeps its
// agents churning (a Go duration). The ordinary run takes
// zombieSoakDefault; the soak is a minute: VIGIL_ZOMBIE_SOAK=60s.
const zombieSoakEnv = "VIGIL_ZOMBIE_SOAK"

// zombieSoakDefault is the churn's length in the ordinary suite: some 60
// orphans, several crashes of each crashing agent.
const zombieSoakDefault = 4 * time.Second

// zombieLimit is "a handful": the most zombies of this process tolerated
// at any one sample (issue #12, case 4).
const zombieLimit = 5

// churnScript forks, about 10 times a second, a child that calls setsid()
// and exits: each is orphaned at once (setsid -f does not wait) and
// reparented to this subreaper process, in a session and a process group of
// its own, and usually dies before any reaper pass can see it alive.
const churnScript = `while :; do setsid -f true; sleep 0.1; done`

// Issue #12, case 4: an agent whose descendants setsid() and exit about 10
// times a second leaves at most a handful of zombies at any moment, while
// the exit statuses the process waits for itself are still its own: a
// crashing agent's exit code and a killed agent's signal are recorded as
// they were, and a child started beside the supervisor (in a session of its
// own, as the heartbeat loop is) is left for its own Wait.
func TestSupervisorReapsSetsidChurn(t *testing.T) {
	soak := zombieSoakDefault
	if v := os.Getenv(zombieSoakEnv); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, zombieSoakEnv)
		soak = d
	}
	before := map[int]bool{} // zombies left by earlier tests: not this test's to count
	for _, pid := range zombieChildren(t) {
		before[pid] = true
	}

	events := newEventLog()
	b := setup(t, Config{
		Agents: []Agent{
			{Name: "churn", Command: []string{"sh", "-c", churnScript}},
			{Name: "crasher", Command: []string{"sh", "-c",
				`setsid -f true; sleep 0.3; exit 3`}},
			{Name: "killed", Command: []string{"sh", "-c",
				`setsid -f true; sleep 0.3; kill -KILL $$`}},
		},
		Events: events,
	})
	b.run(t)

	// Beside the supervisor, as the heartbeat loop or a pending-approval
	// command would be: children of this process that os/exec waits for,
	// in a session of their own, exiting all the while.
	strangerDone := make(chan struct{})
	var strangers sync.WaitGroup
	var strangerErr error
	var strangerPIDs sync.Map // pid → true: not the supervisor's zombies to count
	strangerRuns := 0
	strangers.Go(func() {
		every := time.NewTicker(50 * time.Millisecond)
		defer every.Stop()
		for {
			select {
			case <-strangerDone:
				return
			case <-every.C:
			}
			cmd := exec.Command("sh", "-c", "exit 7")
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
			err := cmd.Start()
			if err == nil {
				strangerPIDs.Store(cmd.Process.Pid, true)
				err = cmd.Wait()
			}
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 7 {
				strangerErr = errors.Join(strangerErr, err)
				if err == nil {
					strangerErr = errors.Join(strangerErr, errors.New("exit 0, want 7"))
				}
			}
			strangerRuns++
		}
	})

	// Sample the zombies until the soak is over and the churn has shown
	// itself: orphans reaped and both crashing agents' exits recorded.
	minReaped := int(soak / (500 * time.Millisecond)) // 2 a second, of about 10
	end := time.Now().Add(soak)
	giveUp := end.Add(testTimeout)
	sample := time.NewTicker(20 * time.Millisecond)
	defer sample.Stop()
	maxZombies, samples, reaped := 0, 0, 0
	var worst []int
	for {
		<-sample.C
		var now []int
		for _, pid := range zombieChildren(t) {
			if _, stranger := strangerPIDs.Load(pid); !before[pid] && !stranger {
				now = append(now, pid)
			}
		}
		samples++
		if len(now) > maxZombies {
			maxZombies, worst = len(now), now
		}
	drain:
		for {
			select {
			case <-b.sup.testSignals.orphanReaped.ch:
				reaped++
			default:
				break drain
			}
		}
		if time.Now().After(end) && reaped >= minReaped && exitsOf(events, "crasher") >= 2 && exitsOf(events, "killed") >= 2 {
			break
		}
		if time.Now().After(giveUp) {
			break
		}
	}
	close(strangerDone)
	strangers.Wait()
	b.stop(t)
	t.Logf("soak %s: %d samples, at most %d zombies, %d orphans reaped, %d stranger runs",
		soak, samples, maxZombies, reaped, strangerRuns)

	require.LessOrEqual(t, maxZombies, zombieLimit, "zombies of this process at the worst sample: %v", worst)
	require.GreaterOrEqual(t, reaped, minReaped, "orphans reaped by the supervisor in %s", soak)
	require.NoError(t, strangerErr, "a child the supervisor did not start kept its own exit status")
	require.Positive(t, strangerRuns)

	var crashes, kills int
	for _, e := range events.all() {
		if e.Kind == vigiltype.EventFlapping {
			continue // the crashing agents do flap; their exits are what counts
		}
		require.Equal(t, vigiltype.EventExit, e.Kind, "%+v", e)
		switch e.Agent {
		case "crasher":
			require.NotNil(t, e.ExitCode, "crasher: %+v", e)
			require.Equal(t, 3, *e.ExitCode, "crasher: %+v", e)
			require.Empty(t, e.Signal)
			crashes++
		case "killed":
			require.Nil(t, e.ExitCode, "killed: %+v", e)
			require.Equal(t, syscall.SIGKILL.String(), e.Signal)
			kills++
		default:
			t.Errorf("unexpected event %+v", e)
		}
	}
	require.GreaterOrEqual(t, crashes, 2)
	require.GreaterOrEqual(t, kills, 2)

	var left []int
	for _, pid := range zombieChildren(t) {
		if !before[pid] {
			left = append(left, pid)
		}
	}
	require.Empty(t, left, "zombies left after Run returned")
}

// exitsOf counts the exit events of agent.
func exitsOf(events *eventLog, agent string) int {
	n := 0
	for _, e := range events.all() {
		if e.Agent == agent && e.Kind == vigiltype.EventExit {
			n++
		}
	}
	return n
}

// zombieChildren lists this process's children that are zombies, from
// /proc/<pid>/stat.
func zombieChildren(t *testing.T) []int {
	t.Helper()
	procs, err := listProcs()
	require.NoError(t, err)
	self := os.Getpid()
	var pids []int
	for _, p := range procs {
		if p.ppid == self && p.state == 'Z' {
			pids = append(pids, p.pid)
		}
	}
	return pids
}

// The reaper tells a child os/exec waits for by the pidfd os.Process holds
// for it from its start until Wait has reaped it.
func TestPidfdPIDs(t *testing.T) {
	require.True(t, osHoldsPidfds(), "os.Process uses pidfds here (Go 1.23+, Linux 5.4+)")
	cmd := exec.Command("sh", "-c", "exit 7")
	require.NoError(t, cmd.Start())
	pid := cmd.Process.Pid
	waitZombie(t, pid)
	held, err := pidfdPIDs()
	require.NoError(t, err)
	require.Contains(t, held, pid, "held from Start until Wait")
	require.Error(t, cmd.Wait())
	require.Equal(t, 7, cmd.ProcessState.ExitCode())
	held, err = pidfdPIDs()
	require.NoError(t, err)
	require.NotContains(t, held, pid, "released by Wait")
	require.NotContains(t, held, os.Getpid(), "the probe's own pidfd is closed")
}

func TestFdinfoPid(t *testing.T) {
	t.Parallel()
	for info, want := range map[string]int{
		"pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nPid:\t4211\nNSpid:\t4211\n": 4211,
		"pos:\t0\nflags:\t02000002\nPid:\t-1\n":                                          -1, // reaped
		"Pid:\t12":                                                                       12,
	} {
		got, ok := fdinfoPid([]byte(info))
		require.True(t, ok, info)
		require.Equal(t, want, got, info)
	}
	for _, info := range []string{"", "pos:\t0\nflags:\t01\n", "Pid:\tx\n"} {
		_, ok := fdinfoPid([]byte(info))
		require.False(t, ok, info)
	}
	require.True(t, isPidfdLink([]byte("anon_inode:[pidfd]")))
	require.True(t, isPidfdLink([]byte("pidfd:[1057]")))
	require.False(t, isPidfdLink([]byte("anon_inode:[eventfd]")))
	require.False(t, isPidfdLink([]byte("/tmp/pidfd")))
}
