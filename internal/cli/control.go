package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// newStopCmd, newStartCmd and newRestartCmd set an agent's desired state;
// the supervisor running it (vigil up or vigil supervise) acts on it within
// a couple of seconds.

func newStopCmd() *cobra.Command {
	var (
		cf     clientFlags
		reason string
		ttl    time.Duration
	)
	cmd := &cobra.Command{
		Use:     "stop AGENT",
		GroupID: "query",
		Short:   "Stop an agent on purpose and keep it down",
		Long: `Stop an agent on purpose: a planned stop marker (DESIGN E2) is written with
--reason, so its exit is recorded as suppressed rather than alerting, and the
agent is marked stopped in the registry. Its supervisor stops the process
and does not restart it until 'vigil start AGENT'. The marker covers the
exits of the processes that were running when it was written, until --ttl
passes: a process started later (by 'vigil start') is not covered, and its
crash is an ordinary, alerting event however soon it comes.`,
		Example: `  vigil stop research --reason "operator redeploy"`,
		Args:    oneArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			if reason == "" {
				return fmt.Errorf("--reason is required: say why the agent is stopped")
			}
			if err := checkTTL(ttl); err != nil {
				return err
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			if _, err := registered(cmd, c, args[0]); err != nil {
				return err
			}
			if _, err := c.PlannedStop(cmd.Context(), args[0], reason, ttl); err != nil {
				return err
			}
			a, err := c.MarkAgent(cmd.Context(), args[0], vigiltype.AgentStopped)
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), a)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "agent %s is stopped; its supervisor stops it and keeps it down\n", a.Name)
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVar(&reason, "reason", "", "why the agent is stopped (required; shown with the suppressed exit)")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "how long the planned stop may suppress the exit of the process it stops (default: the server's 120s)")
	return cmd
}

func newStartCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:     "start AGENT",
		GroupID: "query",
		Short:   "Let a stopped agent run again",
		Long: `Mark an agent active in the registry; its supervisor launches it within a
couple of seconds.`,
		Example: `  vigil start research`,
		Args:    oneArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			if _, err := registered(cmd, c, args[0]); err != nil {
				return err
			}
			a, err := c.MarkAgent(cmd.Context(), args[0], vigiltype.AgentActive)
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), a)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "agent %s is active; its supervisor starts it\n", a.Name)
			return nil
		},
	}
	cf.register(cmd)
	return cmd
}

func newRestartCmd() *cobra.Command {
	var (
		cf     clientFlags
		reason string
		ttl    time.Duration
	)
	cmd := &cobra.Command{
		Use:     "restart AGENT",
		GroupID: "query",
		Short:   "Restart an agent now, its exit suppressed",
		Long: `Restart an agent on purpose: a planned stop marker (DESIGN E2) is written
with --reason; the supervisor, on two control polls in a row (--control-poll
of vigil up/supervise, so within about two of them), sees a marker written
after the running process started, stops it (the exit recorded as
suppressed) and starts it again at once, without backoff. It acts on each
marker once. The marker covers the exits of the processes that were
running when it was written, until --ttl passes: the new process is not
covered, so its crash, however soon after the restart, is an ordinary,
alerting event.`,
		Example: `  vigil restart research --reason "config change"`,
		Args:    oneArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			if reason == "" {
				return fmt.Errorf("--reason is required: say why the agent is restarted")
			}
			if err := checkTTL(ttl); err != nil {
				return err
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			a, err := registered(cmd, c, args[0])
			if err != nil {
				return err
			}
			if a.Status == vigiltype.AgentStopped {
				return fmt.Errorf("agent %s is stopped: use vigil start %s", a.Name, a.Name)
			}
			m, err := c.PlannedStop(cmd.Context(), args[0], reason, ttl)
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), m)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "agent %s will be restarted by its supervisor\n", args[0])
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVar(&reason, "reason", "", "why the agent is restarted (required)")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "how long the planned stop may suppress the exit of the process it restarts (default: the server's 120s)")
	return cmd
}

// registered returns agent name's record; a missing one is exit code 3
// with a short message.
func registered(cmd *cobra.Command, c *vigilclient.Client, name string) (*vigiltype.Agent, error) {
	a, err := c.GetAgent(cmd.Context(), name)
	if errorsIsNotFound(err) {
		return nil, &exitError{err: fmt.Errorf("no agent %q is registered", name), code: exitNotFound}
	}
	return a, err
}

// checkTTL validates a --ttl flag: 0 (the server's 120s) or 1s to 24h.
func checkTTL(ttl time.Duration) error {
	if ttl != 0 && (ttl < time.Second || ttl > 24*time.Hour) {
		return fmt.Errorf("--ttl must be between 1s and 24h (or 0 for the server's 120s), got %s", ttl)
	}
	return nil
}
