package cli

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func newEventsCmd() *cobra.Command {
	var (
		cf clientFlags
		p  vigilclient.ListEventsParams
	)
	cmd := &cobra.Command{
		Use:     "events",
		GroupID: "query",
		Short:   "List process events (exits, stall kills, launch failures), newest first",
		Long: `List process events, newest first (DESIGN E1). An event starts undelivered;
an alerter lists --undelivered, handles each and acknowledges it with
'vigil events ack ID'. An exit covered by a planned stop is written already
delivered with delivery kind "suppressed": on record, but nobody is paged.

With --json: {"events":[…],"next_cursor":…}.`,
		Example: `  vigil events
  vigil events --agent research --undelivered
  vigil events --undelivered --json | jq -r '.events[].event_id' | xargs -n1 vigil events ack`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkLimit(p.Limit); err != nil {
				return err
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			page, err := c.ListEvents(cmd.Context(), p)
			if err != nil {
				return err
			}
			if cf.json {
				list := page.Events
				if list == nil {
					list = []vigiltype.ProcessEvent{}
				}
				return printJSON(cmd.OutOrStdout(), struct {
					Events     []vigiltype.ProcessEvent `json:"events"`
					NextCursor *string                  `json:"next_cursor"`
				}{list, nilIfEmpty(page.NextCursor)})
			}
			now := time.Now()
			rows := make([][]string, 0, len(page.Events))
			for _, e := range page.Events {
				rows = append(rows, []string{
					strconv.FormatInt(e.EventID, 10), e.Agent, string(e.Kind), ago(&e.At, now), eventOutcome(e),
					runTime(e),
					orDash(e.DeliveryKind, func(s string) string { return s }), lastLine(e.StderrTail),
				})
			}
			if err := table(cmd.OutOrStdout(), []string{"ID", "AGENT", "KIND", "AT", "EXIT", "RUN", "DELIVERED", "LAST STDERR"}, rows); err != nil {
				return err
			}
			if page.NextCursor != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "more: vigil events --cursor %s\n", page.NextCursor)
			}
			return nil
		},
	}
	cf.register(cmd)
	fs := cmd.Flags()
	fs.StringVar(&p.Agent, "agent", "", "only events of this agent")
	fs.BoolVar(&p.Undelivered, "undelivered", false, "only events nobody has acknowledged")
	fs.IntVar(&p.Limit, "limit", 50, "rows per page, 1–1000")
	fs.StringVar(&p.Cursor, "cursor", "", "next_cursor from the previous page")
	cmd.AddCommand(newEventsAckCmd())
	return cmd
}

func newEventsAckCmd() *cobra.Command {
	var (
		cf   clientFlags
		kind string
	)
	cmd := &cobra.Command{
		Use:   "ack ID",
		Short: "Mark an event delivered (idempotent)",
		Long: `Mark an event delivered, with a delivery kind (default "acknowledged"). A
second ack keeps the first one's time and kind. Exits 3 when there is no such
event.`,
		Example: `  vigil events ack 42
  vigil events ack 42 --kind paged`,
		Args: oneArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || id <= 0 {
				return fmt.Errorf("event ID %q: must be a positive integer", args[0])
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			e, err := c.AckEvent(cmd.Context(), id, kind)
			if err != nil {
				if errorsIsNotFound(err) {
					return &exitError{err: fmt.Errorf("no event %d", id), code: exitNotFound}
				}
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), e)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "event %d delivered (%s)\n", e.EventID, *e.DeliveryKind)
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVar(&kind, "kind", "", `delivery kind to record (default "acknowledged")`)
	return cmd
}

// eventOutcome renders how a process ended: "code 3", "SIGKILL", or "-";
// "deferred" for a stall kill held back by the budget.
func eventOutcome(e vigiltype.ProcessEvent) string {
	var detail struct {
		Deferred bool `json:"deferred"`
	}
	_ = json.Unmarshal(e.Detail, &detail)
	switch {
	case detail.Deferred:
		return "deferred"
	case e.Signal != "":
		return e.Signal
	case e.ExitCode != nil:
		return "code " + strconv.Itoa(*e.ExitCode)
	}
	return "-"
}

// lastLine is the last non-empty line of s, or "-".
func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return "-"
	}
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 60 {
		s = s[:57] + "..."
	}
	return s
}

// runTime is how long the process ran, for exits; "-" for other events.
func runTime(e vigiltype.ProcessEvent) string {
	if e.Kind != vigiltype.EventExit {
		return "-"
	}
	return humanDuration(time.Duration(e.RunDurationMS) * time.Millisecond)
}
