package vigilclient_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// An agent is a handler function: Run registers the process, keeps its
// liveness row fresh, claims "resize" tasks, renews each lease while the
// handler runs and completes the task with the handler's result. It needs
// a running server (vigil serve), so it has no Output.
func ExampleAgent() {
	agent, err := vigilclient.AgentFromEnv("resizer", map[string]vigilclient.Handler{
		"resize": func(ctx context.Context, t *vigilclient.Task) (any, error) {
			var in struct {
				Path  string `json:"path"`
				Width int    `json:"width"`
			}
			if err := t.DecodePayload(&in); err != nil {
				return nil, err // recorded as a failure; retried after a backoff
			}
			select {
			case <-time.After(time.Second): // the work
			case <-ctx.Done():
				// The lease was lost, the agent was fenced or is stopping.
				return nil, context.Cause(ctx)
			}
			return map[string]any{"path": in.Path, "width": in.Width}, nil
		},
	})
	if err != nil {
		log.Fatal(err) // e.g. VIGIL_RESIZER_POLL_INTERVAL="0": must be a positive duration like 30s
	}
	// SIGINT/SIGTERM: stop claiming, drain, release, record the exit.
	if err := agent.RunWithSignals(context.Background()); err != nil {
		log.Fatal(err)
	}
}

// Settings come from VIGIL_<KIND>_* variables, each with its own default.
func ExampleSettingsFromEnv() {
	os.Setenv("VIGIL_FORK_RESOLUTION_POLL_INTERVAL", "30")
	os.Setenv("VIGIL_FORK_RESOLUTION_LIVENESS_INTERVAL", "15s")
	defer os.Unsetenv("VIGIL_FORK_RESOLUTION_POLL_INTERVAL")
	defer os.Unsetenv("VIGIL_FORK_RESOLUTION_LIVENESS_INTERVAL")

	s, err := vigilclient.SettingsFromEnv("fork-resolution")
	fmt.Println(s.LivenessInterval, s.HeartbeatInterval, s.PollInterval, err)

	os.Setenv("VIGIL_FORK_RESOLUTION_POLL_INTERVAL", "-1")
	_, err = vigilclient.SettingsFromEnv("fork-resolution")
	fmt.Println(err)
	// Output:
	// 15s 1m0s 30s <nil>
	// VIGIL_FORK_RESOLUTION_POLL_INTERVAL="-1": must be a positive duration like 30s
}

// The client alone: register, claim, complete. Every call on a claimed task
// carries its lease epoch; a stale one is refused and changes nothing.
func ExampleClient() {
	ctx := context.Background()
	c, err := vigilclient.New([]string{"http://127.0.0.1:7711"})
	if err != nil {
		log.Fatal(err)
	}
	reg, err := c.RegisterProcess(ctx, vigilclient.RegisterParams{
		ProcessKind: "critic", Hostname: "box1", PID: os.Getpid(), LivenessInterval: 30 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	inst := reg.Instance()
	task, err := c.Claim(ctx, inst, []string{"review"})
	if err != nil || task == nil {
		return // nothing to do
	}
	_, err = c.Complete(ctx, inst.Lease(task), map[string]bool{"ok": true})
	if errors.Is(err, vigiltype.ErrStaleEpoch) {
		fmt.Println("the lease was lost: the task was reclaimed")
	}
	_, _ = c.ProcessExit(ctx, inst)
}
