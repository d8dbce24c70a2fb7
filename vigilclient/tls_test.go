package vigilclient_test

import (
	"context"
	"crypto/x509"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/testcert"
	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigilclient"
)

// An https server whose certificate a private CA signed: a Client given
// that CA (LoadCAFile, WithTLSConfig) talks to it, with or without its own
// *http.Client; one without it gets a certificate error.
func TestClientTrustsTheCAItIsGiven(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ca := testcert.NewCA(t, "vigil")
	pair := ca.IssueIn(t, t.TempDir())
	srv := testserver.Start(t, testserver.WithTLS(pair.CertFile, pair.KeyFile))

	tc, err := vigilclient.LoadCAFile(ca.File)
	require.NoError(t, err)
	c, err := vigilclient.New([]string{srv.URL}, vigilclient.WithTLSConfig(tc))
	require.NoError(t, err)
	require.NoError(t, c.Health(ctx))
	reg := register(t, c, "tls-worker")
	require.NotEmpty(t, reg.Process.InstanceID)

	mine := &http.Client{Timeout: 10 * time.Second}
	c, err = vigilclient.New([]string{srv.URL}, vigilclient.WithHTTPClient(mine), vigilclient.WithTLSConfig(tc))
	require.NoError(t, err)
	require.NoError(t, c.Health(ctx))
	require.Nil(t, mine.Transport, "the caller's client is not changed")

	_, err = vigilclient.New([]string{srv.URL}, vigilclient.WithHTTPClient(&http.Client{Transport: roundTripFunc(nil)}),
		vigilclient.WithTLSConfig(tc))
	require.ErrorContains(t, err, "WithTLSConfig needs WithHTTPClient's Transport to be nil or an *http.Transport")

	c, err = vigilclient.New([]string{srv.URL})
	require.NoError(t, err)
	err = c.Health(ctx)
	var unknown x509.UnknownAuthorityError
	require.True(t, errors.As(err, &unknown), "without the CA: %v", err)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestLoadCAFileErrors(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "missing.pem")
	_, err := vigilclient.LoadCAFile(missing)
	require.ErrorContains(t, err, "read the CA certificates: open "+missing)
	garbage := filepath.Join(t.TempDir(), "garbage.pem")
	require.NoError(t, os.WriteFile(garbage, []byte("hello"), 0o600))
	_, err = vigilclient.LoadCAFile(garbage)
	require.ErrorContains(t, err, garbage+" holds no PEM certificate")
}

// NewFromEnv trusts the CA in VIGIL_CA_FILE; a bad one is an error naming
// the variable.
func TestNewFromEnvCAFile(t *testing.T) {
	ctx := context.Background()
	ca := testcert.NewCA(t, "vigil")
	pair := ca.IssueIn(t, t.TempDir())
	srv := testserver.Start(t, testserver.WithTLS(pair.CertFile, pair.KeyFile))

	t.Setenv("VIGIL_URL", srv.URL)
	t.Setenv("VIGIL_CA_FILE", ca.File)
	c, err := vigilclient.NewFromEnv()
	require.NoError(t, err)
	require.NoError(t, c.Health(ctx))

	t.Setenv("VIGIL_CA_FILE", "")
	c, err = vigilclient.NewFromEnv()
	require.NoError(t, err)
	var unknown x509.UnknownAuthorityError
	err = c.Health(ctx)
	require.True(t, errors.As(err, &unknown), "without VIGIL_CA_FILE: %v", err)

	t.Setenv("VIGIL_CA_FILE", filepath.Join(t.TempDir(), "nope.pem"))
	_, err = vigilclient.NewFromEnv()
	require.ErrorContains(t, err, `VIGIL_CA_FILE="`)
	require.ErrorContains(t, err, "read the CA certificates")
}
