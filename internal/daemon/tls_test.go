package daemon_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/daemon"
	"github.com/vigil-fleet/vigil/internal/testcert"
)

// serialSeen opens a new TLS connection to addr trusting roots and returns
// the serial number of the certificate the server presented.
func serialSeen(t *testing.T, addr string, roots *x509.CertPool) *big.Int {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
	require.NoError(t, err)
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber
}

func startTLS(t *testing.T, cfg daemon.Config) *daemon.Daemon {
	t.Helper()
	ctx := context.Background()
	cfg.DB = filepath.Join(t.TempDir(), "v.db")
	cfg.Addr = "127.0.0.1:0"
	d, err := daemon.New(ctx, cfg)
	require.NoError(t, err)
	d.Start(ctx)
	t.Cleanup(func() { require.NoError(t, d.Stop()) })
	return d
}

// With --tls-cert/--tls-key the API and the dashboard are served over
// HTTPS only; a client trusting the CA gets through, one that does not
// gets a certificate error, and plain HTTP is refused.
func TestTLSServesHTTPS(t *testing.T) {
	t.Parallel()
	ca := testcert.NewCA(t, "vigil")
	pair := ca.IssueIn(t, t.TempDir())
	d := startTLS(t, daemon.Config{TLSCertFile: pair.CertFile, TLSKeyFile: pair.KeyFile})
	require.True(t, strings.HasPrefix(d.URL(), "https://127.0.0.1:"), d.URL())

	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	trusting := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	for _, path := range []string{"/healthz", "/v1/agents", "/"} {
		resp, err := trusting.Get(d.URL() + path)
		require.NoError(t, err, path)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
	}
	require.Equal(t, pair.Cert.SerialNumber, serialSeen(t, d.Addr(), roots))

	_, err := (&http.Client{Transport: &http.Transport{}}).Get(d.URL() + "/healthz")
	var unknown x509.UnknownAuthorityError
	require.True(t, errors.As(err, &unknown), "a client without the CA: %v", err)

	resp, err := http.Get("http://" + d.Addr() + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "plain HTTP to the TLS port")
}

// A rotated certificate is served to new connections after ReloadTLS
// (SIGHUP); a pair that does not load keeps the current one in service.
func TestTLSReloadRotatesTheCertificate(t *testing.T) {
	t.Parallel()
	ca := testcert.NewCA(t, "vigil")
	dir := t.TempDir()
	first := ca.IssueIn(t, dir)
	d := startTLS(t, daemon.Config{TLSCertFile: first.CertFile, TLSKeyFile: first.KeyFile})
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	require.Equal(t, first.Cert.SerialNumber, serialSeen(t, d.Addr(), roots))

	second := ca.IssueIn(t, dir)
	require.NotEqual(t, first.Cert.SerialNumber, second.Cert.SerialNumber)
	require.NoError(t, d.ReloadTLS())
	require.Equal(t, second.Cert.SerialNumber, serialSeen(t, d.Addr(), roots))

	require.NoError(t, os.WriteFile(second.KeyFile, []byte("not a key"), 0o600))
	require.ErrorContains(t, d.ReloadTLS(), "--tls-key")
	require.Equal(t, second.Cert.SerialNumber, serialSeen(t, d.Addr(), roots), "a bad pair keeps the current one")
}

// A bad pair at start is an error naming the flag at fault.
func TestTLSBadPairAtStart(t *testing.T) {
	t.Parallel()
	ca := testcert.NewCA(t, "vigil")
	a := ca.IssueIn(t, t.TempDir())
	b := ca.IssueIn(t, t.TempDir())
	garbage := filepath.Join(t.TempDir(), "garbage.pem")
	require.NoError(t, os.WriteFile(garbage, []byte("hello"), 0o600))
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, c := range []struct{ cert, key, want string }{
		{a.CertFile, "", "--tls-cert needs --tls-key"},
		{"", a.KeyFile, "--tls-key needs --tls-cert"},
		{missing, a.KeyFile, "--tls-cert: open " + missing},
		{a.CertFile, missing, "--tls-key: open " + missing},
		{garbage, a.KeyFile, "--tls-cert " + garbage + ", --tls-key " + a.KeyFile + ": not a certificate and its key"},
		{a.CertFile, b.KeyFile, "--tls-cert " + a.CertFile + ", --tls-key " + b.KeyFile + ": not a certificate and its key"},
	} {
		_, err := daemon.New(context.Background(), daemon.Config{
			DB: filepath.Join(t.TempDir(), "v.db"), Addr: "127.0.0.1:0", TLSCertFile: c.cert, TLSKeyFile: c.key,
		})
		require.ErrorContains(t, err, c.want)
	}
}

// A non-loopback listen needs TLS, or --insecure-listen (a TLS proxy in
// front); loopback does not.
func TestNonLoopbackNeedsTLSOrInsecureListen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("s3cret-token-0123456789"), 0o600))
	ca := testcert.NewCA(t, "vigil")
	pair := ca.IssueIn(t, t.TempDir())

	for _, addr := range []string{"0.0.0.0:0", "[::]:0", ":0"} {
		_, err := daemon.New(ctx, daemon.Config{DB: filepath.Join(t.TempDir(), "v.db"), Addr: addr, TokenFile: tokenFile})
		require.ErrorContains(t, err, "refusing to serve plain HTTP", addr)
		require.ErrorContains(t, err, "--tls-cert and --tls-key, or --insecure-listen", addr)
	}
	for _, cfg := range []daemon.Config{
		{Addr: "0.0.0.0:0", TokenFile: tokenFile, InsecureListen: true},
		{Addr: "0.0.0.0:0", TokenFile: tokenFile, TLSCertFile: pair.CertFile, TLSKeyFile: pair.KeyFile},
		{Addr: "127.0.0.1:0"},
		{Addr: "localhost:0"},
	} {
		cfg.DB = filepath.Join(t.TempDir(), "v.db")
		d, err := daemon.New(ctx, cfg)
		require.NoError(t, err, "%+v", cfg)
		_, _, err = net.SplitHostPort(d.Addr())
		require.NoError(t, err)
		require.NoError(t, d.Stop())
	}
}
