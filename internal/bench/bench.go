// Package bench is vigil's benchmark harness (`vigil bench`, issue #6).
// Each case measures one hot path AND its baseline in the same run on the
// same machine, so the ratio between them is the figure that matters:
// absolute numbers drift on shared machines, ratios much less. The results
// are written as a Markdown table (BENCHMARKS.md).
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"time"
)

// Row is one line of the results table.
type Row struct {
	Path     string  `json:"path"`     // the hot path, e.g. "heartbeat ingest over HTTP, SQLite"
	Figure   string  `json:"figure"`   // what vigil reached, e.g. "31,200/s, p99 4.1 ms"
	Baseline string  `json:"baseline"` // what the baseline reached in the same run
	Ratio    float64 `json:"ratio"`    // figure ÷ baseline in the unit the target names (0: none)
	Target   string  `json:"target"`   // the target and ratio to reach, e.g. "≥ 30,000/s; ≥ 0.85×"
	Met      bool    `json:"met"`      // whether every part of Target holds (never judged in a smoke run)
	Note     string  `json:"note"`     // for a miss: why, and what would close it
}

// Env is what every case gets.
type Env struct {
	// Smoke asks for a run of a few seconds in all: tiny sizes, so that CI
	// proves the harness still works. Figures from a smoke run mean nothing.
	Smoke bool
	// PostgresURL is the database the PostgreSQL rows use; empty skips them.
	PostgresURL string
	// Dir is a scratch directory the case may fill (SQLite files, logs).
	Dir string
	// Log receives progress lines.
	Log io.Writer
}

// Logf prints one progress line.
func (e Env) Logf(format string, args ...any) {
	if e.Log != nil {
		fmt.Fprintf(e.Log, format+"\n", args...)
	}
}

// Case measures one or more rows.
type Case struct {
	Name string // short id matched by --only, e.g. "heartbeat-sqlite"
	// NeedsPostgres cases are skipped when Env.PostgresURL is empty.
	NeedsPostgres bool
	Run           func(ctx context.Context, env Env) ([]Row, error)
}

var cases []Case

// register adds a case; cases call it from init.
func register(c Case) { cases = append(cases, c) }

// Cases lists the registered cases sorted by name.
func Cases() []Case {
	out := append([]Case(nil), cases...)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Run runs every case whose name matches only (nil: all) and returns their
// rows in case order. A failing case ends the run with its error.
func Run(ctx context.Context, env Env, only *regexp.Regexp) ([]Row, error) {
	var rows []Row
	matched := 0
	for _, c := range Cases() {
		if only != nil && !only.MatchString(c.Name) {
			continue
		}
		matched++
		if c.NeedsPostgres && env.PostgresURL == "" {
			env.Logf("skip %s: no PostgreSQL URL (--postgres)", c.Name)
			continue
		}
		env.Logf("run %s", c.Name)
		start := time.Now()
		got, err := c.Run(ctx, env)
		if err != nil {
			return rows, fmt.Errorf("bench %s: %w", c.Name, err)
		}
		env.Logf("done %s in %s", c.Name, time.Since(start).Round(time.Millisecond))
		if env.Smoke {
			for i := range got {
				got[i].Met = false // a smoke run's sizes cannot judge a target
			}
		}
		rows = append(rows, got...)
	}
	if only != nil && matched == 0 {
		return nil, fmt.Errorf("no case matches --only %q (vigil bench --list names them)", only.String())
	}
	if len(rows) == 0 && matched > 0 {
		return nil, errors.New("every case --only picked needs PostgreSQL: give --postgres URL (env VIGIL_BENCH_POSTGRES_URL)")
	}
	return rows, nil
}

// Machine describes where a run happened.
type Machine struct {
	Date time.Time `json:"date"`
	Host string    `json:"host"`
	CPUs int       `json:"cpus"`
	OS   string    `json:"os"`
	Arch string    `json:"arch"`
	Go   string    `json:"go"`
}

// ThisMachine reads the Machine of the running process.
func ThisMachine(now time.Time) Machine {
	host, _ := os.Hostname()
	return Machine{Date: now, Host: host, CPUs: runtime.NumCPU(), OS: runtime.GOOS, Arch: runtime.GOARCH, Go: runtime.Version()}
}

// WriteMarkdown writes rows as the BENCHMARKS.md table.
func WriteMarkdown(w io.Writer, m Machine, smoke bool, rows []Row) error {
	var b strings.Builder
	b.WriteString("# Benchmarks\n\n")
	fmt.Fprintf(&b, "Run of `vigil bench` on %s: %d CPUs, %s/%s, %s, host %s.\n",
		m.Date.UTC().Format("2006-01-02 15:04 MST"), m.CPUs, m.OS, m.Arch, m.Go, m.Host)
	if smoke {
		b.WriteString("\n**Smoke run: sizes are tiny and the figures mean nothing.**\n")
	}
	b.WriteString("\nEach baseline ran in the same run on the same machine; the ratio is the target (issue #6).\n\n")
	b.WriteString("| hot path | figure | baseline | ratio | target | met | note |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rows {
		ratio := "—"
		if r.Ratio != 0 {
			ratio = fmt.Sprintf("%.2f×", r.Ratio)
		}
		met := "no"
		switch {
		case smoke:
			met = "n/a (smoke)"
		case r.Met:
			met = "yes"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n",
			cell(r.Path), cell(r.Figure), cell(r.Baseline), ratio, cell(r.Target), met, cell(r.Note))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// cell keeps a value inside its Markdown table cell.
func cell(s string) string {
	if s == "" {
		return "—"
	}
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}
