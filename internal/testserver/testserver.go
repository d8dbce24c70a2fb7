// Package testserver starts a real vigil server for tests: the real HTTP
// server on a loopback port over a real SQLite file in t.TempDir(), stopped
// by t.Cleanup.
package testserver

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/vigil-fleet/vigil/internal/clock"
	"github.com/vigil-fleet/vigil/internal/daemon"
	"github.com/vigil-fleet/vigil/internal/lease"
)

// Server is a running test server.
type Server struct {
	*daemon.Daemon
	URL string // e.g. http://127.0.0.1:41234 (https:// WithTLS)
}

// Option adjusts the daemon config.
type Option func(*daemon.Config)

// WithLeaseTimeout sets the server-wide lease window.
func WithLeaseTimeout(d time.Duration) Option {
	return func(c *daemon.Config) { c.LeaseTimeout = d }
}

// WithLeaseExpiry sets the lease expiry policy (DESIGN T4).
func WithLeaseExpiry(p lease.ExpiryPolicy) Option {
	return func(c *daemon.Config) { c.LeaseExpiry = p }
}

// WithSweepInterval sets how often the lease reclaimer runs.
func WithSweepInterval(d time.Duration) Option {
	return func(c *daemon.Config) { c.SweepInterval = d }
}

// WithClock makes the server read time from clk. The store pulse is off
// (daemon.Config.PulseGap < 0): a fake clock's jumps are not store outages.
func WithClock(clk clock.Clock) Option {
	return func(c *daemon.Config) { c.Clock, c.PulseGap = clk, -1 }
}

// WithPulseGap sets the gap in the store's pulse that counts as an outage
// (DESIGN L8); after WithClock it turns the pulse back on.
func WithPulseGap(d time.Duration) Option {
	return func(c *daemon.Config) { c.PulseGap = d }
}

// WithDB serves from db: an SQLite path or a postgres:// URL (see
// pgtest.URL for a fresh PostgreSQL schema per test).
func WithDB(db string) Option {
	return func(c *daemon.Config) { c.DB = db }
}

// WithTokenFile requires the bearer token stored in path.
func WithTokenFile(path string) Option {
	return func(c *daemon.Config) { c.TokenFile = path }
}

// WithRoleTokenFiles requires bearer tokens: the operator's, the agent
// role's and the read role's, each from its file ("" for none).
func WithRoleTokenFiles(operator, agent, read string) Option {
	return func(c *daemon.Config) { c.TokenFile, c.AgentTokenFile, c.ReadTokenFile = operator, agent, read }
}

// WithLogger sends the server's log to logger (to read its audit lines).
func WithLogger(logger *slog.Logger) Option {
	return func(c *daemon.Config) { c.Logger = logger }
}

// WithAllowedHosts serves these Host values too (--allowed-host).
func WithAllowedHosts(hosts ...string) Option {
	return func(c *daemon.Config) { c.AllowedHosts = hosts }
}

// WithTLS serves HTTPS with this certificate and key (--tls-cert,
// --tls-key); testcert makes them. The URL is then https://.
func WithTLS(certFile, keyFile string) Option {
	return func(c *daemon.Config) { c.TLSCertFile, c.TLSKeyFile = certFile, keyFile }
}

// Start runs a server for the rest of the test. Logs go to t.Log only when
// the test runs with -v, to keep failures readable.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	cfg := daemon.Config{
		DB:     filepath.Join(t.TempDir(), "vigil.db"),
		Addr:   "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	for _, o := range opts {
		o(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d, err := daemon.New(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatalf("testserver: %v", err)
	}
	d.Start(ctx)
	t.Cleanup(func() {
		cancel()
		if err := d.Stop(); err != nil {
			t.Errorf("testserver stop: %v", err)
		}
	})
	return &Server{Daemon: d, URL: d.URL()}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
