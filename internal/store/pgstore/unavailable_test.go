package pgstore

import (
	"context"
	"fmt"
	"io"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// IsUnavailable tells a server that cannot serve from a query's own error.
// A real unreachable server is exercised end to end by httpapi's
// TestStoreUnavailableIs503OnEveryRoute; here, one that refuses to connect.
func TestIsUnavailable(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]bool{
		"08006": true, "08001": true, "57P01": true, "57P02": true, "57P03": true, "53300": true,
		"23505": false, "22P02": false, "40001": false,
	} {
		err := fmt.Errorf("get task 1: %w", &pgconn.PgError{Code: code})
		require.Equal(t, want, IsUnavailable(err), code)
	}
	require.True(t, IsUnavailable(fmt.Errorf("x: %w", io.ErrUnexpectedEOF)))
	require.False(t, IsUnavailable(vigiltype.ErrStaleEpoch))
	require.False(t, IsUnavailable(nil))

	// A call its caller cancelled (a client that hung up) says nothing of
	// the store: it must not count as an outage (it gave every instance a
	// grace in a CI run). A real cancelled query, as pgx reports it:
	if url := os.Getenv("VIGIL_TEST_POSTGRES_URL"); url != "" {
		pool, err := connect(context.Background(), url)
		require.NoError(t, err)
		defer pool.Close()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err = pool.Exec(ctx, "SELECT 1")
		require.Error(t, err)
		require.False(t, IsUnavailable(err), "%v", err)
	}

	// A closed port on loopback: a real connect error from pgx.
	_, err := connect(context.Background(), "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=2")
	require.Error(t, err)
	require.True(t, IsUnavailable(err), "%v", err)
}
