package pgstore

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// migrationFiles holds the schema, one file per version: NNN_name.sql,
// numbered from 001 without gaps, with the same numbers and names as
// sqlitestore's. Migrations are additive only.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

// migration is one numbered schema change.
type migration struct {
	version int
	name    string
	sql     string
}

// String is the migration's file name without .sql, e.g. "001_initial".
func (m migration) String() string { return fmt.Sprintf("%03d_%s", m.version, m.name) }

// loadMigrations reads the embedded migrations in version order.
func loadMigrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations") // sorted by file name
	if err != nil {
		return nil, err
	}
	migrations := make([]migration, 0, len(entries))
	for _, e := range entries {
		base, okExt := strings.CutSuffix(e.Name(), ".sql")
		num, name, okName := strings.Cut(base, "_")
		version, err := strconv.Atoi(num)
		if !okExt || !okName || name == "" || len(num) != 3 || err != nil || version != len(migrations)+1 {
			return nil, fmt.Errorf("migration file %q: want NNN_name.sql, numbered from 001 without gaps", e.Name())
		}
		body, err := fs.ReadFile(migrationFiles, "migrations/"+e.Name())
		if err != nil {
			return nil, err
		}
		migrations = append(migrations, migration{version: version, name: name, sql: string(body)})
	}
	return migrations, nil
}

// migrateLockClass is the first key of the advisory lock migrate takes
// (an arbitrary constant naming vigil's migrations); the second is a hash
// of the schema, so stores on different schemas of one database do not wait
// for each other.
const migrateLockClass = 0x76696769 // "vigi"

// MigrateOnly applies the pending migrations of the database at url and
// returns the ones it applied ("001_initial", …; none when the schema is
// current), for running migrations ahead of a rollout (vigil migrate). Open
// does the same, so calling it is never required. Its errors never contain
// the password.
func MigrateOnly(ctx context.Context, url string) (applied []string, err error) {
	pool, err := connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	applied, err = migrate(ctx, pool)
	if err != nil {
		return nil, redactError(url, fmt.Errorf("migrate postgres store %s: %w", Redact(url), err))
	}
	return applied, nil
}

// migrate applies every migration not yet recorded in schema_migrations,
// all in one transaction: either the schema reaches the newest version or it
// is left as it was. The transaction first takes an advisory lock for the
// current schema (pg_advisory_xact_lock, released at commit or rollback), so
// several servers opening one database at once apply each migration once:
// the others wait, then find it recorded. It returns the migrations applied.
func migrate(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	migrations, err := loadMigrations()
	if err != nil {
		return nil, err
	}
	var applied []string
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext(coalesce(current_schema(), '')))`,
			migrateLockClass); err != nil {
			return fmt.Errorf("take migration lock: %w", err)
		}
		// applied_at is bookkeeping only, so the database clock is fine.
		if _, err := tx.Exec(ctx, `
			CREATE TABLE IF NOT EXISTS schema_migrations (
				version    integer     PRIMARY KEY,
				name       text        NOT NULL,
				applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
			)`); err != nil {
			return fmt.Errorf("create schema_migrations: %w", err)
		}
		done, err := appliedVersions(ctx, tx)
		if err != nil {
			return err
		}
		for _, m := range migrations {
			if done[m.version] {
				continue
			}
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return fmt.Errorf("apply %s: %w", m, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`,
				m.version, m.name); err != nil {
				return fmt.Errorf("record %s: %w", m, err)
			}
			applied = append(applied, m.String())
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	return applied, nil
}

// appliedVersions returns the versions schema_migrations records.
func appliedVersions(ctx context.Context, tx pgx.Tx) (map[int]bool, error) {
	rows, err := tx.Query(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	applied := make(map[int]bool, len(versions))
	for _, v := range versions {
		applied[v] = true
	}
	return applied, nil
}
