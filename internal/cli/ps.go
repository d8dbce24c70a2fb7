package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func newPsCmd() *cobra.Command {
	var (
		cf     clientFlags
		params vigilclient.ListProcessesParams
		status string
	)
	cmd := &cobra.Command{
		Use:     "ps",
		GroupID: "query",
		Short:   "List process instances, newest first, with their computed status",
		Long: `List process instances newest first. STATUS is computed by the server at read
time: alive while the last liveness heartbeat is at most 3× the instance's
liveness interval old (DESIGN L3), stopped after that or after a clean exit.

One page is printed; with --json the output is {"processes":[…],"next_cursor":…}
and --cursor reads the next page.`,
		Example: `  vigil ps
  vigil ps --kind worker --status alive
  vigil ps --json --limit 1000 | jq '.processes[] | select(.status=="stopped")'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if status != "" && !vigiltype.ProcessStatus(status).Valid() {
				return fmt.Errorf("--status %q: must be alive or stopped", status)
			}
			params.Status = vigiltype.ProcessStatus(status)
			if err := checkLimit(params.Limit); err != nil {
				return err
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			page, err := c.ListProcesses(cmd.Context(), params)
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), struct {
					Processes  []vigiltype.Process `json:"processes"`
					NextCursor *string             `json:"next_cursor"`
				}{page.Processes, nilIfEmpty(page.NextCursor)})
			}
			if err := processTable(cmd, page.Processes); err != nil {
				return err
			}
			if page.NextCursor != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "more: vigil ps --cursor %s\n", page.NextCursor)
			}
			return nil
		},
	}
	cf.register(cmd)
	fs := cmd.Flags()
	fs.StringVar(&params.Kind, "kind", "", "only instances of this process kind")
	fs.StringVar(&params.Host, "host", "", "only instances on this hostname")
	fs.StringVar(&status, "status", "", "only alive or stopped instances")
	fs.IntVar(&params.Limit, "limit", 50, "rows per page, 1–1000")
	fs.StringVar(&params.Cursor, "cursor", "", "next_cursor from the previous page")
	return cmd
}

func processTable(cmd *cobra.Command, procs []vigiltype.Process) error {
	now := time.Now()
	rows := make([][]string, 0, len(procs))
	for _, p := range procs {
		task := "-"
		if p.CurrentTaskID != nil {
			task = strconv.FormatInt(*p.CurrentTaskID, 10)
			if p.CurrentTaskType != nil {
				task += " (" + *p.CurrentTaskType + ")"
			}
		}
		hb := p.LastHeartbeatAt
		rows = append(rows, []string{
			p.InstanceID, p.ProcessKind, p.Hostname, strconv.Itoa(p.PID), processStatusText(&p),
			ago(&hb, now), fmt.Sprintf("%gs", p.LivenessIntervalS), ago(&p.StartedAt, now), task,
		})
	}
	return table(cmd.OutOrStdout(),
		[]string{"INSTANCE", "KIND", "HOST", "PID", "STATUS", "HEARTBEAT", "INTERVAL", "STARTED", "TASK"}, rows)
}

func nilIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func newStatusCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:     "status KIND",
		GroupID: "query",
		Short:   "Show the most recently started instance of a process kind",
		Long: `Show the most recently started instance of KIND and its computed status
(DESIGN L4). Exits 3 when no instance of KIND has ever registered, and 0
otherwise, whether the instance is alive or stopped: read STATUS or
.status in --json output.`,
		Example: `  vigil status critic
  vigil status critic --json | jq -r .status`,
		Args: oneArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			p, err := c.ProcessStatus(cmd.Context(), args[0])
			if err != nil {
				if errorsIsNotFound(err) {
					return &exitError{err: fmt.Errorf("no process of kind %q has registered", args[0]), code: exitNotFound}
				}
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), p)
			}
			return processTable(cmd, []vigiltype.Process{*p})
		},
	}
	cf.register(cmd)
	return cmd
}

func newPruneCmd() *cobra.Command {
	var (
		cf        clientFlags
		olderThan time.Duration
	)
	cmd := &cobra.Command{
		Use:     "prune",
		GroupID: "query",
		Short:   "Delete stopped process rows older than a cut-off",
		Long: `Delete process instances that are stopped, whose last heartbeat is older
than --older-than, and that hold no task (DESIGN L7). Rows are history and
vigil never prunes on its own; run this by hand or from cron.`,
		Example: `  vigil prune --older-than 720h`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if olderThan <= 0 {
				return fmt.Errorf("--older-than must be a positive duration like 720h, got %s", olderThan)
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			n, err := c.Prune(cmd.Context(), olderThan)
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), map[string]int64{"deleted": n})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted %d stopped process rows older than %s\n", n, olderThan)
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().DurationVar(&olderThan, "older-than", 720*time.Hour, "delete rows whose last heartbeat is older than this")
	return cmd
}

// processStatusText is an instance's status as the table prints it: "alive
// (grace)" while only the store outage grace keeps it alive (DESIGN L8),
// "stopped (future)" for a heartbeat dated ahead of the server's clock
// (L9); --json has grace_until and status_reason.
func processStatusText(p *vigiltype.Process) string {
	switch {
	case p.Status == vigiltype.ProcessAlive && p.GraceUntil != nil:
		return string(p.Status) + " (grace)"
	case p.Status == vigiltype.ProcessStopped && strings.Contains(p.StatusReason, "ahead of the server's clock"):
		return string(p.Status) + " (future)"
	}
	return string(p.Status)
}
