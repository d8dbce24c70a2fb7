package daemon

import (
	"context"
	"fmt"
	"strings"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/internal/store/pgstore"
	"github.com/vigil-fleet/vigil/internal/store/sqlitestore"
)

// openStore opens the store dsn names and applies pending migrations: a
// postgres:// or postgresql:// URL is a PostgreSQL database (pgstore, which
// several servers may share), anything else is the path of an SQLite file
// (sqlitestore). Errors never contain a PostgreSQL password; use
// redactDSN, not dsn, when logging which store is open. The store returned
// marks the errors its backend judges "cannot be reached" as
// vigiltype.ErrUnavailable (store.WithUnavailable).
func openStore(ctx context.Context, dsn string) (store.Store, error) {
	if err := checkNotKeyValue(dsn); err != nil {
		return nil, err
	}
	if isPostgresURL(dsn) {
		st, err := pgstore.Open(ctx, dsn)
		if err != nil {
			return nil, err
		}
		return store.WithUnavailable(st, pgstore.IsUnavailable), nil
	}
	st, err := sqlitestore.Open(ctx, dsn)
	if err != nil {
		return nil, err
	}
	return store.WithUnavailable(st, sqlitestore.IsUnavailable), nil
}

// IsPostgresURL reports whether dsn names a PostgreSQL database (scheme
// postgres:// or postgresql://, in any case); anything else is an SQLite
// file path.
func IsPostgresURL(dsn string) bool { return isPostgresURL(dsn) }

func isPostgresURL(dsn string) bool {
	scheme, _, ok := strings.Cut(dsn, "://")
	return ok && (strings.EqualFold(scheme, "postgres") || strings.EqualFold(scheme, "postgresql"))
}

// redactDSN is dsn as it may appear in logs and errors: a PostgreSQL URL
// with its password masked, an SQLite path as it is.
func redactDSN(dsn string) string {
	if isPostgresURL(dsn) {
		return pgstore.Redact(dsn)
	}
	return dsn
}

// Migrate applies pending schema migrations to the store dsn names, without
// serving, and returns the names of those applied (none when current). Run
// it ahead of a rollout; servers also migrate at start.
func Migrate(ctx context.Context, dsn string) ([]string, error) {
	if err := checkNotKeyValue(dsn); err != nil {
		return nil, err
	}
	var (
		applied []string
		err     error
	)
	if isPostgresURL(dsn) {
		applied, err = pgstore.MigrateOnly(ctx, dsn)
	} else {
		applied, err = sqlitestore.MigrateOnly(ctx, dsn)
	}
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err) // err names the store, password masked
	}
	return applied, nil
}

// checkNotKeyValue refuses a PostgreSQL keyword/value string ("host=… user=…"),
// which would otherwise name an SQLite file — with the password in its name.
func checkNotKeyValue(dsn string) error {
	if isPostgresURL(dsn) {
		return nil
	}
	for _, key := range []string{"host=", "dbname=", "user=", "password=", "port="} {
		if strings.Contains(dsn, key) {
			return fmt.Errorf("--db %s…: this looks like a PostgreSQL keyword/value string; use a postgres://user@host:port/db URL, or a plain SQLite file path", key)
		}
	}
	return nil
}
