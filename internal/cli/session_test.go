package cli

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/heartbeat"
	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func TestSessionClaimComplete(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	dir := t.TempDir()
	self := strconv.Itoa(os.Getpid())

	code, _, errOut := run(t, "tasks", "add", "review", "--server", srv.URL)
	require.Equal(t, 0, code, errOut)

	code, out, errOut := run(t, "tasks", "claim", "review", "--workdir", dir, "--parent-pid", self, "--no-heartbeat", "--json", "--server", srv.URL)
	require.Equal(t, 0, code, errOut)
	var got sessionClaim
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.Equal(t, int64(1), got.TaskID)
	require.Equal(t, int64(1), got.LeaseEpoch)
	require.NotEmpty(t, got.InstanceID)
	require.Nil(t, got.HeartbeatPID)

	st, err := heartbeat.Open(dir)
	require.NoError(t, err)
	is, err := st.ReadInstance()
	require.NoError(t, err)
	require.Equal(t, got.InstanceID, is.InstanceID)
	require.Equal(t, os.Getpid(), is.OwnerPID)
	fi, err := os.Stat(st.Path(heartbeat.InstanceFile))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	_, ok, err := st.Activity()
	require.NoError(t, err)
	require.True(t, ok, "the claim counts as activity")

	// A second claim while holding the task is refused, naming the fix.
	code, _, errOut = run(t, "tasks", "claim", "review", "--workdir", dir, "--parent-pid", self, "--no-heartbeat", "--server", srv.URL)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "already holds task 1")

	code, out, errOut = run(t, "tasks", "complete", "--workdir", dir, "--result", `{"ok":true}`, "--server", srv.URL)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "completed task 1 (epoch 1): now completed")
	_, err = st.ReadTask()
	require.ErrorIs(t, err, heartbeat.ErrNoState)

	code, out, _ = run(t, "tasks", "show", "1", "--json", "--server", srv.URL)
	require.Equal(t, 0, code)
	var task vigiltype.Task
	require.NoError(t, json.Unmarshal([]byte(out), &task))
	require.Equal(t, vigiltype.TaskCompleted, task.Status)
	require.JSONEq(t, `{"ok":true}`, string(task.Result))

	// The next claim reuses the session instance.
	code, _, errOut = run(t, "tasks", "add", "review", "--server", srv.URL)
	require.Equal(t, 0, code, errOut)
	code, out, errOut = run(t, "tasks", "claim", "review", "--workdir", dir, "--parent-pid", self, "--no-heartbeat", "--json", "--server", srv.URL)
	require.Equal(t, 0, code, errOut)
	var again sessionClaim
	require.NoError(t, json.Unmarshal([]byte(out), &again))
	require.Equal(t, got.InstanceID, again.InstanceID)

	code, _, errOut = run(t, "tasks", "fail", "--workdir", dir, "--server", srv.URL)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "--error is required")
	code, out, errOut = run(t, "tasks", "fail", "--workdir", dir, "--error", "tests broke", "--server", srv.URL)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "failed task 2")

	// Nothing claimable: exit 3, and the session instance is marked exited
	// (issue #12: every CLI path that registers an instance ends it on
	// every way out).
	code, _, errOut = run(t, "tasks", "claim", "nothing", "--workdir", dir, "--parent-pid", self, "--no-heartbeat", "--server", srv.URL)
	require.Equal(t, exitNotFound, code, errOut)
	require.Contains(t, errOut, "no claimable task")
	is, err = st.ReadInstance()
	require.NoError(t, err)
	p, err := srv.Liveness.Get(t.Context(), is.InstanceID)
	require.NoError(t, err)
	require.NotNil(t, p.ExitedAt, "the session instance is marked exited")

	code, _, errOut = run(t, "tasks", "release", "--workdir", dir, "--server", srv.URL)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "holds no task")
}

func TestSessionFlagErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"tasks", "claim", "x"}, "--workdir is required"},
		{[]string{"tasks", "claim", "--workdir", dir}, "give a task TYPE to claim, or --id ID"},
		{[]string{"tasks", "claim", "x", "--id", "3", "--workdir", dir}, "--id claims one task"},
		{[]string{"tasks", "claim", "x", "--workdir", filepath.Join(dir, "missing")}, "--workdir"},
		{[]string{"tasks", "claim", "x", "--workdir", dir, "--interval", "0s"}, "--interval must be"},
		{[]string{"tasks", "claim", "x", "--workdir", dir, "--parent-pid", "999999999"}, "--parent-pid"},
		{[]string{"tasks", "complete", "--workdir", dir}, "no session instance"},
		{[]string{"tasks", "complete", "--workdir", dir, "--result", "{bad"}, "--result: must be valid JSON"},
		{[]string{"heartbeat", "spawn", "--workdir", dir}, "no session instance"},
		{[]string{"heartbeat", "spawn"}, "--workdir is required"},
		{[]string{"heartbeat", "spawn", "--workdir", dir, "--staleness", "-1s"}, "--staleness must be"},
		{[]string{"heartbeat", "kill", "--workdir", dir, "--grace", "0s"}, "--grace must be positive"},
		{[]string{"heartbeat", "versions", "--window", "0s"}, "--window must be"},
		{[]string{"run", "--workdir", dir, "true"}, "put the command after --"},
		{[]string{"run", "--workdir", dir, "--claim", "a", "--id", "2", "--", "true"}, "--claim and --id exclude each other"},
		{[]string{"run", "--", "true"}, "--workdir is required"},
		{[]string{"watchdog", "--root", ""}, "--root must not be empty"},
	} {
		code, _, errOut := run(t, tc.args...)
		require.NotEqual(t, 0, code, tc.args)
		require.Contains(t, errOut, tc.want, tc.args)
	}
}

func TestTouchActivityAndStatus(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	st, err := heartbeat.Open(dir)
	require.NoError(t, err)

	// No .vigil/: left alone, exit 0 (a hook installed everywhere is harmless).
	code, _, errOut := run(t, "touch-activity", "--workdir", dir)
	require.Equal(t, 0, code, errOut)
	_, err = os.Stat(st.Dir())
	require.ErrorIs(t, err, os.ErrNotExist)

	code, _, errOut = run(t, "touch-activity", "--workdir", dir, "--create")
	require.Equal(t, 0, code, errOut)
	_, ok, err := st.Activity()
	require.NoError(t, err)
	require.True(t, ok)

	code, out, _ := run(t, "heartbeat", "status", "--workdir", dir, "--json")
	require.Equal(t, exitNotFound, code)
	var hs heartbeatStatus
	require.NoError(t, json.Unmarshal([]byte(out), &hs))
	require.False(t, hs.Running)
	require.NotNil(t, hs.LastActivityAt)

	code, out, errOut = run(t, "heartbeat", "kill", "--workdir", dir)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "no heartbeat loop recorded")
}

func TestSessionClaimByIDAndVersions(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	dir := t.TempDir()
	self := strconv.Itoa(os.Getpid())
	for range 2 {
		code, _, errOut := run(t, "tasks", "add", "review", "--server", srv.URL)
		require.Equal(t, 0, code, errOut)
	}
	code, out, errOut := run(t, "tasks", "claim", "--id", "2", "--workdir", dir, "--parent-pid", self, "--no-heartbeat", "--server", srv.URL)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `task_id\s+2`, out)

	other := t.TempDir()
	code, _, errOut = run(t, "tasks", "claim", "--id", "2", "--workdir", other, "--parent-pid", self, "--no-heartbeat", "--server", srv.URL)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "--id 2: the task is not claimable now")
	code, _, errOut = run(t, "tasks", "claim", "--id", "77", "--workdir", other, "--parent-pid", self, "--no-heartbeat", "--server", srv.URL)
	require.Equal(t, exitNotFound, code)
	require.Contains(t, errOut, "--id 77: no such task")

	code, out, errOut = run(t, "heartbeat", "versions", "--json", "--server", srv.URL)
	require.Equal(t, 0, code, errOut)
	require.JSONEq(t, `{"window_s":86400,"hosts":[],"verdict":{"safe_to_cut_over":false,"hosts":0,"v1_hosts":[],
		"message":"no lease heartbeats in the last 24h0m0s: nothing to judge the cutover by"}}`, out)
	code, out, errOut = run(t, "heartbeat", "versions", "--server", srv.URL)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "HOST")
	require.Contains(t, out, "no lease heartbeats in the last 24h0m0s")

	code, out, errOut = run(t, "tasks", "release", "--workdir", dir, "--json", "--server", srv.URL)
	require.Equal(t, 0, code, errOut)
	var task vigiltype.Task
	require.NoError(t, json.Unmarshal([]byte(out), &task))
	require.Equal(t, vigiltype.TaskScheduled, task.Status)
}

// Claims racing in one workdir: exactly one wins; the others are refused
// before claiming anything, so no task is left held without a loop.
func TestConcurrentClaimsInOneWorkdir(t *testing.T) {
	srv := testserver.Start(t)
	dir := t.TempDir()
	for range 4 {
		code, _, errOut := run(t, "tasks", "add", "race", "--server", srv.URL)
		require.Equal(t, 0, code, errOut)
	}
	parent := exec.Command("sleep", "1000")
	require.NoError(t, parent.Start())
	t.Cleanup(func() { _ = parent.Process.Kill(); _ = parent.Wait() })

	var wg sync.WaitGroup
	codes := make([]int, 4)
	for i := range codes {
		wg.Go(func() {
			codes[i], _, _ = run(t, "tasks", "claim", "race", "--workdir", dir, "--no-heartbeat",
				"--parent-pid", strconv.Itoa(parent.Process.Pid), "--server", srv.URL)
		})
	}
	wg.Wait()
	wins := 0
	for _, c := range codes {
		if c == 0 {
			wins++
		}
	}
	require.Equal(t, 1, wins, "exit codes %v", codes)
	code, out, _ := run(t, "tasks", "ls", "--status", "running", "--json", "--server", srv.URL)
	require.Equal(t, 0, code)
	require.Equal(t, 1, strings.Count(out, `"task_id"`), "one task held, by the winner: %s", out)
}

// vigil run --claim with nothing to claim exits 3 and leaves no instance
// alive: the one it registered for itself is marked exited (issue #12
// case 8; on the old code it stayed alive for its whole alive window).
func TestRunWithNothingToClaimMarksItsInstanceExited(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	for _, args := range [][]string{
		{"--claim", "nothing"},
		{"--id", "99"}, // no such task
	} {
		dir := t.TempDir()
		argv := append([]string{"run", "--workdir", dir}, args...)
		code, _, errOut := run(t, append(argv, "--server", srv.URL, "--", "true")...)
		require.Equal(t, exitNotFound, code, errOut)

		st, err := heartbeat.Open(dir)
		require.NoError(t, err)
		is, err := st.ReadInstance()
		require.NoError(t, err, "the instance vigil run registered is recorded")
		p, err := srv.Liveness.Get(t.Context(), is.InstanceID)
		require.NoError(t, err)
		require.Equal(t, vigiltype.ProcessStopped, p.Status, "%v: the instance must not stay alive", args)
		require.NotNil(t, p.ExitedAt, "%v: marked exited", args)
	}
}
