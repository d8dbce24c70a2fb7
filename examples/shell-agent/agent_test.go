// Package shellagent tests agent.sh, the POSIX sh + curl agent, against a
// real vigil server.
package shellagent

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/lease"
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

// agent is a running agent.sh.
type agent struct {
	cmd    *exec.Cmd
	exited chan error
	stderr *syncBuffer
}

// startAgent runs agent.sh against url until the test ends.
func startAgent(t *testing.T, url string) *agent {
	t.Helper()
	for _, tool := range []string{"sh", "curl", "awk"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("agent.sh needs %s: %v", tool, err)
		}
	}
	a := &agent{cmd: exec.Command("sh", "agent.sh"), exited: make(chan error, 1), stderr: &syncBuffer{}}
	a.cmd.Env = append(os.Environ(), "VIGIL_URL="+url, "VIGIL_SHELL_LIVENESS_INTERVAL=1", "VIGIL_SHELL_POLL_INTERVAL=1")
	a.cmd.Stderr = a.stderr
	require.NoError(t, a.cmd.Start())
	go func() { a.exited <- a.cmd.Wait() }()
	t.Cleanup(func() {
		_ = a.cmd.Process.Kill()
		<-a.exited
		if t.Failed() {
			t.Log("agent.sh stderr:\n" + a.stderr.String())
		}
	})
	return a
}

// requireLogLines checks that every line the agent logged is a whole log line
// (no stray empty lines, say from a response body's trailing newline).
func (a *agent) requireLogLines(t *testing.T) {
	t.Helper()
	out := a.stderr.String()
	require.True(t, strings.HasSuffix(out, "\n"), "stderr does not end with a newline: %q", out)
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		require.Contains(t, line, " agent.sh[", "stray log line %q in:\n%s", line, out)
	}
}

// postTask enqueues a task from a raw JSON body, as curl would.
func postTask(t *testing.T, url, body string) int64 {
	t.Helper()
	resp, err := http.Post(url+"/v1/tasks", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	var task vigiltype.Task
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&task))
	return task.TaskID
}

func TestShellAgent(t *testing.T) {
	ctx := context.Background()
	srv := testserver.Start(t)
	c, err := vigilclient.New([]string{srv.URL})
	require.NoError(t, err)

	// Each task's text must come back unchanged as the result's echo: JSON
	// escapes in the payload are decoded and the text escaped again for the
	// result.
	texts := []string{
		"hello from Go",
		`he said "hi"`,
		`back\slash, C:\dir\, \\server\share, a trailing backslash \`,
		`escapes written out: \" \n \t \u0041 \\`,
		"two\nlines, a\ttab, a CR\r\nand a trailing newline\n\n",
		"control chars \x01 \x08 \x0c \x1f, HTML <&> and non-ASCII: héllo ☃ 😀",
		"",
	}
	want := map[int64]string{}
	for _, text := range texts {
		task, err := c.Enqueue(ctx, vigilclient.EnqueueParams{TaskType: "echo", Payload: map[string]string{"text": text}})
		require.NoError(t, err)
		want[task.TaskID] = text
	}
	// The curl example: `\"` in a raw body.
	want[postTask(t, srv.URL, `{"task_type":"echo","payload":{"text":"he said \"hi\""}}`)] = `he said "hi"`
	// Only payload.text is echoed, and task_id and lease_epoch are read from
	// the task, not from the payload.
	want[postTask(t, srv.URL, `{"task_type":"echo","payload":{"task_id":99,"lease_epoch":99,"x":{"text":"no"},"text":"it's \u201cquoted\u201d \ud83d\ude00"}}`)] = "it's “quoted” 😀"

	a := startAgent(t, srv.URL)

	var result struct {
		Echo string `json:"echo"`
		PID  int    `json:"pid"`
	}
	var got *vigiltype.Task
	for id, text := range want {
		waitFor(t, "the echo task to complete", func() bool {
			got, err = c.GetTask(ctx, id)
			require.NoError(t, err)
			return got.Status == vigiltype.TaskCompleted
		})
		require.NoError(t, json.Unmarshal(got.Result, &result), "task %d result %s", id, got.Result)
		require.Equal(t, text, result.Echo, "task %d", id)
		require.Equal(t, a.cmd.Process.Pid, result.PID)
	}

	proc, err := c.ProcessStatus(ctx, "shell")
	require.NoError(t, err)
	require.Equal(t, vigiltype.ProcessAlive, proc.Status)
	require.Equal(t, *got.CompletedBy, proc.InstanceID)
	require.Equal(t, a.cmd.Process.Pid, proc.PID)

	// The background loop heartbeats.
	waitFor(t, "a liveness heartbeat", func() bool {
		p, err := c.GetProcess(ctx, proc.InstanceID)
		require.NoError(t, err)
		return p.LastHeartbeatAt.After(p.StartedAt)
	})

	// TERM: the trap records the exit and the script ends with status 0.
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-a.exited:
		a.exited <- err // for the cleanup
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("agent.sh did not exit on TERM")
	}
	p, err := c.GetProcess(ctx, proc.InstanceID)
	require.NoError(t, err)
	require.Equal(t, vigiltype.ProcessStopped, p.Status)
	require.NotNil(t, p.ExitedAt)
	require.Contains(t, a.stderr.String(), "completed task")
	require.NotContains(t, a.stderr.String(), "failed")
	a.requireLogLines(t)
}

// TestShellAgentFailsTaskWhenCompleteRefused: a complete refused with a 4xx
// other than 409 is followed by fail, so the task is not left running until
// its lease expires. Here the server really refuses it: the payload is as
// large as a payload may be, and the echo result, which carries the whole
// text plus the pid, is over that same limit (400 invalid).
func TestShellAgentFailsTaskWhenCompleteRefused(t *testing.T) {
	ctx := context.Background()
	srv := testserver.Start(t)
	c, err := vigilclient.New([]string{srv.URL})
	require.NoError(t, err)

	const head, tail = `{"text":"`, `"}`
	payload := head + strings.Repeat("x", lease.PayloadMaxBytes-len(head)-len(tail)) + tail
	require.Len(t, payload, lease.PayloadMaxBytes)
	id := postTask(t, srv.URL, `{"task_type":"echo","max_attempts":1,"payload":`+payload+`}`)
	a := startAgent(t, srv.URL)

	var got *vigiltype.Task
	waitFor(t, "the task to be failed", func() bool {
		got, err = c.GetTask(ctx, id)
		require.NoError(t, err)
		return got.Status == vigiltype.TaskDeadLetter
	})
	require.Equal(t, 1, got.Attempts)
	require.NotNil(t, got.LastError)
	require.Contains(t, *got.LastError, "complete refused: HTTP 400 invalid: result")
	waitFor(t, "the fail to be logged", func() bool { return strings.Contains(a.stderr.String(), "failed task") })
	require.Contains(t, a.stderr.String(), "complete refused: HTTP 400")
	a.requireLogLines(t)
}
