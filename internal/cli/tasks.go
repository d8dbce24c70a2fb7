package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func newTasksCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "tasks",
		GroupID: "query",
		Short:   "Enqueue and inspect tasks in the outbox",
		Long: `Tasks are units of work claimed by one process instance at a time under a
lease (DESIGN T1–T3). States: scheduled → running → completed; a failure goes
back to scheduled with backoff, or to dead_letter after max_attempts; a lease
whose holder died is reclaimed (counted in RECLAIMS) and past max_reclaims
dead-lettered.`,
	}
	cmd.AddCommand(newTasksAddCmd(), newTasksLsCmd(), newTasksShowCmd())
	return cmd
}

func newTasksAddCmd() *cobra.Command {
	var (
		cf          clientFlags
		payload     string
		maxAttempts int
		maxReclaims int
		p           vigilclient.EnqueueParams
	)
	cmd := &cobra.Command{
		Use:   "add TYPE",
		Short: "Enqueue a task of TYPE",
		Long: `Enqueue a task of TYPE. It is claimable at once (or after --delay) by an
instance polling for TYPE, which holds it under a lease until it completes,
fails or releases it. Prints the new task's id, or the whole task with --json.`,
		Example: `  vigil tasks add sleep --payload '{"seconds":5}'
  vigil tasks add report --payload @job.json --max-attempts 3 --delay 10m --json
  generate-job | vigil tasks add report --payload -`,
		Args: oneArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			p.TaskType = args[0]
			raw, err := readPayload(cmd, payload)
			if err != nil {
				return err
			}
			if raw != nil {
				p.Payload = raw // a nil RawMessage in the interface would send null
			}
			if cmd.Flags().Changed("max-attempts") {
				if maxAttempts < 1 || maxAttempts > 1000 {
					return fmt.Errorf("--max-attempts must be between 1 and 1000, got %d", maxAttempts)
				}
				p.MaxAttempts = maxAttempts
			}
			if cmd.Flags().Changed("max-reclaims") {
				if maxReclaims < 0 || maxReclaims > 1000 {
					return fmt.Errorf("--max-reclaims must be between 0 and 1000, got %d", maxReclaims)
				}
				p.MaxReclaims = &maxReclaims
			}
			if p.LeaseTimeout != 0 && (p.LeaseTimeout < time.Second || p.LeaseTimeout > 24*time.Hour) {
				return fmt.Errorf("--lease-timeout must be 0 (the server's) or between 1s and 24h, got %s", p.LeaseTimeout)
			}
			if p.Delay < 0 {
				return fmt.Errorf("--delay must not be negative, got %s", p.Delay)
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			t, err := c.Enqueue(cmd.Context(), p)
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), t)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "enqueued task %d (%s)\n", t.TaskID, t.TaskType)
			return nil
		},
	}
	cf.register(cmd)
	fs := cmd.Flags()
	fs.StringVar(&payload, "payload", "", "task payload as JSON (default {}); @FILE reads it from a file, - from standard input")
	fs.IntVar(&maxAttempts, "max-attempts", 5, "handler failures before dead_letter")
	fs.IntVar(&maxReclaims, "max-reclaims", 3, "reclaims from dead holders before dead_letter")
	fs.DurationVar(&p.LeaseTimeout, "lease-timeout", 0, "this task's lease window (default: the server's --lease-timeout)")
	fs.DurationVar(&p.Delay, "delay", 0, "make the task claimable only after this long")
	fs.BoolVar(&p.ActivityGated, "activity-gated", false, "work whose holder reports activity (v2 heartbeats): lease window 30m unless --lease-timeout")
	return cmd
}

func newTasksLsCmd() *cobra.Command {
	var (
		cf     clientFlags
		status string
		p      vigilclient.ListTasksParams
	)
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List tasks, newest first",
		Long: `List tasks, highest id first, one page at a time (--limit, --cursor).
ATTEMPTS counts handler failures against max_attempts; RECLAIMS counts leases
taken back from dead or silent holders against max_reclaims; EPOCH is the
lease's fencing token; LEASE HEARTBEAT is the age of the holder's last lease
heartbeat. With --json: {"tasks":[…],"next_cursor":…}.`,
		Example: `  vigil tasks ls
  vigil tasks ls --status running
  vigil tasks ls --status dead_letter --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if status != "" && !vigiltype.TaskStatus(status).Valid() {
				return fmt.Errorf("--status %q: must be one of scheduled, running, completed, dead_letter", status)
			}
			p.Status = vigiltype.TaskStatus(status)
			if err := checkLimit(p.Limit); err != nil {
				return err
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			page, err := c.ListTasks(cmd.Context(), p)
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), struct {
					Tasks      []vigiltype.Task `json:"tasks"`
					NextCursor *string          `json:"next_cursor"`
				}{page.Tasks, nilIfEmpty(page.NextCursor)})
			}
			if err := taskTable(cmd, page.Tasks); err != nil {
				return err
			}
			if page.NextCursor != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "more: vigil tasks ls --cursor %s\n", page.NextCursor)
			}
			return nil
		},
	}
	cf.register(cmd)
	fs := cmd.Flags()
	fs.StringVar(&status, "status", "", "only tasks in this state: scheduled, running, completed or dead_letter")
	fs.StringVar(&p.TaskType, "type", "", "only tasks of this type")
	fs.IntVar(&p.Limit, "limit", 50, "rows per page, 1–1000")
	fs.StringVar(&p.Cursor, "cursor", "", "next_cursor from the previous page")
	return cmd
}

func newTasksShowCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show one task with its lease and result",
		Long: `Show every field of one task: payload, lease (owner, epoch, expiry, last
heartbeat), counts, result, completed_by and last_error (a failure's text, or
why the lease was reclaimed). Exits 3 when there is no such task.`,
		Example: `  vigil tasks show 42
  vigil tasks show 42 --json | jq .result`,
		Args: oneArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || id <= 0 {
				return fmt.Errorf("task ID %q: must be a positive integer", args[0])
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			t, err := c.GetTask(cmd.Context(), id)
			if err != nil {
				if errorsIsNotFound(err) {
					return &exitError{err: fmt.Errorf("no task %d", id), code: exitNotFound}
				}
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), t)
			}
			return taskDetail(cmd, t)
		},
	}
	cf.register(cmd)
	return cmd
}

func taskTable(cmd *cobra.Command, tasks []vigiltype.Task) error {
	now := time.Now()
	rows := make([][]string, 0, len(tasks))
	for _, t := range tasks {
		rows = append(rows, []string{
			strconv.FormatInt(t.TaskID, 10), t.TaskType, taskStatusText(t),
			fmt.Sprintf("%d/%d", t.Attempts, t.MaxAttempts), fmt.Sprintf("%d/%d", t.Reclaims, t.MaxReclaims),
			orDash(t.LeaseOwner, func(s string) string { return s }), strconv.FormatInt(t.LeaseEpoch, 10),
			ago(t.LastHeartbeatAt, now), ago(&t.CreatedAt, now),
		})
	}
	return table(cmd.OutOrStdout(),
		[]string{"ID", "TYPE", "STATUS", "ATTEMPTS", "RECLAIMS", "LEASE OWNER", "EPOCH", "LEASE HEARTBEAT", "CREATED"}, rows)
}

// taskStatusText is a task's status as the tables print it: "running
// (stalled)" for a running task whose activity is stale (DESIGN T6).
func taskStatusText(t vigiltype.Task) string {
	if t.Stalled {
		return string(t.Status) + " (stalled)"
	}
	return string(t.Status)
}

func taskDetail(cmd *cobra.Command, t *vigiltype.Task) error {
	now := time.Now()
	str := func(s string) string { return s }
	ts := func(v time.Time) string { return v.Format(time.RFC3339Nano) }
	rows := [][]string{
		{"task_id", strconv.FormatInt(t.TaskID, 10)},
		{"task_type", t.TaskType},
		{"status", taskStatusText(*t)},
		{"payload", string(t.Payload)},
		{"attempts", fmt.Sprintf("%d of %d", t.Attempts, t.MaxAttempts)},
		{"reclaims", fmt.Sprintf("%d of %d", t.Reclaims, t.MaxReclaims)},
		{"lease_owner", orDash(t.LeaseOwner, str)},
		{"lease_epoch", strconv.FormatInt(t.LeaseEpoch, 10)},
		{"lease_expires_at", orDash(t.LeaseExpiresAt, ts)},
		{"last_heartbeat_at", ago(t.LastHeartbeatAt, now)},
		{"started_at", orDash(t.StartedAt, ts)},
		{"run_after", ts(t.RunAfter)},
		{"created_at", ts(t.CreatedAt)},
		{"completed_at", orDash(t.CompletedAt, ts)},
		{"completed_by", orDash(t.CompletedBy, str)},
		{"result", string(t.Result)},
		{"last_error", orDash(t.LastError, str)},
	}
	if len(t.Result) == 0 {
		rows[15][1] = "-"
	}
	return table(cmd.OutOrStdout(), []string{"FIELD", "VALUE"}, rows)
}

// readPayload returns the --payload value as JSON: inline, @FILE or - for
// standard input; nil when empty (the server stores {}).
func readPayload(cmd *cobra.Command, v string) (json.RawMessage, error) {
	return jsonFlagValue(cmd, "--payload", v)
}

// readJSONValue reads JSON given inline, as @FILE or as - (standard
// input); nil when v is empty.
func readJSONValue(cmd *cobra.Command, v string) (json.RawMessage, error) {
	var (
		data []byte
		err  error
	)
	switch {
	case v == "":
		return nil, nil
	case v == "-":
		data, err = io.ReadAll(cmd.InOrStdin())
	case strings.HasPrefix(v, "@"):
		data, err = os.ReadFile(v[1:])
	default:
		data = []byte(v)
	}
	if err != nil {
		return nil, err
	}
	data = bytes.TrimSpace(data)
	if !json.Valid(data) {
		shown := string(data)
		if len(shown) > 80 {
			shown = shown[:80] + "…"
		}
		return nil, fmt.Errorf("must be valid JSON, got %q", shown)
	}
	return data, nil
}

func errorsIsNotFound(err error) bool { return errors.Is(err, vigiltype.ErrNotFound) }

func newSweepersCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:     "sweepers",
		GroupID: "query",
		Short:   "Show the server's background loops and their last pass",
		Long: `Show the server's sweepers (background loops such as the lease reclaimer) in
the list_agents / agent_status shape: kind "sweeper", last_run_at,
last_result_count, last_run_duration_ms, last_error.`,
		Example: `  vigil sweepers
  vigil sweepers --json | jq '.sweepers[] | select(.last_error != null)'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			list, err := c.Sweepers(cmd.Context())
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), map[string]any{"sweepers": list})
			}
			now := time.Now()
			rows := make([][]string, 0, len(list))
			for _, s := range list {
				rows = append(rows, []string{
					s.Name, s.Kind, fmt.Sprintf("%gs", s.IntervalS), ago(s.LastRunAt, now),
					strconv.Itoa(s.LastResultCount), fmt.Sprintf("%.1fms", s.LastRunDurationMS),
					orDash(s.LastError, func(s string) string { return s }),
				})
			}
			return table(cmd.OutOrStdout(), []string{"NAME", "KIND", "INTERVAL", "LAST RUN", "RESULT", "DURATION", "LAST ERROR"}, rows)
		},
	}
	cf.register(cmd)
	return cmd
}
