package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/spf13/cobra"

	"github.com/vigil-fleet/vigil/internal/bench"
)

func newBenchCmd() *cobra.Command {
	var (
		smoke   bool
		only    string
		out     string
		pgURL   string
		list    bool
		asJSON  bool
		scratch string
	)
	cmd := &cobra.Command{
		Use:     "bench",
		GroupID: "server",
		Short:   "Measure vigil's hot paths against same-run baselines",
		Long: `Measure vigil's hot paths (heartbeat ingest, status reads over a large
history, task claims, lease reclaims, the supervisor's restart path and its
memory) and, in the same run on the same machine, a baseline for each. The
ratio to the baseline is the target (see BENCHMARKS.md and
docs/performance.md): absolute figures drift on a shared machine.

A full run takes many minutes and fills a scratch directory; progress goes to
stderr. --smoke runs every case at a tiny size in a few seconds (CI uses it to
keep the harness working; its figures mean nothing). PostgreSQL rows need
--postgres (env VIGIL_BENCH_POSTGRES_URL) and use a schema of their own that
is dropped afterwards.`,
		Example: `  vigil bench --postgres postgres://postgres@127.0.0.1:5432/test --out BENCHMARKS.md
  vigil bench --only 'heartbeat' --smoke
  vigil bench --list`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if list {
				for _, c := range bench.Cases() {
					pg := ""
					if c.NeedsPostgres {
						pg = " (PostgreSQL)"
					}
					fmt.Fprintf(cmd.OutOrStdout(), "%s%s\n", c.Name, pg)
				}
				return nil
			}
			var re *regexp.Regexp
			if only != "" {
				var err error
				if re, err = regexp.Compile(only); err != nil {
					return fmt.Errorf("--only: not a regular expression: %w", err)
				}
			}
			// Make the output's file before measuring, beside --out, so that a
			// path that cannot be written fails now, not after a run of many
			// minutes; it replaces --out only once the table is written.
			w := cmd.OutOrStdout()
			var tmp *os.File
			if out != "" && out != "-" && !asJSON {
				var err error
				if tmp, err = os.CreateTemp(filepath.Dir(out), ".vigil-bench-*.md"); err != nil {
					return fmt.Errorf("--out %s: %w", out, err)
				}
				defer os.Remove(tmp.Name()) // gone after the rename; left only by a failure
				defer tmp.Close()
				w = tmp
			}
			dir := scratch
			if dir == "" {
				d, err := os.MkdirTemp("", "vigil-bench-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(d)
				dir = d
			}
			env := bench.Env{Smoke: smoke, PostgresURL: pgURL, Dir: dir, Log: cmd.ErrOrStderr()}
			started := time.Now()
			rows, err := bench.Run(cmd.Context(), env, re)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), map[string]any{"machine": bench.ThisMachine(started), "smoke": smoke, "rows": rows})
			}
			if err := bench.WriteMarkdown(w, bench.ThisMachine(started), smoke, rows); err != nil {
				return err
			}
			if tmp != nil {
				if err := tmp.Close(); err != nil {
					return fmt.Errorf("--out %s: %w", out, err)
				}
				if err := os.Rename(tmp.Name(), out); err != nil {
					return fmt.Errorf("--out %s: %w", out, err)
				}
			}
			if out != "" && out != "-" {
				fmt.Fprintf(cmd.ErrOrStderr(), "wrote %d row(s) to %s\n", len(rows), out)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&smoke, "smoke", false, "tiny sizes, a few seconds in all (figures mean nothing)")
	f.StringVar(&only, "only", "", "run only the cases whose name matches this regular expression (see --list)")
	f.StringVar(&out, "out", "-", "write the Markdown table to this file (- for stdout)")
	f.StringVar(&pgURL, "postgres", os.Getenv("VIGIL_BENCH_POSTGRES_URL"), "PostgreSQL URL for the PostgreSQL rows; empty skips them (env VIGIL_BENCH_POSTGRES_URL)")
	f.BoolVar(&list, "list", false, "list the cases and exit")
	f.BoolVar(&asJSON, "json", false, "print the rows as JSON instead of Markdown")
	f.StringVar(&scratch, "dir", "", "scratch directory (default: a temporary one, removed afterwards)")
	return cmd
}
