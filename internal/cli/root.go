// Package cli is the vigil command line (cobra), one file per command.
// Server commands (serve, up) run the daemon in-process; every other command
// is a client of the HTTP API (--server, env VIGIL_URL).
package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// Exit codes.
const (
	exitOK       = 0
	exitFailure  = 1 // the command failed
	exitNotFound = 3 // the thing asked about does not exist (e.g. `vigil status KIND`)
)

// exitError makes Main exit with code after printing err.
type exitError struct {
	err  error
	code int
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// version is the module version vigil was built as, with the VCS revision
// when the build recorded one ("(devel)" for a plain go build).
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := info.Main.Version
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " (" + s.Value[:12] + ")"
		}
	}
	return v
}

// Main runs the CLI with args and returns the process exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := NewRoot(stdin, stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, "vigil:", err)
	if errors.Is(err, vigiltype.ErrUnauthorized) {
		fmt.Fprintln(stderr, "vigil: this server needs its bearer token: --token-file FILE (env VIGIL_TOKEN_FILE), the file the server was started with")
	}
	if err != nil && strings.Contains(err.Error(), "HTTP request to an HTTPS server") {
		fmt.Fprintln(stderr, "vigil: the server speaks HTTPS: use --server https://… (with --ca-file FILE if a private CA signed its certificate)")
	}
	if certificateError(err) {
		fmt.Fprintln(stderr, "vigil: the server's certificate is not trusted: --ca-file FILE (env VIGIL_CA_FILE), the CA certificate that signed it")
	}
	if errors.Is(err, vigiltype.ErrForbidden) {
		fmt.Fprintln(stderr, "vigil: this token's role may not do that: use a token of the role the message names (--token-file FILE, env VIGIL_TOKEN_FILE; an operator token may do everything)")
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return exitFailure
}

// certificateError reports whether err is a TLS client's refusal of the
// server's certificate (unknown CA, wrong name, expired).
func certificateError(err error) bool {
	var verify *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var name x509.HostnameError
	var invalid x509.CertificateInvalidError
	return errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &name) || errors.As(err, &invalid)
}

// NewRoot builds the command tree.
func NewRoot(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "vigil",
		Short: "Keep watch over a fleet of always-on agent processes",
		Long: `vigil keeps watch over fleets of always-on agent processes: which process
instances are up, which tasks each one holds under a lease and whether that
work progresses, and it restarts what crashes.

Start a server with its example fleet:   vigil up --fleet examples/fleet.yaml
Then ask it:                             vigil ps; vigil tasks ls; vigil sweepers`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version(),
	}
	root.SetFlagErrorFunc(flagError)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddGroup(
		&cobra.Group{ID: "server", Title: "Server:"},
		&cobra.Group{ID: "query", Title: "Processes, tasks, agents and events:"},
	)
	root.AddCommand(
		newServeCmd(), newUpCmd(), newSuperviseCmd(), newMigrateCmd(),
		newPsCmd(), newStatusCmd(), newPruneCmd(), withSessionCmds(newTasksCmd()), newSweepersCmd(),
		newHeartbeatCmd(), newTouchActivityCmd(), newRunCmd(), newWatchdogCmd(),
		newAgentsCmd(), newEventsCmd(), newStopCmd(), newStartCmd(), newRestartCmd(),
		newLogsCmd(), newSnapshotCmd(), newMCPCmd(), newBenchCmd(),
	)
	return root
}

// oneArg is cobra.ExactArgs(1) with errors that name the argument, read
// from the command's Use line ("status KIND": "missing KIND").
func oneArg(cmd *cobra.Command, args []string) error {
	name := "argument"
	if f := strings.Fields(cmd.Use); len(f) > 1 {
		name = f[1]
	}
	switch {
	case len(args) == 0:
		return fmt.Errorf("missing %s (usage: %s)", name, cmd.UseLine())
	case len(args) > 1:
		return fmt.Errorf("%s takes one %s, not %d arguments (usage: %s)", cmd.CommandPath(), name, len(args), cmd.UseLine())
	}
	return nil
}

// flagError rewrites a flag parsing error's strconv text into words:
// `invalid argument "abc" for "--limit" flag: not a whole number`.
func flagError(cmd *cobra.Command, err error) error {
	msg := strconvSyntax.ReplaceAllStringFunc(err.Error(), func(m string) string {
		switch {
		case strings.HasPrefix(m, "strconv.ParseInt"), strings.HasPrefix(m, "strconv.ParseUint"):
			return "not a whole number"
		case strings.HasPrefix(m, "strconv.ParseFloat"):
			return "not a number"
		case strings.HasPrefix(m, "strconv.ParseBool"):
			return "not true or false"
		}
		return m
	})
	return fmt.Errorf("%s (see '%s --help')", msg, cmd.CommandPath())
}

var strconvSyntax = regexp.MustCompile(`strconv\.Parse(Int|Uint|Float|Bool): parsing "[^"]*": (invalid syntax|value out of range)`)
