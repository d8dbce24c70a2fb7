// Package daemon is the one place that opens a store, wires the services to
// it, starts the sweepers and the HTTP server, and stops them in order.
package daemon

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/vigil-fleet/vigil/internal/auth"
	"github.com/vigil-fleet/vigil/internal/clock"
	"github.com/vigil-fleet/vigil/internal/dashboard"
	"github.com/vigil-fleet/vigil/internal/events"
	"github.com/vigil-fleet/vigil/internal/httpapi"
	"github.com/vigil-fleet/vigil/internal/lease"
	"github.com/vigil-fleet/vigil/internal/liveness"
	"github.com/vigil-fleet/vigil/internal/mcpserver"
	"github.com/vigil-fleet/vigil/internal/metrics"
	"github.com/vigil-fleet/vigil/internal/registry"
	"github.com/vigil-fleet/vigil/internal/snapshot"
	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/internal/sweeper"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// Defaults for Config; the CLI flags show the same values.
const (
	// AddrDefault is where the API listens: loopback only.
	AddrDefault = "127.0.0.1:7711"
	// DBDefault is the embedded SQLite file, relative to the working directory.
	DBDefault = "vigil.db"
	// SweepIntervalDefault is how often the lease reclaimer runs. A holder
	// that shows stopped loses its task within this long.
	SweepIntervalDefault = 5 * time.Second
	// ShutdownGraceDefault bounds how long in-flight requests may finish at stop.
	ShutdownGraceDefault = 10 * time.Second
)

// Config configures a Daemon. Zero fields take the defaults above and those
// of package lease.
type Config struct {
	DB   string // SQLite file path, or postgres:// URL (VIGIL_DB)
	Addr string // HOST:PORT; port 0 picks a free one
	// TokenFile, AgentTokenFile and ReadTokenFile hold the bearer tokens
	// of the operator, agent and read roles (auth.ParseTokens: one a line,
	// re-read when they change). None: no auth, loopback only, every
	// request the operator's. The agent and read files need TokenFile.
	TokenFile      string
	AgentTokenFile string
	ReadTokenFile  string
	// AllowedHosts are Host header values served besides the listen
	// address, the loopback names and the machine's own names
	// (--allowed-host): NAME for any port, NAME:PORT for one.
	AllowedHosts []string
	LeaseTimeout time.Duration      // lease window without heartbeat (lease.LeaseTimeoutDefault)
	LeaseExpiry  lease.ExpiryPolicy // what expiry counts from (lease.ExpiryMax when empty; DESIGN T4)
	// ActivityStaleness: a running task's activity older than this shows it
	// stalled on read (vigiltype.ActivityStalenessDefault when 0; DESIGN T6).
	ActivityStaleness time.Duration
	SweepInterval     time.Duration // lease reclaimer period (SweepIntervalDefault)
	ShutdownGrace     time.Duration // in-flight requests' time to finish at stop (ShutdownGraceDefault)
	Clock             clock.Clock   // the local clock; clock.Real when nil (followed to the database's on PostgreSQL)
	Logger            *slog.Logger  // slog.Default() when nil
	// GroupCommit tunes the group commit of liveness heartbeats (zero:
	// liveness's defaults). NoGroupCommit turns it off: each heartbeat is
	// then a transaction of its own (for measuring it; issue #6).
	GroupCommit   liveness.GroupCommitConfig
	NoGroupCommit bool
	// PulseGap is how long the store may go without a pulse before the
	// interval counts as an outage (liveness.PulseGapDefault when zero;
	// negative: no pulse, for tests on a fake clock whose jumps are not
	// outages). DESIGN L8.
	PulseGap time.Duration
	// NoListen wires the services to the store and nothing more: no port
	// is bound and Start serves no HTTP (vigil mcp, which speaks on stdio).
	// Addr is then not used; the daemon's Addr and URL are "".
	NoListen bool
	// TLSCertFile and TLSKeyFile, both or neither, make the server speak
	// HTTPS with this certificate (chain) and key, PEM (--tls-cert,
	// --tls-key). The pair is read again when either file changes (looked
	// at no more than every TLSCheckIntervalDefault) and on ReloadTLS, so a
	// certificate rotates without a restart; a pair that does not load is
	// an error at New and a warning later, the previous pair kept.
	TLSCertFile string
	TLSKeyFile  string
	// InsecureListen allows a non-loopback Addr without TLS
	// (--insecure-listen): for a server behind a TLS-terminating proxy on
	// a network its clients cannot reach directly.
	InsecureListen bool
}

// Daemon is a running vigil server.
type Daemon struct {
	cfg      Config
	store    store.Store
	synced   *clock.Synced // the database's clock, on a shared backend
	Liveness *liveness.Service
	Registry *registry.Service
	Events   *events.Service
	Metrics  *metrics.Metrics
	Lease    *lease.Service
	Snapshot *snapshot.Service
	sweepers []*sweeper.Sweeper
	pulser   *liveness.Pulser // nil when Config.PulseGap < 0
	listener net.Listener
	server   *http.Server
	certs    *certReloader // nil without TLS
	served   chan error

	stopOnce sync.Once
	stopErr  error
}

// New validates cfg, opens the store (running migrations), wires the
// services and binds the listener (unless cfg.NoListen); nothing runs until
// Start.
func New(ctx context.Context, cfg Config) (*Daemon, error) {
	cfg.DB = cmp.Or(cfg.DB, DBDefault)
	cfg.Addr = cmp.Or(cfg.Addr, AddrDefault)
	cfg.SweepInterval = cmp.Or(cfg.SweepInterval, SweepIntervalDefault)
	cfg.ShutdownGrace = cmp.Or(cfg.ShutdownGrace, ShutdownGraceDefault)
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.SweepInterval < 0 {
		return nil, fmt.Errorf("--sweep-interval must be positive, got %s", cfg.SweepInterval)
	}
	if cfg.LeaseTimeout < 0 {
		return nil, fmt.Errorf("--lease-timeout must be positive, got %s", cfg.LeaseTimeout)
	}
	keyring, err := auth.Load(auth.Files{Operator: cfg.TokenFile, Agent: cfg.AgentTokenFile, Read: cfg.ReadTokenFile}, cfg.Logger)
	if err != nil {
		return nil, err
	}
	if err := checkTLSFlags(cfg.TLSCertFile, cfg.TLSKeyFile); err != nil {
		return nil, err
	}
	if !cfg.NoListen {
		if err := checkExposure(cfg.Addr, keyring != nil); err != nil {
			return nil, err
		}
		if err := CheckAllowedHosts(cfg.AllowedHosts); err != nil {
			return nil, err
		}
		if err := checkTransport(cfg.Addr, cfg.TLSCertFile != "", cfg.InsecureListen); err != nil {
			return nil, err
		}
	}
	var certs *certReloader
	if cfg.TLSCertFile != "" && !cfg.NoListen {
		if certs, err = newCertReloader(cfg.TLSCertFile, cfg.TLSKeyFile, TLSCheckIntervalDefault, cfg.Clock.Now, cfg.Logger); err != nil {
			return nil, err
		}
	}

	st, err := openStore(ctx, cfg.DB)
	if err != nil {
		return nil, fmt.Errorf("--db: %w", err) // err names the store, password masked
	}
	d := &Daemon{cfg: cfg, store: st, certs: certs}
	if dbc, ok := st.(store.Clocked); ok {
		// Several servers may share this database: all follow its clock.
		d.synced, err = clock.NewSynced(ctx, cfg.Clock, dbc.Now, 0, cfg.Logger)
		if err != nil {
			st.Close()
			return nil, fmt.Errorf("--db %s: %w", redactDSN(cfg.DB), err)
		}
		d.cfg.Clock = d.synced
		cfg.Clock = d.synced
	}
	d.Liveness = liveness.New(st, cfg.Clock)
	if !cfg.NoGroupCommit {
		if err := d.Liveness.EnableGroupCommit(cfg.GroupCommit); err != nil {
			st.Close()
			return nil, err
		}
	}
	d.Registry = registry.New(st, cfg.Clock)
	d.Events = events.New(st, cfg.Clock)
	d.Metrics = metrics.New(st, cfg.Clock, cfg.Logger)
	d.Events.Recorded = func(k vigiltype.EventKind) { d.Metrics.Events.WithLabelValues(string(k)).Inc() }
	var pulser *liveness.Pulser
	if cfg.PulseGap >= 0 {
		pulser = liveness.NewPulser(st, cfg.Clock, cmp.Or(cfg.PulseGap, liveness.PulseGapDefault), cfg.Logger)
		d.pulser = pulser
	}
	d.Lease, err = lease.New(lease.Config{
		Store: st, Liveness: d.Liveness, Clock: cfg.Clock,
		LeaseTimeout: cfg.LeaseTimeout, ExpiryPolicy: cfg.LeaseExpiry, Pulser: pulser,
		ActivityStaleness: cfg.ActivityStaleness,
	})
	if err != nil {
		st.Close()
		return nil, err
	}
	d.Lease.Reclaimed = func(n int) { d.Metrics.LeasesReclaimed.Add(float64(n)) }
	reclaimer, err := sweeper.New(sweeper.Config{
		Name: "lease_reclaimer", Interval: cfg.SweepInterval, Pass: d.Lease.Reclaim,
		Store: st, Clock: cfg.Clock, Logger: cfg.Logger,
	})
	if err != nil {
		st.Close()
		return nil, err
	}
	d.sweepers = append(d.sweepers, reclaimer)
	if pulser != nil {
		pulse, err := sweeper.New(sweeper.Config{
			Name: "store_pulse", Interval: liveness.PulseIntervalDefault, Pass: pulser.Pass,
			Store: st, Clock: cfg.Clock, Logger: cfg.Logger,
		})
		if err != nil {
			st.Close()
			return nil, err
		}
		d.sweepers = append(d.sweepers, pulse)
	}
	d.Snapshot, err = snapshot.New(snapshot.Config{
		Registry: d.Registry, Liveness: d.Liveness,
		Tasks: snapshot.LeaseTasks(d.Lease), Events: snapshot.EventLog(d.Events), Clock: cfg.Clock,
	})
	if err != nil {
		st.Close()
		return nil, err
	}

	if cfg.NoListen {
		return d, nil
	}
	d.listener, err = net.Listen("tcp", cfg.Addr)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("listen on %s: %w", cfg.Addr, err)
	}
	hosts, err := servedHosts(cfg.Addr, d.listener.Addr().String(), cfg.AllowedHosts)
	if err != nil {
		d.listener.Close()
		st.Close()
		return nil, err
	}
	handler, err := httpapi.New(httpapi.Config{
		Liveness: d.Liveness, Lease: d.Lease, Registry: d.Registry, Events: d.Events,
		Snapshot: d.Snapshot, Store: st, Logger: cfg.Logger, Keyring: keyring, Metrics: d.Metrics,
		Hosts: hosts,
		Timeline: &dashboard.Service{
			Registry: d.Registry, Liveness: d.Liveness, Events: d.Events, Now: cfg.Clock.Now,
		},
		Dashboard: dashboard.Handler(),
		MCP: mcpserver.Handler(mcpserver.New(mcpserver.Deps{
			Liveness: d.Liveness, Events: d.Events, Snapshot: d.Snapshot, Sweepers: st,
		})),
	})
	if err != nil {
		d.listener.Close()
		st.Close()
		return nil, err
	}
	d.server = &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second, // a client trickling a body cannot hold a connection
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
	}
	if certs != nil {
		d.server.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.GetCertificate}
	}
	return d, nil
}

// Addr is the address the API listens on (with the real port when 0 was
// asked); "" with Config.NoListen.
func (d *Daemon) Addr() string {
	if d.listener == nil {
		return ""
	}
	return d.listener.Addr().String()
}

// URL is the API's base URL for a client on this machine, e.g.
// http://127.0.0.1:7711, or https:// with TLS ("" with Config.NoListen).
// Listening on every interface (0.0.0.0, [::]) it names 127.0.0.1: the
// server does not answer for the unspecified address as a Host.
func (d *Daemon) URL() string {
	if d.listener == nil {
		return ""
	}
	scheme := "http://"
	if d.certs != nil {
		scheme = "https://"
	}
	host, port, err := net.SplitHostPort(d.Addr())
	if ip := net.ParseIP(host); err == nil && ip != nil && ip.IsUnspecified() {
		return scheme + net.JoinHostPort("127.0.0.1", port)
	}
	return scheme + d.Addr()
}

// ReloadTLS reads the --tls-cert and --tls-key files again (SIGHUP): new
// connections get the new certificate, open ones keep theirs. When the
// pair does not load, the previous one stays in service, a warning is
// logged and the error returned. Without TLS it does nothing.
func (d *Daemon) ReloadTLS() error {
	if d.certs == nil {
		return nil
	}
	return d.certs.Reload()
}

// Store is the daemon's open store (for tests and in-process tools).
func (d *Daemon) Store() store.Store { return d.store }

// Start serves the API (unless Config.NoListen) and starts the sweepers;
// they run until Stop.
func (d *Daemon) Start(ctx context.Context) {
	d.served = make(chan error, 1)
	if d.pulser != nil {
		// One pulse before anything is served or swept: the time this
		// server was down (or the store away) is found before any
		// instance is judged, and a store that never had a pulse gets its
		// first now, so that a server stopped a moment later leaves a
		// gap the next one can see (DESIGN L8).
		if _, err := d.pulser.Pass(ctx); err != nil {
			d.cfg.Logger.Error("first store pulse failed; the store_pulse sweeper retries every second", "err", err)
		}
	}
	d.Liveness.Start(ctx) // before serving: heartbeats are committed in groups from the first
	if d.server != nil {
		if d.certs != nil {
			go func() { d.served <- d.server.ServeTLS(d.listener, "", "") }() // the certificate comes from TLSConfig
		} else {
			go func() { d.served <- d.server.Serve(d.listener) }()
		}
	}
	if d.synced != nil {
		d.synced.Start(ctx)
	}
	for _, s := range d.sweepers {
		s.Start(ctx)
	}
	d.cfg.Logger.Info("vigil serving", "url", d.URL(), "db", redactDSN(d.cfg.DB),
		"lease_timeout", d.Lease.LeaseTimeout(), "lease_expiry", d.Lease.ExpiryPolicy(),
		"sweep_interval", d.cfg.SweepInterval)
}

// Stop stops the sweepers, lets in-flight requests finish (ShutdownGrace),
// and closes the store. It is idempotent: later calls return the first's error.
func (d *Daemon) Stop() error {
	d.stopOnce.Do(func() { d.stopErr = d.stop() })
	return d.stopErr
}

func (d *Daemon) stop() error {
	for _, s := range d.sweepers {
		s.Stop()
	}
	if d.synced != nil {
		d.synced.Stop()
	}
	var err error
	if d.server != nil {
		err = d.stopServer()
	}
	// After the server: in-flight heartbeats are committed in groups to the end.
	d.Liveness.Stop()
	err = errors.Join(err, d.store.Close())
	d.cfg.Logger.Info("vigil stopped", "err", err)
	return err
}

// stopServer lets in-flight requests finish (ShutdownGrace), then closes
// what is left, and collects Serve's error.
func (d *Daemon) stopServer() error {
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.ShutdownGrace)
	defer cancel()
	err := d.server.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		// Requests still running after the grace are cut off: stopping is
		// what the operator asked for, not a failure.
		d.cfg.Logger.Warn("closing connections still open after the shutdown grace", "grace", d.cfg.ShutdownGrace)
		err = d.server.Close()
	}
	if d.served != nil {
		if serr := <-d.served; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
			err = errors.Join(err, serr)
		}
	}
	return err
}

// Run starts the daemon and blocks until ctx ends or the server fails.
func (d *Daemon) Run(ctx context.Context) error {
	d.Start(ctx)
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-d.served:
		d.served <- serveErr // Stop reads it again
	}
	return errors.Join(serveErr, d.Stop())
}

// CheckAllowedHosts validates --allowed-host values (NAME or NAME:PORT).
func CheckAllowedHosts(hosts []string) error {
	for _, h := range hosts {
		if _, _, err := httpapi.ParseHostEntry(h); err != nil {
			return fmt.Errorf("--allowed-host: %w", err)
		}
	}
	return nil
}

// servedHosts are the Host values the API answers for (httpapi.ServedHosts
// on the bound address), plus the name the listen address was given as
// (--addr vigil.internal:7711), with the bound port.
func servedHosts(configured, bound string, allowed []string) ([]string, error) {
	hosts, err := httpapi.ServedHosts(bound, allowed)
	if err != nil {
		return nil, err
	}
	name, _, err := net.SplitHostPort(configured)
	if err != nil {
		return nil, fmt.Errorf("--addr %q: must be HOST:PORT: %w", configured, err)
	}
	if ip := net.ParseIP(name); name != "" && (ip == nil || !ip.IsUnspecified()) {
		_, port, _ := net.SplitHostPort(bound)
		hosts = append(hosts, net.JoinHostPort(name, port))
	}
	return hosts, nil
}

// checkExposure refuses a non-loopback listen address without tokens.
func checkExposure(addr string, tokens bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--addr %q: must be HOST:PORT: %w", addr, err)
	}
	if tokens {
		return nil
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("--addr %q is not a loopback address: refusing to serve without --token-file", addr)
}

// checkTransport refuses a non-loopback listen address without TLS: tokens
// and data would cross the network in clear text. --insecure-listen allows
// it, for a server behind a TLS-terminating proxy.
func checkTransport(addr string, tls, insecure bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--addr %q: must be HOST:PORT: %w", addr, err)
	}
	if tls || insecure || isLoopbackHost(host) {
		return nil
	}
	return fmt.Errorf("--addr %q is not a loopback address: refusing to serve plain HTTP, which sends tokens in clear text; "+
		"give --tls-cert and --tls-key, or --insecure-listen when a TLS-terminating proxy is in front", addr)
}

// isLoopbackHost reports whether host (of HOST:PORT) is localhost or a
// loopback address; "" (every interface) is not.
func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
