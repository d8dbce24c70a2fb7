package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/vigil-fleet/vigil/internal/supervisor"
	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func newSuperviseCmd() *cobra.Command {
	var (
		cf                  clientFlags
		sf                  supervisorFlags
		logLevel, logFormat string
		serverWait          time.Duration
		agentTokenFile      string
	)
	cmd := &cobra.Command{
		Use:     "supervise",
		GroupID: "server",
		Short:   "Supervise a fleet of agents on this host for a vigil server elsewhere",
		Long: `Run the supervisor of 'vigil up' without a server: launch every agent of a
fleet file on this host, restart each exit with backoff, contain its
descendants, and report to the vigil server at --server — the agents are
registered there on start, exits and launch failures are recorded as process
events, and stalled tasks (--stall-after) are read and taken back there. The
agents get VIGIL_URL set to --server, VIGIL_CA_FILE to --ca-file when given,
and VIGIL_TOKEN_FILE: the --agent-token-file when given, else the
--token-file. The supervisor's own token (--token-file) must be an
operator's when the server has token files: it registers its fleet and
takes stalled tasks back.

Registry records asking this host to launch a command run only with
--allow-registered-launch, and only when an operator token wrote them; the
others get a launch_failure event saying why (docs/security.md).

Use it with a PostgreSQL-backed server shared by several hosts: one 'vigil
serve' (or more) and one 'vigil supervise' per host.`,
		Example: `  vigil supervise --server https://vigil.internal:7711 --fleet /etc/vigil/fleet.yaml --token-file /etc/vigil/token --ca-file /etc/vigil/ca.pem
  vigil supervise --server https://a:7711,https://b:7711 --fleet fleet.yaml --stall-after 45m
  vigil supervise --server https://vigil.internal:7711 --fleet fleet.yaml --token-file /etc/vigil/operator --agent-token-file /etc/vigil/agent --ca-file /etc/vigil/ca.pem`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(cmd, logLevel, logFormat)
			if err != nil {
				return err
			}
			fleet, err := sf.load(cmd, defaultLogDir(""))
			if err != nil {
				return err
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if err := waitForServer(ctx, c, serverWait, logger); err != nil {
				return fmt.Errorf("--server %s: %w", cf.server, err)
			}
			extraEnv, err := agentTokenEnv(cf.tokenFile, agentTokenFile)
			if err != nil {
				return err
			}
			if cf.caFile != "" {
				abs, err := filepath.Abs(cf.caFile)
				if err != nil {
					return fmt.Errorf("--ca-file: %w", err)
				}
				extraEnv["VIGIL_CA_FILE"] = abs
			}
			extraEnv["VIGIL_URL"] = cf.server
			remote := remoteServer{c}
			runner := &fleetRunner{sf: &sf, cmd: cmd, host: hostname(), logger: logger, events: remote,
				config: func(f *supervisor.Fleet) supervisor.Config {
					return sf.config(cmd, f, extraEnv, logger, remote, remote,
						desiredFrom{agent: c.GetAgent, plannedStop: c.ActivePlannedStop}, remote.registered, c.GetProcess)
				},
				list: c.ListAgents,
			}
			sup, err := supervisor.New(runner.config(fleet))
			if err != nil {
				return err
			}
			err = registerFleet(ctx, fleet, func(ctx context.Context, name string) (bool, error) {
				return found(c.GetAgent(ctx, name))
			}, func(ctx context.Context, name, function string) error {
				_, err := c.RegisterAgent(ctx, vigilclient.AgentParams{Name: name, Function: function})
				return err
			})
			if err != nil {
				return err
			}
			logger.Info("supervising fleet", "fleet", sf.fleetPath, "agents", len(fleet.Agents), "server", cf.server)
			return runner.run(ctx, sup, fleetNames(fleet))
		},
	}
	cf.register(cmd)
	_ = cmd.Flags().MarkHidden("json") // nothing to print as JSON
	sf.register(cmd.Flags())
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	cmd.Flags().StringVar(&logFormat, "log-format", "text", "log format: text or json")
	cmd.Flags().StringVar(&agentTokenFile, "agent-token-file", os.Getenv("VIGIL_AGENT_TOKEN_FILE"),
		"file of agent tokens handed to the agents as VIGIL_TOKEN_FILE (they send its first); default: --token-file, "+
			"which the supervisor itself uses and must hold an operator token (it registers its fleet and takes stalled tasks back) "+
			"(env VIGIL_AGENT_TOKEN_FILE)")
	cmd.Flags().DurationVar(&serverWait, "server-wait", time.Minute,
		"keep trying a server that does not answer yet for this long before giving up (0: do not wait)")
	return cmd
}

// serverRetry is how often waitForServer asks again.
const serverRetry = time.Second

// waitForServer returns once the server answers /healthz, or the last error
// after wait (so a supervisor started with its server need not be ordered).
func waitForServer(ctx context.Context, c *vigilclient.Client, wait time.Duration, logger *slog.Logger) error {
	deadline := time.Now().Add(wait)
	for {
		err := c.Health(ctx)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		logger.Warn("server not answering yet; retrying", "err", err, "retry_in", serverRetry)
		t := time.NewTimer(serverRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// remoteServer is the supervisor's event sink and stall source over HTTP.
type remoteServer struct{ c *vigilclient.Client }

func (r remoteServer) RecordEvent(ctx context.Context, e supervisor.Event) error {
	var detail any
	if e.Detail != nil {
		detail = e.Detail
	}
	_, err := r.c.RecordEvent(ctx, vigilclient.EventParams{
		Agent: e.Agent, Kind: e.Kind, ExitCode: e.ExitCode, Signal: e.Signal,
		RunDuration: e.RunDuration, StderrTail: e.StderrTail, Detail: detail, Launched: e.Launched,
	})
	return err
}

// registered lists the instances of kind on host registered within the
// last `within` on the server's clock (the startup check).
func (r remoteServer) registered(ctx context.Context, kind, host string, within time.Duration) ([]*vigiltype.Process, error) {
	page, err := r.c.ListProcesses(ctx, vigilclient.ListProcessesParams{Kind: kind, Host: host, StartedWithin: within, Limit: registeredPage})
	if err != nil {
		return nil, err
	}
	out := make([]*vigiltype.Process, len(page.Processes))
	for i := range page.Processes {
		out[i] = &page.Processes[i]
	}
	return out, nil
}

func (r remoteServer) Stalled(ctx context.Context, kind string, after time.Duration) ([]*vigiltype.Task, error) {
	tasks, err := r.c.StalledTasks(ctx, kind, after)
	if err != nil {
		return nil, err
	}
	out := make([]*vigiltype.Task, len(tasks))
	for i := range tasks {
		out[i] = &tasks[i]
	}
	return out, nil
}

func (r remoteServer) ReclaimStalled(ctx context.Context, taskID, epoch int64, reason string) (*vigiltype.Task, error) {
	return r.c.ReclaimStalled(ctx, taskID, epoch, reason)
}
