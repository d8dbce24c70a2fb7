package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/vigil-fleet/vigil/internal/auth"
	"github.com/vigil-fleet/vigil/vigilclient"
)

// URLDefault is the server the client commands talk to when neither
// --server nor VIGIL_URL says otherwise.
const URLDefault = "http://127.0.0.1:7711"

// clientFlags are shared by every command that talks to a server.
type clientFlags struct {
	server    string
	tokenFile string
	json      bool
	caFile    string
}

func (f *clientFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.server, "server", envOr("VIGIL_URL", URLDefault),
		"vigil server URL; several comma-separated URLs are tried in turn (env VIGIL_URL)")
	fs.StringVar(&f.tokenFile, "token-file", os.Getenv("VIGIL_TOKEN_FILE"),
		"file holding the bearer token to send, its first token if several (env VIGIL_TOKEN_FILE); "+
			"commands that change the fleet need an operator token, reads any role's")
	fs.BoolVar(&f.json, "json", false, "print JSON for scripts instead of a table")
	fs.StringVar(&f.caFile, "ca-file", os.Getenv("VIGIL_CA_FILE"),
		"PEM file of the CA certificates to trust for an https:// --server, instead of the system's (env VIGIL_CA_FILE)")
}

func (f *clientFlags) client() (*vigilclient.Client, error) {
	var opts []vigilclient.Option
	if f.tokenFile != "" {
		token, err := auth.ReadClientToken(f.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		opts = append(opts, vigilclient.WithToken(token))
	}
	if f.caFile != "" {
		tc, err := vigilclient.LoadCAFile(f.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file (env VIGIL_CA_FILE): %w", err)
		}
		opts = append(opts, vigilclient.WithTLSConfig(tc))
	}
	var urls []string
	for _, u := range strings.Split(f.server, ",") {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, u)
		}
	}
	c, err := vigilclient.New(urls, opts...)
	if err != nil {
		return nil, fmt.Errorf("--server (env VIGIL_URL): %w", err)
	}
	return c, nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table writes rows aligned in columns under an upper-case header. Control
// characters in cells are shown escaped, so a value cannot break the table
// or drive the terminal.
func table(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		cells := make([]string, len(r))
		for i, c := range r {
			cells[i] = printable(c)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// printable escapes control characters and invalid UTF-8 in s (Go syntax,
// e.g. \x1b), leaving other text as it is.
func printable(s string) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, unicode.IsControl) < 0 {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			fmt.Fprintf(&b, "\\x%02x", s[i])
		case unicode.IsControl(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// ago renders how long before now t was, e.g. "4s ago", or "-" for nil.
func ago(t *time.Time, now time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	d := now.Sub(*t)
	if d < 0 {
		d = 0
	}
	return humanDuration(d) + " ago"
}

func humanDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.0fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func orDash[T any](p *T, format func(T) string) string {
	if p == nil {
		return "-"
	}
	return format(*p)
}

// checkLimit validates a --limit flag: the API takes 1–1000 rows per page.
func checkLimit(n int) error {
	if n < 1 || n > 1000 {
		return fmt.Errorf("--limit %d: must be between 1 and 1000", n)
	}
	return nil
}
