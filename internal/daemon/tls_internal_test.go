package daemon

import (
	"crypto/tls"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/testcert"
)

// The certificate files are looked at on a handshake, no more than once
// per interval; a change is picked up at the next look, and a pair that
// does not load (a rotation half done) keeps the current one until the
// files change again.
func TestCertReloaderFollowsTheFiles(t *testing.T) {
	t.Parallel()
	ca := testcert.NewCA(t, "vigil")
	dir := t.TempDir()
	first := ca.IssueIn(t, dir)
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	r, err := newCertReloader(first.CertFile, first.KeyFile, 5*time.Second, func() time.Time { return now },
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	serial := func() string {
		c, err := r.GetCertificate(&tls.ClientHelloInfo{})
		require.NoError(t, err)
		return c.Leaf.SerialNumber.String()
	}
	require.Equal(t, first.Cert.SerialNumber.String(), serial())

	second := ca.IssueIn(t, dir)
	now = now.Add(4 * time.Second)
	require.Equal(t, first.Cert.SerialNumber.String(), serial(), "not looked at again within the interval")
	now = now.Add(time.Second)
	require.Equal(t, second.Cert.SerialNumber.String(), serial(), "looked at after the interval")

	// Half a rotation: the new certificate, the old key.
	keyPEM, err := os.ReadFile(second.KeyFile)
	require.NoError(t, err)
	third := ca.IssueIn(t, dir)
	require.NoError(t, os.WriteFile(third.KeyFile, keyPEM, 0o600))
	now = now.Add(5 * time.Second)
	require.Equal(t, second.Cert.SerialNumber.String(), serial(), "a mismatched pair keeps the current one")
	// The rotation completes.
	fourth := ca.IssueIn(t, dir)
	now = now.Add(5 * time.Second)
	require.Equal(t, fourth.Cert.SerialNumber.String(), serial())
}
