package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/vigil-fleet/vigil/internal/daemon"
	"github.com/vigil-fleet/vigil/internal/events"
	"github.com/vigil-fleet/vigil/internal/registry"
	"github.com/vigil-fleet/vigil/internal/supervisor"
)

// FleetFileDefault is the fleet file `vigil up` reads when --fleet is not given.
const FleetFileDefault = "fleet.yaml"

func newUpCmd() *cobra.Command {
	var (
		f         serverFlags
		fleetPath string
		backoff   supervisor.BackoffPolicy
		stopGrace time.Duration
		flapping  supervisor.FlapPolicy
		logDir    string
		logMax    int64
		logKeep   int
	)
	var stall stallFlags
	cmd := &cobra.Command{
		Use:     "up",
		GroupID: "server",
		Short:   "Run the server and supervise a fleet of agents in one process",
		Long: `Run the vigil server (as 'vigil serve') and launch every agent of a fleet
file as a child in its own process group, with VIGIL_URL pointing at this
server and VIGIL_KIND set to the agent's name. Every exit, code 0 included, is
followed by a restart after a backoff (DESIGN S1–S2): 5s, doubled while runs
last under 30s, capped at 300s, back to 5s after a run of 30s or more.

Restart delays are jittered (--backoff-jitter), so agents failing together
do not restart in lockstep. An agent exiting --flap-exits times within
--flap-window is recorded as flapping (one event per episode), however long
each run lasted. Each agent's output also goes to <--log-dir>/<agent>.log,
rotated by size; 'vigil logs AGENT' prints it.

Ctrl-C (or SIGTERM) stops every agent — SIGTERM to its process group, then
SIGKILL after --stop-grace — and then the server. On Linux this includes
descendants that left the group (setsid, double fork): vigil adopts them as
child subreaper and tracks each launch by an environment marker (DESIGN S3).

Fleet file:
  agents:
    - name: worker-1                       # also its VIGIL_KIND
      command: ["go", "run", "./examples/worker"]
      env: {VIGIL_WORKER_1_LIVENESS_INTERVAL: "5s"}
      dir: ".."                            # relative to the fleet file`,
		Example: `  vigil up --fleet examples/fleet.yaml
  vigil up --fleet fleet.yaml --db /var/lib/vigil/vigil.db --backoff-min 1s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, logger, err := f.config(cmd)
			if err != nil {
				return err
			}
			if err := stall.check(); err != nil {
				return err
			}
			if err := checkBackoff(backoff); err != nil {
				return err
			}
			if backoff.Jitter == 0 {
				backoff.Jitter = supervisor.JitterOff
			}
			if stopGrace <= 0 {
				return fmt.Errorf("--stop-grace must be positive, got %s", stopGrace)
			}
			if flapping.Exits < 2 {
				return fmt.Errorf("--flap-exits must be at least 2, got %d", flapping.Exits)
			}
			if flapping.Window <= 0 {
				return fmt.Errorf("--flap-window must be positive, got %s", flapping.Window)
			}
			if logDir == "" {
				if cmd.Flags().Changed("log-dir") {
					return errors.New("--log-dir must not be empty")
				}
				logDir = defaultLogDir(cfg.DB)
			}
			if logMax < 1024 {
				return fmt.Errorf("--log-max-bytes must be at least 1024, got %d", logMax)
			}
			if logKeep < 1 {
				return fmt.Errorf("--log-keep must be at least 1, got %d", logKeep)
			}
			fleet, err := supervisor.LoadFleet(fleetPath)
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					return fmt.Errorf("--fleet %s: no such file (the bundled example is examples/fleet.yaml)", fleetPath)
				}
				return err // names the file and the field
			}
			extraEnv := map[string]string{}
			if f.tokenFile != "" {
				abs, err := filepath.Abs(f.tokenFile)
				if err != nil {
					return fmt.Errorf("--token-file: %w", err)
				}
				extraEnv["VIGIL_TOKEN_FILE"] = abs
			}
			ctx := cmd.Context()
			d, err := daemon.New(ctx, cfg)
			if err != nil {
				return err
			}
			extraEnv["VIGIL_URL"] = d.URL()
			sup, err := supervisor.New(supervisor.Config{
				Agents: fleet.Agents, ExtraEnv: extraEnv, Backoff: backoff, StopGrace: stopGrace, Flapping: flapping,
				Logger: logger, Stdout: cmd.OutOrStdout(), Stderr: cmd.ErrOrStderr(),
				Events: eventRecorder{d.Events},
				LogDir: logDir, LogMaxBytes: logMax, LogKeep: logKeep,
				Stall: stall.config(d.Lease),
			})
			if err != nil {
				_ = d.Stop()
				return err
			}
			// The fleet's agents are registered (replacing earlier records),
			// so the registry says what this host is meant to run.
			for _, a := range fleet.Agents {
				function := strings.Join(a.Command, " ")
				if len(function) > registry.FunctionMaxLen {
					function = strings.ToValidUTF8(function[:registry.FunctionMaxLen], "")
				}
				if _, err := d.Registry.Register(ctx, registry.RegisterParams{Name: a.Name, Function: function}); err != nil {
					_ = d.Stop()
					return fmt.Errorf("register agent %s: %w", a.Name, err)
				}
			}
			d.Start(ctx)
			logger.Info("supervising fleet", "fleet", fleetPath, "agents", len(fleet.Agents))
			supErr := sup.Run(ctx)
			// The agents are down (they mark their instances exited on the
			// way out); now the server.
			stopErr := d.Stop()
			if supErr != nil && !errors.Is(supErr, context.Canceled) {
				return errors.Join(supErr, stopErr)
			}
			return stopErr
		},
	}
	f.register(cmd.Flags())
	fs := cmd.Flags()
	fs.StringVar(&fleetPath, "fleet", FleetFileDefault, "fleet file (YAML) listing the agents to run")
	fs.DurationVar(&backoff.Min, "backoff-min", supervisor.BackoffMinDefault, "restart delay after an exit (DESIGN S2)")
	fs.DurationVar(&backoff.FastFailure, "backoff-fast-failure", supervisor.FastFailureDefault, "a run shorter than this doubles the next delay")
	fs.DurationVar(&backoff.Max, "backoff-max", supervisor.BackoffMaxDefault, "cap on the restart delay")
	fs.Float64Var(&backoff.Jitter, "backoff-jitter", supervisor.JitterDefault,
		"spread each restart delay d over [d, d+jitter·d] (ending at --backoff-max at the cap), so agents failing together do not restart in lockstep (DESIGN S2); 0 to 1, 0 disables")
	fs.IntVar(&flapping.Exits, "flap-exits", supervisor.FlapExitsDefault,
		"record a flapping event (DESIGN E1) when an agent exits this many times within --flap-window, however long each run; at least 2")
	fs.DurationVar(&flapping.Window, "flap-window", supervisor.FlapWindowDefault, "sliding window for --flap-exits")
	fs.StringVar(&logDir, "log-dir", "",
		"directory for the agents' log files <agent>.log, read by 'vigil logs'; created if missing"+logDirHelp)
	fs.Int64Var(&logMax, "log-max-bytes", supervisor.LogMaxBytesDefault, "rotate an agent's log file when it would pass this size (10 MiB)")
	fs.IntVar(&logKeep, "log-keep", supervisor.LogKeepDefault, "rotated log files kept per agent, besides the current one")
	fs.DurationVar(&stopGrace, "stop-grace", supervisor.StopGraceDefault, "time between SIGTERM and SIGKILL when stopping an agent")
	stall.register(fs)
	return cmd
}

// checkBackoff validates the --backoff-* flags before anything starts.
func checkBackoff(b supervisor.BackoffPolicy) error {
	switch {
	case b.Min <= 0:
		return fmt.Errorf("--backoff-min must be positive, got %s", b.Min)
	case b.FastFailure <= 0:
		return fmt.Errorf("--backoff-fast-failure must be positive, got %s", b.FastFailure)
	case b.Max < b.Min:
		return fmt.Errorf("--backoff-max (%s) must not be below --backoff-min (%s)", b.Max, b.Min)
	case b.Jitter < 0 || b.Jitter > 1:
		return fmt.Errorf("--backoff-jitter must be between 0 and 1, got %g", b.Jitter)
	}
	return nil
}

// eventRecorder writes the supervisor's process events through the
// in-process events service (the same one /v1/events serves).
type eventRecorder struct{ svc *events.Service }

func (r eventRecorder) RecordEvent(ctx context.Context, e supervisor.Event) error {
	var detail json.RawMessage
	if e.Detail != nil {
		raw, err := json.Marshal(e.Detail)
		if err != nil {
			return fmt.Errorf("event detail: %w", err)
		}
		detail = raw
	}
	_, err := r.svc.Record(ctx, events.RecordParams{
		Agent: e.Agent, Kind: e.Kind, ExitCode: e.ExitCode, Signal: e.Signal,
		RunDurationMS: e.RunDuration.Milliseconds(), StderrTail: e.StderrTail, Detail: detail,
	})
	return err
}

// stallFlags are the stall-detection flags (DESIGN S4).
type stallFlags struct {
	after, every    time.Duration
	pendingApproval string
	off             bool
}

func (f *stallFlags) register(fs *pflag.FlagSet) {
	fs.DurationVar(&f.after, "stall-after", supervisor.StallAfterDefault,
		"a task running longer than this is stalled: its agent is killed and restarted, the task taken back (DESIGN S4)")
	fs.DurationVar(&f.every, "stall-check", supervisor.StallCheckDefault, "how often to look for stalled tasks")
	fs.StringVar(&f.pendingApproval, "pending-approval-cmd", "",
		"shell command asked before any stall kill: exit 0 = an approval is pending, kill nothing")
	fs.BoolVar(&f.off, "no-stall-kill", false, "turn stall detection off")
}

func (f *stallFlags) check() error {
	switch {
	case f.after < time.Second:
		return fmt.Errorf("--stall-after must be at least 1s, got %s", f.after)
	case f.every < 10*time.Millisecond:
		return fmt.Errorf("--stall-check must be at least 10ms, got %s", f.every)
	}
	return nil
}

// config is the supervisor's stall configuration over source, nil when off.
func (f *stallFlags) config(source supervisor.StallSource) *supervisor.StallConfig {
	if f.off {
		return nil
	}
	c := &supervisor.StallConfig{Source: source, After: f.after, Every: f.every}
	if f.pendingApproval != "" {
		c.PendingApproval = supervisor.PendingApprovalCommand([]string{"sh", "-c", f.pendingApproval})
	}
	return c
}
