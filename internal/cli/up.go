package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/vigil-fleet/vigil/internal/auth"
	"github.com/vigil-fleet/vigil/internal/daemon"
	"github.com/vigil-fleet/vigil/internal/events"
	"github.com/vigil-fleet/vigil/internal/liveness"
	"github.com/vigil-fleet/vigil/internal/registry"
	"github.com/vigil-fleet/vigil/internal/supervisor"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// FleetFileDefault is the fleet file `vigil up` reads when --fleet is not given.
const FleetFileDefault = "fleet.yaml"

func newUpCmd() *cobra.Command {
	var (
		f  serverFlags
		sf supervisorFlags
	)
	var caFile string // --ca-file: passed to the agents as VIGIL_CA_FILE
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

On an SQLite store one vigil up runs per database: a second one is refused
(a lock file beside the database, DB.up.lock), as it would run every agent
twice. On PostgreSQL run one vigil up (or vigil supervise) per host and fleet.

Only the fleet file's agents are launched. With --allow-registered-launch
an agent registered later whose config asks this host to run a command
({"launch": {"host", "command", "env", "dir"}}) is launched too, when an
operator token wrote that config; any other such record gets a
launch_failure event saying why it was not launched (docs/security.md).

The agents get VIGIL_TOKEN_FILE: the --agent-token-file when given (they
send its first token, with the agent role), else the --token-file.

Ctrl-C (or SIGTERM) stops every agent — SIGTERM to its process group, then
SIGKILL after --stop-grace — and then the server. On Linux this includes
descendants that left the group (setsid, double fork): vigil adopts them as
child subreaper and tracks each launch by an environment marker (DESIGN S3).

Fleet file:
  agents:
    - name: worker-1                       # also its VIGIL_KIND
      command: ["go", "run", "./examples/worker"]
      env: {VIGIL_WORKER_1_LIVENESS_INTERVAL: "5s"}
      dir: ".."                            # relative to the fleet file
      startup_timeout: 60s                 # optional: kill it if it has not registered by then

With --tls-cert and --tls-key the server speaks HTTPS (see 'vigil serve
--help') and the agents get VIGIL_URL=https://127.0.0.1:PORT, so the
certificate must name 127.0.0.1 (or the listen address) — or set VIGIL_URL
in the agent's env. When a private CA signed it, give that CA with --ca-file:
the agents get it as VIGIL_CA_FILE. SIGHUP re-reads the certificate pair.`,
		Example: `  vigil up --fleet examples/fleet.yaml
  vigil up --fleet fleet.yaml --db /var/lib/vigil/vigil.db --backoff-min 1s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, logger, err := f.config(cmd)
			if err != nil {
				return err
			}
			fleet, err := sf.load(cmd, defaultLogDir(cfg.DB))
			if err != nil {
				return err
			}
			if !daemon.IsPostgresURL(cfg.DB) {
				unlock, err := lockFleet(cfg.DB)
				if err != nil {
					return err
				}
				defer unlock()
			}
			extraEnv, err := agentTokenEnv(f.tokenFile, f.agentToken)
			if err != nil {
				return err
			}
			if caFile != "" {
				abs, err := filepath.Abs(caFile)
				if err != nil {
					return fmt.Errorf("--ca-file: %w", err)
				}
				extraEnv["VIGIL_CA_FILE"] = abs
			}
			ctx := cmd.Context()
			d, err := daemon.New(ctx, cfg)
			if err != nil {
				return err
			}
			extraEnv["VIGIL_URL"] = d.URL()
			defer reloadTLSOnHangup(d, cfg)()
			if sf.allowRegistered && cfg.TokenFile == "" {
				logger.Warn("--allow-registered-launch on a server without token files: every program that can reach it is the operator and may register a command to run here")
			}
			runner := &fleetRunner{sf: &sf, cmd: cmd, host: hostname(), logger: logger, events: eventRecorder{d.Events},
				config: func(f *supervisor.Fleet) supervisor.Config {
					c := sf.config(cmd, f, extraEnv, logger, eventRecorder{d.Events}, d.Lease,
						desiredFrom{agent: d.Registry.Get, plannedStop: d.Events.ActivePlannedStop}, func(ctx context.Context, kind, host string, within time.Duration) ([]*vigiltype.Process, error) {
							procs, _, err := d.Liveness.List(ctx, liveness.ListParams{Kind: kind, Host: host, StartedWithin: within, Limit: registeredPage})
							return procs, err
						}, d.Liveness.Get)
					c.Restarted, c.StallKilled = d.Metrics.Restarted, d.Metrics.StallKilled // vigil_restarts_total, vigil_stall_kills_total
					c.ApprovalCheckFailed = d.Metrics.ApprovalCheckFailed                   // vigil_stall_approval_check_failures_total
					return c
				},
				list: func(ctx context.Context) ([]vigiltype.Agent, error) {
					list, err := d.Registry.List(ctx)
					out := make([]vigiltype.Agent, len(list))
					for i, a := range list {
						out[i] = *a
					}
					return out, err
				},
			}
			sup, err := supervisor.New(runner.config(fleet))
			if err != nil {
				_ = d.Stop()
				return err
			}
			// The fleet's agents not in the registry yet are registered, so
			// the registry says what this host is meant to run.
			err = registerFleet(ctx, fleet, func(ctx context.Context, name string) (bool, error) {
				return found(d.Registry.Get(ctx, name))
			}, func(ctx context.Context, name, function string) error {
				// The server's own write, for the operator who started it.
				_, err := d.Registry.Register(ctx, registry.RegisterParams{Name: name, Function: function, WrittenBy: string(auth.RoleOperator)})
				return err
			})
			if err != nil {
				_ = d.Stop()
				return err
			}
			d.Start(ctx)
			logger.Info("supervising fleet", "fleet", sf.fleetPath, "agents", len(fleet.Agents))
			supErr := runner.run(ctx, sup, fleetNames(fleet))
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
	sf.register(cmd.Flags())
	cmd.Flags().StringVar(&caFile, "ca-file", os.Getenv("VIGIL_CA_FILE"),
		"with --tls-cert: the PEM CA certificate that signed it, given to the agents as VIGIL_CA_FILE (env VIGIL_CA_FILE)")
	return cmd
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
	p := events.RecordParams{
		Agent: e.Agent, Kind: e.Kind, ExitCode: e.ExitCode, Signal: e.Signal,
		RunDurationMS: e.RunDuration.Milliseconds(), StderrTail: e.StderrTail, Detail: detail,
	}
	if !e.Launched.IsZero() {
		age := max(0, time.Since(e.Launched).Milliseconds())
		p.LaunchAgeMS = &age
	}
	_, err := r.svc.Record(ctx, p)
	return err
}
