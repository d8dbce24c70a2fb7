// Package pgstore is vigil's shared storage backend: store.Store on
// PostgreSQL (15 and later) through a pgx/v5 connection pool, for a fleet
// whose vigil servers run on several hosts against one database (DESIGN §8).
//
// Several servers may use one database at once, so nothing here relies on
// being the only writer:
//   - TaskClaim picks its task with FOR UPDATE SKIP LOCKED: concurrent
//     claimers take different tasks instead of queueing on one row; a claim
//     of one task by id that another transaction holds is refused at once.
//   - TaskReclaim is one statement whose selection is FOR UPDATE SKIP LOCKED
//     and whose UPDATE repeats the reclaim predicate, so two servers
//     sweeping at once reclaim each expired lease exactly once, and a task
//     completed or re-claimed in between is left alone.
//   - AgentUpdate's compare-and-swap is its UPDATE's WHERE clause (name and
//     version): of two servers updating from one version, the second waits
//     for the row lock, then matches nothing and reports ErrConflict.
//     EventAck keeps the first acknowledgement the same way.
//   - Event ids may commit out of order; EventList says how a consumer
//     reads every event regardless.
//   - Migrations run at Open in one transaction that first takes a
//     transaction-level advisory lock (pg_advisory_xact_lock) for the schema,
//     so servers starting together apply each migration once.
//
// Every "now" comes from the caller's params; no store method reads the
// database clock (Now, for a daemon that wants the database as its fleet
// clock, is the one exception and writes nothing). Times are timestamptz;
// every time the store writes is first truncated to the millisecond in UTC
// (utcMS), so values match sqlitestore's to the millisecond, and every time
// read back is converted to UTC in the one scan function of its table.
//
// Errors map to vigiltype's sentinels in interpretError. Errors from Open and
// MigrateOnly never contain the connection string's password.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// ConnectTimeoutDefault bounds one connection attempt when the URL sets no
// connect_timeout, so an unreachable server fails Open instead of hanging.
const ConnectTimeoutDefault = 10 * time.Second

// Store is the PostgreSQL implementation of store.Store. It is safe for
// concurrent use, also by several Stores (servers) on one database.
type Store struct {
	pool *pgxpool.Pool
}

var _ store.Store = (*Store)(nil)

// Open connects to the database at url (postgres://user:pass@host/db?...,
// or any connection string pgx accepts, including pool_* settings) and
// applies pending migrations. Its errors never contain the password.
func Open(ctx context.Context, url string) (*Store, error) {
	pool, err := connect(ctx, url)
	if err != nil {
		return nil, err
	}
	if _, err := migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, redactError(url, fmt.Errorf("open postgres store %s: %w", Redact(url), err))
	}
	return &Store{pool: pool}, nil
}

// connect parses url, opens a pool and checks that the server answers.
func connect(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(lowerScheme(url))
	if err != nil {
		// The parse error's chain holds the raw connection string
		// (pgconn.ParseConfigError.ConnString), so only its redacted text is kept.
		return nil, &redactedError{msg: scrub(url, "open postgres store: invalid connection string: "+err.Error())}
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = ConnectTimeoutDefault
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, redactError(url, fmt.Errorf("open postgres store %s: %w", Redact(url), err))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, redactError(url, fmt.Errorf("open postgres store %s: connect: %w", Redact(url), err))
	}
	return pool, nil
}

// lowerScheme lower-cases a URL's scheme (POSTGRES:// → postgres://): URL
// schemes are case-insensitive, pgx's test for a URL is not.
func lowerScheme(url string) string {
	if scheme, rest, ok := strings.Cut(url, "://"); ok {
		return strings.ToLower(scheme) + "://" + rest
	}
	return url
}

// Close closes the connection pool.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

// Now reads the database server's clock (clock_timestamp(), in UTC). Stores
// never use it themselves: it is for a daemon that makes the database its
// fleet clock, so that every server sharing the database decides liveness
// and lease expiry by one clock (DESIGN L3).
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var now time.Time
	if err := s.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("read database clock: %w", interpretError(err))
	}
	return now.UTC(), nil
}

// inTx runs fn in one READ COMMITTED transaction and commits it when fn
// returns nil.
func (s *Store) inTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, fn)
}

// errAlreadyExists is a unique violation; callers turn it into their own
// message (sqlitestore's wording).
var errAlreadyExists = errors.New("already exists")

// SQLSTATE codes interpretError maps.
const (
	codeUniqueViolation           = "23505"
	codeInvalidTextRepresentation = "22P02" // e.g. invalid input syntax for type json
	codeCharacterNotInRepertoire  = "22021" // invalid UTF-8, or a NUL character in text
	codeUntranslatableCharacter   = "22P05"
	codeDatetimeFieldOverflow     = "22008" // a time outside timestamptz's range
	codeNumericValueOutOfRange    = "22003"
)

// interpretError maps pgx and PostgreSQL errors to the sentinels every
// backend returns: no rows is vigiltype.ErrNotFound, a unique violation is
// errAlreadyExists, and a value the database cannot store (invalid JSON or
// UTF-8, a NUL character in text, a time or number out of range) is
// vigiltype.ErrInvalid. Anything else is returned as it is.
func interpretError(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return vigiltype.ErrNotFound
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case codeUniqueViolation:
		return fmt.Errorf("%w: %w", errAlreadyExists, err)
	case codeInvalidTextRepresentation, codeCharacterNotInRepertoire, codeUntranslatableCharacter,
		codeDatetimeFieldOverflow, codeNumericValueOutOfRange:
		return &invalidError{pgErr: pgErr}
	}
	return err
}

// invalidError is a value PostgreSQL refused to store. It matches
// vigiltype.ErrInvalid and keeps the *pgconn.PgError for errors.As; its text
// is the server's message without the SQLSTATE decoration.
type invalidError struct {
	pgErr *pgconn.PgError
}

func (e *invalidError) Error() string   { return vigiltype.ErrInvalid.Error() + ": " + e.pgErr.Message }
func (e *invalidError) Unwrap() []error { return []error{vigiltype.ErrInvalid, e.pgErr} }

// sqlLimit turns a params Limit into a LIMIT value: NULL (no limit) when it
// is not positive (store: "Limit <= 0 means no limit").
func sqlLimit(limit int) *int {
	if limit <= 0 {
		return nil
	}
	return &limit
}

// rowScanner is a pgx.Row or pgx.Rows.
type rowScanner interface {
	Scan(dest ...any) error
}
