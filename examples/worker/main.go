// Command worker is a vigil agent written on the Go SDK (package
// vigilclient). It handles "sleep" tasks with payload
//
//	{"seconds": N, "ignore_cancel": false}
//
// by sleeping N seconds, and completes each with
//
//	{"slept_s": N, "instance_id": "<its instance id>", "pid": <its pid>}
//
// The sleep ends early when the handler's context is cancelled (lease lost,
// fenced, or the worker stopping past its drain grace) unless ignore_cancel
// is set, which shows what the runtime does with a handler that will not
// stop.
//
// Configuration, from the environment (flags override):
//
//	VIGIL_KIND         -kind        process kind (default "worker")
//	VIGIL_CRASH_PROB   -crash-prob  0..1 (default 0): the chance that the
//	                                worker exits with status 3 right after
//	                                claiming a task, leaving it to be reclaimed
//	VIGIL_URL, VIGIL_TOKEN_FILE, VIGIL_CA_FILE, VIGIL_<KIND>_{LIVENESS,HEARTBEAT,POLL}_INTERVAL
//	                                as read by vigilclient.AgentFromEnv
//
// It logs to stderr (slog text): "claimed", "completed", "lease lost",
// each with task_id. SIGINT/SIGTERM stop it cleanly.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/vigil-fleet/vigil/vigilclient"
)

func main() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(context.Background(), os.Args[1:], logger); err != nil {
		logger.Error("worker stopped", "err", err)
		os.Exit(1)
	}
}

// config is the worker's own configuration; the agent's comes from
// vigilclient.AgentFromEnv.
type config struct {
	kind      string
	crashProb float64
}

func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kind := fs.String("kind", cmp.Or(getenv("VIGIL_KIND"), "worker"), "process kind (env VIGIL_KIND)")
	crash := fs.String("crash-prob", cmp.Or(getenv("VIGIL_CRASH_PROB"), "0"),
		"chance, 0..1, of exiting with status 3 right after claiming a task (env VIGIL_CRASH_PROB)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	p, err := strconv.ParseFloat(*crash, 64)
	if err != nil || math.IsNaN(p) || p < 0 || p > 1 {
		return config{}, fmt.Errorf("VIGIL_CRASH_PROB=%q: must be a number from 0 to 1", *crash)
	}
	return config{kind: *kind, crashProb: p}, nil
}

func run(ctx context.Context, args []string, logger *slog.Logger) error {
	cfg, err := parseConfig(args, os.Getenv, os.Stderr)
	if err != nil {
		return err
	}
	w := &worker{crashProb: cfg.crashProb, log: logger, exit: os.Exit, roll: rand.Float64}
	agent, err := vigilclient.AgentFromEnv(cfg.kind, map[string]vigilclient.Handler{"sleep": w.sleep})
	if err != nil {
		return err
	}
	agent.Logger = logger
	return agent.RunWithSignals(ctx)
}

// worker holds the sleep handler and its crash knob.
type worker struct {
	crashProb float64
	log       *slog.Logger
	exit      func(code int) // os.Exit
	roll      func() float64 // uniform in [0, 1)
}

type sleepPayload struct {
	Seconds      float64 `json:"seconds"`
	IgnoreCancel bool    `json:"ignore_cancel"`
}

type sleepResult struct {
	SleptS     float64 `json:"slept_s"`
	InstanceID string  `json:"instance_id"`
	PID        int     `json:"pid"`
}

// sleep handles one "sleep" task.
func (w *worker) sleep(ctx context.Context, t *vigilclient.Task) (any, error) {
	if w.crashProb > 0 && w.roll() < w.crashProb {
		w.log.Warn("crashing on purpose mid-task (VIGIL_CRASH_PROB)", "task_id", t.TaskID, "crash_prob", w.crashProb)
		w.exit(3)
	}
	var p sleepPayload
	if err := t.DecodePayload(&p); err != nil {
		return nil, err
	}
	if math.IsNaN(p.Seconds) || p.Seconds < 0 || p.Seconds > 86400 {
		return nil, errors.New("payload seconds: must be between 0 and 86400")
	}
	d := time.Duration(p.Seconds * float64(time.Second))
	timer := time.NewTimer(d)
	defer timer.Stop()
	if p.IgnoreCancel {
		<-timer.C
	} else {
		// Sleeping is this worker's work: it reports progress every
		// second, so its lease heartbeats carry activity (v2, DESIGN T4).
		progress := time.NewTicker(time.Second)
		defer progress.Stop()
		t.Activity()
		start := time.Now()
	sleeping:
		for {
			select {
			case <-timer.C:
				break sleeping
			case <-progress.C:
				t.Activity()
			case <-ctx.Done():
				return nil, fmt.Errorf("sleep interrupted after %s: %w", time.Since(start).Round(time.Millisecond), context.Cause(ctx))
			}
		}
	}
	return sleepResult{SleptS: p.Seconds, InstanceID: t.InstanceID, PID: os.Getpid()}, nil
}
