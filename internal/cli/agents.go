package cli

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func newAgentsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "agents",
		GroupID: "query",
		Short:   "The agent registry: declared agents, their schedule and status",
		Long: `The agent registry (DESIGN R1) holds each agent's declared identity —
name, function, tick_cron, opaque config — and its declared status (active or
stopped). It is durable intent: whether a process is running is a separate
fact (vigil ps), kept apart on purpose.`,
	}
	cmd.AddCommand(newAgentsRegisterCmd(), newAgentsLsCmd(), newAgentsShowCmd(), newAgentsUpdateCmd(),
		newAgentsMarkCmd(vigiltype.AgentStopped), newAgentsMarkCmd(vigiltype.AgentActive))
	return cmd
}

func newAgentsRegisterCmd() *cobra.Command {
	var (
		cf     clientFlags
		p      vigilclient.AgentParams
		config string
	)
	cmd := &cobra.Command{
		Use:   "register NAME",
		Short: "Register an agent, replacing any record of that name",
		Long: `Register an agent. This is an unconditional write: a record of the same
name is replaced — created_at, status (active) and config reset.`,
		Example: `  vigil agents register research --function "research assistant" --tick-cron "0 * * * *"
  vigil agents register critic --config @critic.json --json`,
		Args: oneArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			p.Name = args[0]
			raw, err := jsonFlagValue(cmd, "--config", config)
			if err != nil {
				return err
			}
			if raw != nil {
				p.Config = raw
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			a, err := c.RegisterAgent(cmd.Context(), p)
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), a)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "registered agent %s (version %d)\n", a.Name, a.Version)
			return nil
		},
	}
	cf.register(cmd)
	fs := cmd.Flags()
	fs.StringVar(&p.Function, "function", "", "what the agent does, in words")
	fs.StringVar(&p.TickCron, "tick-cron", "", `its schedule: a 5-field cron spec ("*/5 * * * *") or a descriptor ("@hourly", "@every 10m")`)
	fs.StringVar(&config, "config", "", "opaque config as JSON; @FILE reads a file, - standard input")
	return cmd
}

func newAgentsLsCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List registered agents, oldest first, stopped ones included",
		Example: `  vigil agents ls
  vigil agents ls --json | jq -r '.agents[] | select(.status=="stopped") | .name'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			list, err := c.ListAgents(cmd.Context())
			if err != nil {
				return err
			}
			if cf.json {
				if list == nil {
					list = []vigiltype.Agent{}
				}
				return printJSON(cmd.OutOrStdout(), map[string]any{"agents": list})
			}
			now := time.Now()
			rows := make([][]string, 0, len(list))
			for _, a := range list {
				rows = append(rows, []string{a.Name, string(a.Status), orEmpty(a.Function), orEmpty(a.TickCron),
					ago(&a.CreatedAt, now), ago(a.StoppedAt, now), strconv.FormatInt(a.Version, 10)})
			}
			return table(cmd.OutOrStdout(), []string{"NAME", "STATUS", "FUNCTION", "TICK CRON", "CREATED", "STOPPED", "VERSION"}, rows)
		},
	}
	cf.register(cmd)
	return cmd
}

func newAgentsShowCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:     "show NAME",
		Short:   "Show one agent's record, config included",
		Example: `  vigil agents show research --json | jq .config`,
		Args:    oneArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			a, err := c.GetAgent(cmd.Context(), args[0])
			if err != nil {
				if errorsIsNotFound(err) {
					return &exitError{err: fmt.Errorf("no agent %q is registered", args[0]), code: exitNotFound}
				}
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), a)
			}
			ts := func(t time.Time) string { return t.Format(time.RFC3339) }
			return table(cmd.OutOrStdout(), []string{"FIELD", "VALUE"}, [][]string{
				{"name", a.Name}, {"status", string(a.Status)}, {"function", orEmpty(a.Function)},
				{"tick_cron", orEmpty(a.TickCron)}, {"config", string(a.Config)},
				{"created_at", ts(a.CreatedAt)}, {"updated_at", ts(a.UpdatedAt)},
				{"stopped_at", orDash(a.StoppedAt, ts)}, {"version", strconv.FormatInt(a.Version, 10)},
			})
		},
	}
	cf.register(cmd)
	return cmd
}

func newAgentsUpdateCmd() *cobra.Command {
	var (
		cf                     clientFlags
		function, cron, config string
		version                int64
	)
	cmd := &cobra.Command{
		Use:   "update NAME",
		Short: "Change some fields of an agent's record (compare-and-swap)",
		Long: `Change the given fields of an agent's record and leave the rest. The update
is compare-and-swap on the record's version: without --version the current
one is read first; if the record changes in between, the update fails with a
conflict naming the agent instead of overwriting the other change.`,
		Example: `  vigil agents update research --tick-cron "*/30 * * * *"
  vigil agents update research --config @new.json --version 7`,
		Args: oneArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			var u vigilclient.AgentUpdate
			fs := cmd.Flags()
			if fs.Changed("function") {
				u.Function = &function
			}
			if fs.Changed("tick-cron") {
				u.TickCron = &cron
			}
			raw, err := jsonFlagValue(cmd, "--config", config)
			if err != nil {
				return err
			}
			u.Config = raw
			if u.Function == nil && u.TickCron == nil && u.Config == nil {
				return fmt.Errorf("nothing to update: give --function, --tick-cron or --config")
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			u.Version = version
			if !fs.Changed("version") {
				cur, err := c.GetAgent(cmd.Context(), name)
				if err != nil {
					return err
				}
				u.Version = cur.Version
			} else if version <= 0 {
				return fmt.Errorf("--version must be positive, got %d", version)
			}
			a, err := c.UpdateAgent(cmd.Context(), name, u)
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), a)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "updated agent %s (version %d)\n", a.Name, a.Version)
			return nil
		},
	}
	cf.register(cmd)
	fs := cmd.Flags()
	fs.StringVar(&function, "function", "", "new function text")
	fs.StringVar(&cron, "tick-cron", "", "new schedule (cron spec or descriptor; \"\" clears it)")
	fs.StringVar(&config, "config", "", "new config as JSON; @FILE or - for standard input")
	fs.Int64Var(&version, "version", 0, "the version you read (default: read it now)")
	return cmd
}

func newAgentsMarkCmd(status vigiltype.AgentStatus) *cobra.Command {
	var cf clientFlags
	use, short := "mark-active NAME", "Mark an agent's declared status active"
	if status == vigiltype.AgentStopped {
		use, short = "mark-stopped NAME", "Mark an agent's declared status stopped (stopped_at = now); a supervisor then stops it, and its exit is an ordinary (alerting) event — use vigil stop for a planned, suppressed stop"
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  oneArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			a, err := c.MarkAgent(cmd.Context(), args[0], status)
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), a)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "agent %s is %s\n", a.Name, a.Status)
			return nil
		},
	}
	cf.register(cmd)
	return cmd
}

// jsonFlagValue reads a JSON flag value given inline, as @FILE or as - (stdin).
func jsonFlagValue(cmd *cobra.Command, flag, v string) (json.RawMessage, error) {
	raw, err := readJSONValue(cmd, v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return raw, nil
}

func orEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
