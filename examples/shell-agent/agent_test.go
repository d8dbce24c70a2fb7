// Package shellagent tests agent.sh, the POSIX sh + curl agent, against a
// real vigil server.
package shellagent

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// syncBuffer collects the script's stderr.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

func TestShellAgent(t *testing.T) {
	for _, tool := range []string{"sh", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("agent.sh needs %s: %v", tool, err)
		}
	}
	ctx := context.Background()
	srv := testserver.Start(t)
	c, err := vigilclient.New([]string{srv.URL})
	require.NoError(t, err)

	task, err := c.Enqueue(ctx, vigilclient.EnqueueParams{TaskType: "echo", Payload: map[string]string{"text": "hello from Go"}})
	require.NoError(t, err)

	cmd := exec.Command("sh", "agent.sh")
	cmd.Env = append(os.Environ(), "VIGIL_URL="+srv.URL, "VIGIL_SHELL_LIVENESS_INTERVAL=1", "VIGIL_SHELL_POLL_INTERVAL=1")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Log("agent.sh stderr:\n" + stderr.String())
		}
	})

	var got *vigiltype.Task
	waitFor(t, "the echo task to complete", func() bool {
		got, err = c.GetTask(ctx, task.TaskID)
		require.NoError(t, err)
		return got.Status == vigiltype.TaskCompleted
	})
	var result struct {
		Echo string `json:"echo"`
		PID  int    `json:"pid"`
	}
	require.NoError(t, json.Unmarshal(got.Result, &result))
	require.Equal(t, "hello from Go", result.Echo)
	require.Equal(t, cmd.Process.Pid, result.PID)

	proc, err := c.ProcessStatus(ctx, "shell")
	require.NoError(t, err)
	require.Equal(t, vigiltype.ProcessAlive, proc.Status)
	require.Equal(t, *got.CompletedBy, proc.InstanceID)
	require.Equal(t, cmd.Process.Pid, proc.PID)

	// The background loop heartbeats.
	waitFor(t, "a liveness heartbeat", func() bool {
		p, err := c.GetProcess(ctx, proc.InstanceID)
		require.NoError(t, err)
		return p.LastHeartbeatAt.After(p.StartedAt)
	})

	// TERM: the trap records the exit and the script ends with status 0.
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		exited <- err // for the cleanup
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("agent.sh did not exit on TERM")
	}
	p, err := c.GetProcess(ctx, proc.InstanceID)
	require.NoError(t, err)
	require.Equal(t, vigiltype.ProcessStopped, p.Status)
	require.NotNil(t, p.ExitedAt)
	require.Contains(t, stderr.String(), "completed task")
}
