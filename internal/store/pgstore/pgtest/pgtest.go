// Package pgtest gives each test its own empty PostgreSQL schema on the
// server named by $VIGIL_TEST_POSTGRES_URL, so PostgreSQL tests run in
// parallel, never see each other's rows, and leave nothing behind.
//
// A package with PostgreSQL tests calls Main from its TestMain, and each
// test asks for a URL:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		t.Parallel()
//		st, err := pgstore.Open(t.Context(), pgtest.URL(t))
//		...
//	}
//
// When the variable is unset the tests skip, and Main says so in one line;
// when it is set but the server cannot be reached they fail.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvURL names the environment variable holding the test server's URL,
// e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable. Its user
// must be allowed to create schemas in that database.
const EnvURL = "VIGIL_TEST_POSTGRES_URL"

// PoolMaxConns caps each test's connection pool (pool_max_conns in the URLs
// URL returns), so that many parallel tests stay under the server's
// max_connections.
const PoolMaxConns = 4

// SchemaPrefix starts the name of every schema URL creates.
const SchemaPrefix = "vigiltest_"

// adminTimeout bounds creating or dropping a schema.
const adminTimeout = 30 * time.Second

// Main runs the package's tests and exits (call it from TestMain). When
// EnvURL is unset it first prints one line saying the PostgreSQL tests are
// skipped and how to run them.
func Main(m *testing.M) {
	Announce()
	os.Exit(m.Run())
}

// Announce prints the one line saying the PostgreSQL tests are skipped, when
// EnvURL is unset; for a TestMain that has more to do than Main.
func Announce() {
	if os.Getenv(EnvURL) == "" {
		fmt.Fprintf(os.Stderr, "PostgreSQL tests SKIPPED: set %s=postgres://USER@HOST:5432/DB?sslmode=disable to run them\n", EnvURL)
	}
}

// URL returns a connection URL for the test server whose search_path is a
// new, empty schema of its own, dropped with everything in it (CASCADE) when
// t ends; close what uses it in an earlier t.Cleanup (or defer). The URL is
// for pgx's pool (pgstore.Open): it also carries pool_max_conns.
//
// URL skips t when EnvURL is unset — except in CI (CI=true), where a skipped
// PostgreSQL test would hide a missing database, so it fails — and fails t
// when the server cannot be reached or the schema cannot be created.
func URL(t testing.TB) string {
	t.Helper()
	base := os.Getenv(EnvURL)
	if base == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL test: %s is unset under CI=true; the PostgreSQL tests must not be skipped in CI", EnvURL)
		}
		t.Skipf("PostgreSQL test: set %s to run it", EnvURL)
	}
	schema := SchemaPrefix + randomHex(t)
	ident := pgx.Identifier{schema}.Sanitize()
	exec(t, base, "create test schema", "CREATE SCHEMA "+ident)
	t.Cleanup(func() { exec(t, base, "drop test schema", "DROP SCHEMA IF EXISTS "+ident+" CASCADE") })
	return withParams(t, base, map[string]string{
		"search_path":    schema,
		"pool_max_conns": fmt.Sprint(PoolMaxConns),
	})
}

// exec runs one statement on its own connection to the server at base.
func exec(t testing.TB, base, what, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("%s: connect to %s: %v", what, EnvURL, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// withParams returns base (a URL or a keyword/value string) with params set.
func withParams(t testing.TB, base string, params map[string]string) string {
	t.Helper()
	if !strings.Contains(base, "://") {
		for k, v := range params {
			base += " " + k + "=" + v
		}
		return base
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("%s is not a valid URL", EnvURL) // the error would quote it, password included
	}
	q := u.Query()
	for k, v := range params {
		q.Set(k, v)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// randomHex returns 16 random hex digits.
func randomHex(t testing.TB) string {
	t.Helper()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}
