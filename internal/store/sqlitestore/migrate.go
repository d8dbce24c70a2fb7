package sqlitestore

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
)

// migrationFiles holds the schema, one file per version: NNN_name.sql,
// numbered from 001 without gaps. Migrations are additive only, and the
// PostgreSQL backend carries the same numbers and names.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

// migration is one numbered schema change.
type migration struct {
	version int
	name    string
	sql     string
}

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

// migrate applies every migration not yet recorded in schema_migrations, all
// in one transaction: either the schema reaches the newest version or it is
// left as it was. The transaction begins IMMEDIATE, so two processes opening
// the same new file cannot both apply a migration.
// It returns the names ("001_initial") of the migrations it applied.
func migrate(ctx context.Context, db *sql.DB) ([]string, error) {
	migrations, err := loadMigrations()
	if err != nil {
		return nil, err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op once committed

	if _, err := tx.ExecContext(ctx, `
		CREATE TABLE IF NOT EXISTS schema_migrations (
			version    INTEGER PRIMARY KEY,
			name       TEXT NOT NULL,
			applied_at TEXT NOT NULL
		) STRICT`); err != nil {
		return nil, fmt.Errorf("migrate: create schema_migrations: %w", err)
	}
	applied, err := appliedVersions(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	var names []string
	for _, m := range migrations {
		if applied[m.version] {
			continue
		}
		names = append(names, fmt.Sprintf("%03d_%s", m.version, m.name))
		if _, err := tx.ExecContext(ctx, m.sql); err != nil {
			return nil, fmt.Errorf("migrate: apply %03d_%s: %w", m.version, m.name, err)
		}
		// applied_at is bookkeeping only, so the database clock is fine.
		if _, err := tx.ExecContext(ctx, `
			INSERT INTO schema_migrations (version, name, applied_at)
			VALUES (?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))`,
			m.version, m.name); err != nil {
			return nil, fmt.Errorf("migrate: record %03d_%s: %w", m.version, m.name, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	return names, nil
}

// MigrateOnly opens the SQLite file at path (creating it if needed), applies
// pending migrations and closes it; it returns the names of those applied,
// none when the schema is current. For `vigil migrate`.
func MigrateOnly(ctx context.Context, path string) ([]string, error) {
	st, err := Open(ctx, path)
	if err != nil {
		return nil, err
	}
	return st.applied, st.Close()
}

// appliedVersions returns the versions schema_migrations records.
func appliedVersions(ctx context.Context, tx *sql.Tx) (map[int]bool, error) {
	rows, err := tx.QueryContext(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	defer rows.Close()
	applied := make(map[int]bool)
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("read schema_migrations: %w", err)
		}
		applied[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	return applied, nil
}
