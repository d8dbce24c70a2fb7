package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgSchemaPrefix starts the name of every schema a PostgreSQL case creates,
// so a schema left behind by a killed run is easy to find and drop.
const pgSchemaPrefix = "vigil_bench_"

// pgAdminTimeout bounds creating or dropping a schema.
const pgAdminTimeout = time.Minute

// pgSchema is an empty schema of a case's own on the database at
// Env.PostgresURL. Open it with newPGSchema and Drop it when the case ends.
type pgSchema struct {
	Name string // vigil_bench_<16 hex digits>
	base string // Env.PostgresURL
}

// newPGSchema creates a fresh, empty schema vigil_bench_<random>.
func newPGSchema(ctx context.Context, baseURL string) (*pgSchema, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	s := &pgSchema{Name: pgSchemaPrefix + hex.EncodeToString(b[:]), base: baseURL}
	if err := s.exec(ctx, "CREATE SCHEMA "+pgx.Identifier{s.Name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create schema %s: %w", s.Name, err)
	}
	return s, nil
}

// URL is the base URL with search_path set to the schema, plus params (for
// example pool_max_conns for pgxpool). Everything a connection made with it
// creates without a schema name lands in the schema.
func (s *pgSchema) URL(params map[string]string) (string, error) {
	all := map[string]string{"search_path": s.Name}
	for k, v := range params {
		all[k] = v
	}
	if !strings.Contains(s.base, "://") { // keyword/value form
		out := s.base
		for k, v := range all {
			out += " " + k + "=" + v
		}
		return out, nil
	}
	u, err := url.Parse(s.base)
	if err != nil {
		return "", fmt.Errorf("--postgres is not a valid URL") // the error would quote it, password included
	}
	q := u.Query()
	for k, v := range all {
		q.Set(k, v)
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// Drop drops the schema and everything in it. It uses its own context so
// that it still runs when the case's was cancelled.
func (s *pgSchema) Drop() error {
	ctx, cancel := context.WithTimeout(context.Background(), pgAdminTimeout)
	defer cancel()
	if err := s.exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{s.Name}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("drop schema %s: %w", s.Name, err)
	}
	return nil
}

// exec runs one statement on a connection of its own.
func (s *pgSchema) exec(ctx context.Context, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, pgAdminTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.base)
	if err != nil {
		return fmt.Errorf("connect to --postgres: %w", err)
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}
