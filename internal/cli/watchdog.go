package cli

import (
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/vigil-fleet/vigil/internal/heartbeat"
)

func newWatchdogCmd() *cobra.Command {
	var (
		roots  []string
		dryRun bool
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "watchdog [--root DIR…]",
		Short: "SIGTERM orphaned heartbeat loops (workdir gone or parent dead)",
		Long: `Find this user's heartbeat loops by scanning /proc for "vigil heartbeat loop"
processes (not by pid files: a deleted workdir takes its pid file with it),
and SIGTERM each whose workdir is gone — its cwd, which is the workdir, has
link count 0 — or whose parent process is dead (pid reuse included)
(DESIGN H5). With --root, only loops whose workdir lies below one of the
roots are considered. Prints what it did about each loop.

Run it every 5 minutes: contrib/systemd/ has a user service and timer,
contrib/cron/ a crontab line. Linux only.`,
		Example: `  vigil watchdog
  vigil watchdog --root ~/worktrees --dry-run
  vigil watchdog --json | jq '.loops[] | select(.action=="terminated")'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			abs := make([]string, 0, len(roots))
			for _, r := range roots {
				if r == "" {
					return fmt.Errorf("--root must not be empty")
				}
				a, err := filepath.Abs(r)
				if err != nil {
					return fmt.Errorf("--root %s: %w", r, err)
				}
				abs = append(abs, a)
				if real, err := filepath.EvalSymlinks(a); err == nil && real != a {
					abs = append(abs, real)
				}
			}
			reports, err := heartbeat.Sweep(abs, dryRun)
			if err != nil {
				return err
			}
			if asJSON {
				if reports == nil {
					reports = []heartbeat.SweepReport{}
				}
				return printJSON(cmd.OutOrStdout(), map[string]any{"loops": reports, "dry_run": dryRun})
			}
			if len(reports) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "no heartbeat loops found")
				return nil
			}
			rows := make([][]string, 0, len(reports))
			for _, r := range reports {
				rows = append(rows, []string{strconv.Itoa(r.PID), r.Workdir, strconv.Itoa(r.ParentPID), r.Action, r.Reason})
			}
			return table(cmd.OutOrStdout(), []string{"PID", "WORKDIR", "PARENT", "ACTION", "REASON"}, rows)
		},
	}
	fs := cmd.Flags()
	fs.StringArrayVar(&roots, "root", nil, "only loops whose workdir is below DIR (repeatable; default: all of this user's loops)")
	fs.BoolVar(&dryRun, "dry-run", false, "say what would be terminated, signal nothing")
	fs.BoolVar(&asJSON, "json", false, "print JSON for scripts instead of a table")
	return cmd
}
