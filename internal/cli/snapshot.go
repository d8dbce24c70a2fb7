package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vigil-fleet/vigil/vigiltype"
)

func newSnapshotCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:     "snapshot",
		GroupID: "query",
		Short:   "Show the fleet: each agent's declared status, process and operational state",
		Long: `Show the fleet snapshot (DESIGN F1–F5): the server's own row first
(declared "self-supervising"), then one row per registry record.

DECLARED is the registry's intent, PROCESS what the process signal says now
(running, not_running, or unknown when it could not be checked), STATE the
operational state, decided in this order: a failed telemetry read →
telemetry_missing; declared stopped → stopped; process running → working (it
holds a task) or idle; anything else → down. An agent declared active whose
process is not running therefore shows down. Failed reads are listed below
the table.

On the server's host the process is checked by pid and start time, so a
reused pid never counts; on other hosts the liveness heartbeats decide.
Process lookups are cached for 7.5s.

With --json: the API document, {"taken_at","hostname","agents":[…]}.`,
		Example: `  vigil snapshot
  vigil snapshot --json | jq '.agents[] | select(.operational_state == "down") | .agent'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			s, err := c.Snapshot(cmd.Context())
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), s)
			}
			now := time.Now()
			rows := make([][]string, 0, len(s.Agents))
			var notes []string
			for _, a := range s.Agents {
				rows = append(rows, []string{
					a.Agent, a.DeclaredStatus, string(a.ProcessState), string(a.OperationalState),
					snapshotTasks(a.RunningTasks), snapshotEvent(a, now),
				})
				for _, e := range a.TelemetryErrors {
					notes = append(notes, fmt.Sprintf("%s: telemetry: %s", a.Agent, e))
				}
				if a.ProcessError != "" {
					notes = append(notes, fmt.Sprintf("%s: process: %s", a.Agent, a.ProcessError))
				}
			}
			if err := table(cmd.OutOrStdout(), []string{"AGENT", "DECLARED", "PROCESS", "STATE", "TASK", "LAST EVENT"}, rows); err != nil {
				return err
			}
			for _, n := range notes {
				fmt.Fprintln(cmd.ErrOrStderr(), printable(n))
			}
			return nil
		},
	}
	cf.register(cmd)
	return cmd
}

// snapshotTasks shows the first running task as TYPE#ID, and how many more.
func snapshotTasks(tasks []vigiltype.SnapshotTask) string {
	if len(tasks) == 0 {
		return "-"
	}
	s := tasks[0].TaskType + "#" + strconv.FormatInt(tasks[0].TaskID, 10)
	if len(tasks) > 1 {
		s += fmt.Sprintf(" (+%d)", len(tasks)-1)
	}
	return s
}

// snapshotEvent shows the latest process event as its kind, exit and age.
func snapshotEvent(a *vigiltype.AgentSnapshot, now time.Time) string {
	e := a.LatestProcessEvent
	if e == nil {
		return "-"
	}
	parts := []string{string(e.Kind)}
	if out := eventOutcome(*e); out != "" && out != "-" {
		parts = append(parts, out)
	}
	parts = append(parts, ago(&e.At, now))
	return strings.Join(parts, " ")
}
