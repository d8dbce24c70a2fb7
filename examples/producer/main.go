// Command producer enqueues a "sleep" task for examples/worker, with a
// random 1–5 seconds, every VIGIL_PRODUCER_EVERY (default 3s; a Go duration
// or plain seconds). It keeps its own liveness row too: it runs a
// vigilclient.Agent with no handlers, which registers, ticks and records
// its exit, and enqueues through that agent's client.
//
// Configuration, from the environment: VIGIL_KIND (default "producer"),
// VIGIL_PRODUCER_EVERY, and VIGIL_URL, VIGIL_TOKEN_FILE, VIGIL_CA_FILE,
// VIGIL_<KIND>_LIVENESS_INTERVAL as read by vigilclient.AgentFromEnv.
// SIGINT/SIGTERM stop it.
package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/vigil-fleet/vigil/vigilclient"
)

// EveryDefault is the enqueue period when VIGIL_PRODUCER_EVERY is unset.
const EveryDefault = 3 * time.Second

func main() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, logger); err != nil {
		logger.Error("producer stopped", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, logger *slog.Logger) error {
	every := EveryDefault
	if raw := os.Getenv("VIGIL_PRODUCER_EVERY"); raw != "" {
		d, err := vigilclient.ParseInterval(raw)
		if err != nil {
			return fmt.Errorf("VIGIL_PRODUCER_EVERY=%q: must be a positive duration like 3s", raw)
		}
		every = d
	}
	agent, err := vigilclient.AgentFromEnv(cmp.Or(os.Getenv("VIGIL_KIND"), "producer"), nil)
	if err != nil {
		return err
	}
	agent.Logger = logger

	agentDone := make(chan error, 1)
	go func() { agentDone <- agent.Run(ctx) }()

	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case err := <-agentDone:
			return err // nil after ctx was cancelled; an error if registration was refused
		case <-ticker.C:
			seconds := 1 + rand.IntN(5)
			ectx, cancel := context.WithTimeout(ctx, every)
			task, err := agent.Client.Enqueue(ectx, vigilclient.EnqueueParams{
				TaskType: "sleep", Payload: map[string]int{"seconds": seconds},
			})
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					logger.Warn("enqueue failed", "err", err)
				}
				continue
			}
			logger.Info("enqueued", "task_id", task.TaskID, "task_type", task.TaskType, "seconds", seconds)
		}
	}
}
