// Package sqlitestore is vigil's embedded storage backend: store.Store on a
// single SQLite file through the pure-Go driver modernc.org/sqlite.
//
// The database runs in WAL mode, so reads never wait for the writer. Every
// write goes through one connection that begins its transactions IMMEDIATE,
// so concurrent writers in this process queue in Go instead of failing with
// "database is locked"; a busy timeout covers other processes that open the
// same file (the CLI next to a running server). Reads use a separate pool of
// read-only connections.
//
// Times are TEXT in one fixed-width UTC layout with millisecond precision
// (timeLayout), so comparing the strings compares the instants and SQL can
// filter, order and index on them directly. The few places that add a
// duration to a stored time do it in SQL with strftime (see sqlAddMS).
package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/vigil-fleet/vigil/internal/store"
)

// driverName is the database/sql name modernc.org/sqlite registers.
const driverName = "sqlite"

// busyTimeout is how long a statement waits for a lock held by another
// process before it fails.
const busyTimeout = 10 * time.Second

// Store is the SQLite implementation of store.Store. It is safe for
// concurrent use.
type Store struct {
	writer  *sql.DB   // exactly one connection; every write goes through it
	reader  *sql.DB   // read-only connections for queries
	applied []string  // migrations applied by Open
	wprep   *prepared // statements prepared on the writer (prepared.go)
	rprep   *prepared // statements prepared on the reader pool
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the SQLite database at path, switches it
// to WAL mode and applies pending migrations. path must name a file; an
// in-memory database is not supported because the reader and writer pools
// would each see their own.
func Open(ctx context.Context, path string) (*Store, error) {
	if path == "" || strings.HasPrefix(path, ":memory:") || strings.HasPrefix(path, "file:") || strings.Contains(path, "?") {
		return nil, fmt.Errorf("open sqlite store: path %q must be a plain file path", path)
	}
	busyMS := strconv.FormatInt(busyTimeout.Milliseconds(), 10)

	writer, err := sql.Open(driverName, path+"?_txlock=immediate"+
		"&_pragma=busy_timeout("+busyMS+")"+
		"&_pragma=foreign_keys(1)"+
		"&_pragma=journal_mode(WAL)"+
		"&_pragma=synchronous(NORMAL)")
	if err != nil {
		return nil, fmt.Errorf("open sqlite store %s: %w", path, err)
	}
	writer.SetMaxOpenConns(1)

	if err := checkWAL(ctx, writer); err != nil {
		_ = writer.Close()
		return nil, fmt.Errorf("open sqlite store %s: %w", path, err)
	}
	applied, err := migrate(ctx, writer)
	if err != nil {
		_ = writer.Close()
		return nil, fmt.Errorf("open sqlite store %s: %w", path, err)
	}

	reader, err := sql.Open(driverName, path+"?_pragma=busy_timeout("+busyMS+")"+
		"&_pragma=foreign_keys(1)"+
		"&_pragma=query_only(1)")
	if err != nil {
		_ = writer.Close()
		return nil, fmt.Errorf("open sqlite store %s: %w", path, err)
	}
	readers := max(4, runtime.GOMAXPROCS(0))
	reader.SetMaxOpenConns(readers)
	reader.SetMaxIdleConns(readers)
	if err := reader.PingContext(ctx); err != nil {
		_ = reader.Close()
		_ = writer.Close()
		return nil, fmt.Errorf("open sqlite store %s: %w", path, err)
	}
	return &Store{writer: writer, reader: reader, applied: applied,
		wprep: newPrepared(writer), rprep: newPrepared(reader)}, nil
}

// checkWAL fails unless the database is in WAL mode: journal_mode=WAL is
// silently ignored where the file system cannot support it, and without it
// readers would block the writer.
func checkWAL(ctx context.Context, db *sql.DB) error {
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return fmt.Errorf("read journal mode: %w", err)
	}
	if !strings.EqualFold(mode, "wal") {
		return fmt.Errorf("journal mode is %q, want wal", mode)
	}
	return nil
}

// Close closes both connection pools.
func (s *Store) Close() error {
	return errors.Join(s.rprep.close(), s.wprep.close(), s.reader.Close(), s.writer.Close())
}

// inTx runs fn in one write transaction (BEGIN IMMEDIATE on the writer
// connection) and commits it when fn returns nil.
func (s *Store) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.writer.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // a no-op once committed
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// isUniqueViolation reports whether err is a primary-key or unique
// constraint failure.
func isUniqueViolation(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	return se.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY || se.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE
}

// sqlLimit turns a params Limit into a LIMIT value: -1 (no limit) when it is
// not positive (store: "Limit <= 0 means no limit").
func sqlLimit(limit int) int {
	if limit <= 0 {
		return -1
	}
	return limit
}

// rowScanner is a *sql.Row or *sql.Rows.
type rowScanner interface {
	Scan(dest ...any) error
}

// nullPtr returns a pointer to n's value, or nil when n is NULL.
func nullPtr[T any](n sql.Null[T]) *T {
	if !n.Valid {
		return nil
	}
	return &n.V
}
