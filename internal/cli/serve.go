package cli

import (
	"cmp"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/vigil-fleet/vigil/internal/daemon"
	"github.com/vigil-fleet/vigil/internal/lease"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// sweepIntervalMin keeps a typo (1ns) from turning the reclaimer into a busy loop.
const sweepIntervalMin = 10 * time.Millisecond

// serverFlags are the flags shared by serve and up.
type serverFlags struct {
	db            string
	addr          string
	tokenFile     string
	agentToken    string
	readToken     string
	allowedHosts  []string
	leaseTimeout  time.Duration
	leaseExpiry   string
	staleness     time.Duration
	sweepInterval time.Duration
	logLevel      string
	logFormat     string

	// TLS: --tls-cert, --tls-key, --insecure-listen.
	tlsCert        string
	tlsKey         string
	insecureListen bool
}

func (f *serverFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.db, "db", envOr("VIGIL_DB", daemon.DBDefault),
		"store: an SQLite file (created if missing) or a postgres://user@host/db URL that several servers may share (env VIGIL_DB)")
	fs.StringVar(&f.addr, "addr", envOr("VIGIL_ADDR", daemon.AddrDefault),
		"HOST:PORT to serve the API on; a non-loopback address needs --token-file and --tls-cert/--tls-key (or --insecure-listen behind a TLS proxy) (env VIGIL_ADDR)")
	fs.StringVar(&f.tokenFile, "token-file", os.Getenv("VIGIL_TOKEN_FILE"),
		"file of operator tokens: one a line (16+ chars; blank lines and # comments skipped; several while rotating), "+
			"re-read when it changes; with any token file every endpoint but /healthz and the dashboard page needs a token (env VIGIL_TOKEN_FILE)")
	fs.StringVar(&f.agentToken, "agent-token-file", os.Getenv("VIGIL_AGENT_TOKEN_FILE"),
		"file of agent tokens, same format: register, heartbeat, exit, claim, lease calls, enqueue, events, reads; "+
			"not registry writes, stops, acks, prune or reclaim (needs --token-file; env VIGIL_AGENT_TOKEN_FILE)")
	fs.StringVar(&f.readToken, "read-token-file", os.Getenv("VIGIL_READ_TOKEN_FILE"),
		"file of read tokens, same format: GETs, the dashboard, /metrics, MCP (needs --token-file; env VIGIL_READ_TOKEN_FILE)")
	fs.StringArrayVar(&f.allowedHosts, "allowed-host", nil,
		"a Host name clients may use besides the listen address, localhost, 127.0.0.1, [::1] and this machine's hostname "+
			"(and, listening on 0.0.0.0 or [::], its interface addresses): NAME for any port or NAME:PORT; repeatable. "+
			"Requests naming any other Host get 421 (DNS rebinding). E.g. the name behind a proxy or in an ssh tunnel")
	fs.DurationVar(&f.leaseTimeout, "lease-timeout", lease.LeaseTimeoutDefault,
		"reclaim a task lease after this long without a lease heartbeat (DESIGN T3)")
	fs.StringVar(&f.leaseExpiry, "lease-expiry", string(lease.ExpiryMax),
		"what a lease's expiry counts from: max (MAX(activity, heartbeat); the transition default), activity (v2 leases on activity alone; DESIGN T4) or activity-only (the cutover: v1 heartbeats no longer extend a lease; check `vigil heartbeat versions` first; DESIGN T6)")
	fs.DurationVar(&f.staleness, "activity-staleness", vigiltype.ActivityStalenessDefault,
		"a running task whose holder reports activity (v2 heartbeats) shows stalled once its last activity is older than this while its lease is still renewed (DESIGN T6)")
	fs.DurationVar(&f.sweepInterval, "sweep-interval", daemon.SweepIntervalDefault,
		"how often the lease reclaimer runs; a stopped holder loses its task within this")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&f.tlsCert, "tls-cert", os.Getenv("VIGIL_TLS_CERT"),
		"serve HTTPS with this PEM certificate (the server's first, then any intermediates); re-read when it changes or on SIGHUP; needs --tls-key (env VIGIL_TLS_CERT)")
	fs.StringVar(&f.tlsKey, "tls-key", os.Getenv("VIGIL_TLS_KEY"),
		"the PEM private key of --tls-cert; re-read with it (env VIGIL_TLS_KEY)")
	fs.BoolVar(&f.insecureListen, "insecure-listen", false,
		"allow a non-loopback --addr without --tls-cert: only behind a TLS-terminating proxy, on a network clients cannot reach directly")
}

// config validates the flags and returns the daemon config and logger.
func (f *serverFlags) config(cmd *cobra.Command) (daemon.Config, *slog.Logger, error) {
	logger, err := newLogger(cmd, f.logLevel, f.logFormat)
	if err != nil {
		return daemon.Config{}, nil, err
	}
	if f.leaseTimeout <= 0 {
		return daemon.Config{}, nil, fmt.Errorf("--lease-timeout must be positive, got %s", f.leaseTimeout)
	}
	if !lease.ExpiryPolicy(f.leaseExpiry).Valid() {
		return daemon.Config{}, nil, fmt.Errorf("--lease-expiry %q: must be max, activity or activity-only", f.leaseExpiry)
	}
	if f.staleness < time.Second {
		return daemon.Config{}, nil, fmt.Errorf("--activity-staleness must be at least 1s, got %s", f.staleness)
	}
	if err := daemon.CheckAllowedHosts(f.allowedHosts); err != nil {
		return daemon.Config{}, nil, err
	}
	if f.sweepInterval < sweepIntervalMin {
		return daemon.Config{}, nil, fmt.Errorf("--sweep-interval must be at least %s, got %s", sweepIntervalMin, f.sweepInterval)
	}
	return daemon.Config{
		DB: f.db, Addr: f.addr, TokenFile: f.tokenFile, AgentTokenFile: f.agentToken, ReadTokenFile: f.readToken,
		AllowedHosts: f.allowedHosts,
		LeaseTimeout: f.leaseTimeout, LeaseExpiry: lease.ExpiryPolicy(f.leaseExpiry),
		SweepInterval: f.sweepInterval, ActivityStaleness: f.staleness, Logger: logger,
		TLSCertFile: f.tlsCert, TLSKeyFile: f.tlsKey, InsecureListen: f.insecureListen,
	}, logger, nil
}

func newServeCmd() *cobra.Command {
	var f serverFlags
	cmd := &cobra.Command{
		Use:     "serve",
		GroupID: "server",
		Short:   "Run the vigil server: HTTP API and lease sweepers over SQLite or PostgreSQL",
		Long: `Run the vigil server: the HTTP JSON API under /v1 (docs/api.md), /healthz,
and the lease reclaimer. The store is an embedded SQLite file (WAL) for one
host, or a PostgreSQL database when the fleet spans hosts: several servers
may then share it, each reclaimed lease is acted on once, and every server
follows the database's clock. Migrations run at start.

Agents register and heartbeat against it with the Go client (vigilclient) or
plain HTTP. Stop it with Ctrl-C or SIGTERM.

Browsers (docs/security.md): a request whose Host is not one the server
answers for gets 421, except /healthz; those are the listen address, the
loopback names (localhost, 127.0.0.1, [::1]) and this machine's hostname
with the listen port, every interface address when listening on 0.0.0.0 or
[::], and each --allowed-host. A request from another web origin (Origin or
Sec-Fetch-Site) gets 403, except GETs of the dashboard's page and assets,
and a /v1 write must be Content-Type: application/json (415 otherwise).

TLS: with --tls-cert and --tls-key the API, /metrics, /mcp and the dashboard
are served over HTTPS only. The pair is read again when either file changes
(looked at no more than every 5s, on a new connection) or on SIGHUP, so a
certificate rotates without a restart; a pair that does not load then keeps
the previous one (a warning is logged). A non-loopback --addr needs TLS, or
--insecure-listen when a TLS-terminating proxy is in front. Clients of a
server whose certificate a private CA signed are given that CA: --ca-file or
VIGIL_CA_FILE (docs/security.md).

Roles (docs/security.md): --token-file holds the operator's tokens (every
call), --agent-token-file the agents' (their own instances, tasks and
events, and reads), --read-token-file read-only ones (the dashboard,
/metrics, MCP). Registry writes, stops, planned stops, acks, prune and
reclaim are the operator's; the holder of a task may reclaim it with its
instance token. A call the token's role may not make gets 403 forbidden.
Without any token file the server listens on loopback only and every
request is the operator's. Each file holds one token a line; to rotate,
add the new token, move clients to it, then remove the old one: the server
re-reads a file within a second of a change. Every write is logged with
its route, role and instance (msg=audit).`,
		Example: `  vigil serve
  vigil serve --db /var/lib/vigil/vigil.db --addr 127.0.0.1:7711
  vigil serve --db postgres://vigil@db.internal/vigil --addr 0.0.0.0:7711 --token-file /etc/vigil/token --tls-cert /etc/vigil/cert.pem --tls-key /etc/vigil/key.pem
  vigil serve --addr 0.0.0.0:7711 --token-file /etc/vigil/token --allowed-host vigil.internal --insecure-listen   # behind a TLS-terminating proxy
  vigil serve --addr 0.0.0.0:7711 --token-file /etc/vigil/operator --agent-token-file /etc/vigil/agent --read-token-file /etc/vigil/read --tls-cert /etc/vigil/cert.pem --tls-key /etc/vigil/key.pem`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, _, err := f.config(cmd)
			if err != nil {
				return err
			}
			d, err := daemon.New(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			defer reloadTLSOnHangup(d, cfg)()
			return d.Run(cmd.Context())
		},
	}
	f.register(cmd.Flags())
	return cmd
}

// reloadTLSOnHangup makes SIGHUP re-read the certificate pair of a TLS
// server (the daemon logs the outcome) until the returned func is called.
// Without TLS it does nothing, and SIGHUP keeps its default action.
func reloadTLSOnHangup(d *daemon.Daemon, cfg daemon.Config) (stop func()) {
	if cfg.TLSCertFile == "" {
		return func() {}
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-hup:
				_ = d.ReloadTLS() // logged by the daemon; the previous pair stays in service
			case <-done:
				return
			}
		}
	}()
	return func() { signal.Stop(hup); close(done) }
}

func newLogger(cmd *cobra.Command, level, format string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: must be debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: must be text or json", format)
}

func envOr(name, def string) string { return cmp.Or(os.Getenv(name), def) }
