package sqlitestore

import (
	"database/sql"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/internal/store/storetest"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func TestStore(t *testing.T) {
	t.Parallel()
	storetest.Exercise(t.Context(), t, func(t *testing.T) store.Store {
		return openTestStore(t, filepath.Join(t.TempDir(), "vigil.db"))
	})
}

// openTestStore opens the store at path and closes it when t ends.
func openTestStore(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(t.Context(), path)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// rawDB opens path without the store, for looking at what it wrote.
func rawDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driverName, path)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	return db
}

func TestOpenRefusesNonFilePaths(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"", ":memory:", "file:x.db", "x.db?mode=ro"} {
		_, err := Open(t.Context(), path)
		require.Error(t, err, path)
	}
}

func TestMigrationsIdempotentOnReopen(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "vigil.db")
	migrations, err := loadMigrations()
	require.NoError(t, err)
	require.NotEmpty(t, migrations)

	s, err := Open(t.Context(), path)
	require.NoError(t, err)
	task, err := s.TaskEnqueue(t.Context(), store.TaskEnqueueParams{
		TaskType: "email", MaxAttempts: 1, MaxReclaims: 1, RunAfter: time.Now(), Now: time.Now(),
	})
	require.NoError(t, err)
	require.NoError(t, s.Close())

	// Reopening applies nothing twice and keeps the data.
	s = openTestStore(t, path)
	_, err = s.TaskGet(t.Context(), task.TaskID)
	require.NoError(t, err)

	rows, err := rawDB(t, path).QueryContext(t.Context(),
		`SELECT version, name FROM schema_migrations ORDER BY version`)
	require.NoError(t, err)
	defer rows.Close()
	var got []migration
	for rows.Next() {
		var m migration
		require.NoError(t, rows.Scan(&m.version, &m.name))
		got = append(got, m)
	}
	require.NoError(t, rows.Err())
	require.Len(t, got, len(migrations))
	for i, m := range migrations {
		require.Equal(t, m.version, got[i].version)
		require.Equal(t, m.name, got[i].name)
	}
	require.Equal(t, migration{version: 1, name: "initial"}, got[0])
}

func TestWALMode(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "vigil.db")
	openTestStore(t, path)

	// journal_mode=WAL is a property of the file, visible to any connection.
	var mode string
	require.NoError(t, rawDB(t, path).QueryRowContext(t.Context(), `PRAGMA journal_mode`).Scan(&mode))
	require.Equal(t, "wal", mode)
}

func TestTimeTextRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   time.Time
		want string
	}{
		{time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC), "2026-03-14T09:26:53.000Z"},
		{time.Date(2026, 3, 14, 9, 26, 53, 999_999_999, time.UTC), "2026-03-14T09:26:53.999Z"},
		{time.Date(2026, 3, 14, 9, 26, 53, 1_500_000, time.FixedZone("CET", 3600)), "2026-03-14T08:26:53.001Z"},
		{time.Date(999, 1, 2, 3, 4, 5, 60_000_000, time.UTC), "0999-01-02T03:04:05.060Z"},
	} {
		got := timeString(tt.in)
		require.Equal(t, tt.want, got)
		require.Len(t, got, len(timeLayout))
		back, err := parseTime(got)
		require.NoError(t, err)
		require.Equal(t, tt.in.Truncate(time.Millisecond).UTC(), back)
		require.Equal(t, time.UTC, back.Location())
	}

	// String order is time order.
	require.Less(t, timeString(time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC)),
		timeString(time.Date(2026, 3, 14, 9, 26, 53, 1_000_000, time.UTC)))

	for _, bad := range []string{"2026-03-14T09:26:53Z", "2026-03-14 09:26:53.000", "2026-03-14T09:26:53.000+01:00"} {
		_, err := parseTime(bad)
		require.Error(t, err, bad)
	}
}

// TestStoredTimes checks what lands in the file: every time in timeLayout,
// and alive_until / lease_expires_at computed in SQL agreeing exactly with
// vigiltype.AliveWindow and Go's duration arithmetic.
func TestStoredTimes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "vigil.db")
	s := openTestStore(t, path)
	db := rawDB(t, path)
	now := time.Date(2026, 12, 31, 23, 59, 58, 123_456_789, time.UTC)

	for i, interval := range []float64{0.1, 1.5, 10, 33.333, 0.0007, 86400} {
		id := "inst-" + string(rune('a'+i))
		_, err := s.ProcessRegister(ctx, store.ProcessRegisterParams{
			InstanceID: id, TokenHash: "h", ProcessKind: "k", Hostname: "h", PID: 1, LivenessIntervalS: interval, Now: now,
		})
		require.NoError(t, err)
		hb := now.Add(1234 * time.Millisecond)
		proc, err := s.ProcessHeartbeat(ctx, store.ProcessHeartbeatParams{InstanceID: id, TokenHash: "h", Now: hb})
		require.NoError(t, err)

		var lastHeartbeat, aliveUntil string
		require.NoError(t, db.QueryRowContext(ctx,
			`SELECT last_heartbeat_at, alive_until FROM processes WHERE instance_id = ?`, id).
			Scan(&lastHeartbeat, &aliveUntil))
		require.Equal(t, "2026-12-31T23:59:59.357Z", lastHeartbeat)
		require.Equal(t, timeString(proc.AliveUntil()), aliveUntil, "interval %v", interval)
		require.Equal(t, timeString(utcMS(hb).Add(vigiltype.AliveWindow(interval))), aliveUntil, "interval %v", interval)
	}

	for _, lease := range []time.Duration{time.Millisecond, 1500 * time.Millisecond, 5 * time.Minute, 24 * time.Hour} {
		task, err := s.TaskEnqueue(ctx, store.TaskEnqueueParams{
			TaskType: "t", MaxAttempts: 1, MaxReclaims: 1, LeaseTimeout: lease, RunAfter: now, Now: now,
		})
		require.NoError(t, err)
		claimed, err := s.TaskClaim(ctx, store.TaskClaimParams{
			InstanceID: "inst-f", Types: []string{"t"}, LeaseTimeout: time.Hour, Now: now,
		})
		require.NoError(t, err)
		require.Equal(t, task.TaskID, claimed.TaskID)
		var expires string
		require.NoError(t, db.QueryRowContext(ctx,
			`SELECT lease_expires_at FROM tasks WHERE task_id = ?`, task.TaskID).Scan(&expires))
		require.Equal(t, timeString(now.Add(lease)), expires, "lease %v", lease)
	}
}

// TestConcurrentWritersAcrossStores opens the same file twice, as the CLI
// does next to a running server, and writes from both at once: the busy
// timeout and IMMEDIATE transactions must keep "database is locked" away.
func TestConcurrentWritersAcrossStores(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "vigil.db")
	stores := []*Store{openTestStore(t, path), openTestStore(t, path)}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

	const perGoroutine = 50
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		s := stores[i%len(stores)]
		wg.Go(func() {
			for range perGoroutine {
				if _, err := s.TaskEnqueue(t.Context(), store.TaskEnqueueParams{
					TaskType: "t", MaxAttempts: 1, MaxReclaims: 1, RunAfter: now, Now: now,
				}); err != nil {
					errs[i] = err
					return
				}
				if _, err := s.TaskReclaim(t.Context(), store.TaskReclaimParams{Now: now}); err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	tasks, err := stores[0].TaskList(t.Context(), store.TaskListParams{})
	require.NoError(t, err)
	require.Len(t, tasks, len(errs)*perGoroutine)
}

// TestUpgradeFrom001 opens a database that has only 001_initial, with a
// task claimed before 002_activity existed: Open applies 002 and 003, the
// task reads with no activity and heartbeat version 0, and a v2 heartbeat
// takes its claim (started_at) as the activity it never moves back from.
func TestUpgradeFrom001(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "vigil.db")
	migrations, err := loadMigrations()
	require.NoError(t, err)
	t0 := time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC)

	db, err := sql.Open(driverName, path)
	require.NoError(t, err)
	for _, stmt := range []string{
		`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL) STRICT`,
		migrations[0].sql,
		`INSERT INTO schema_migrations VALUES (1, 'initial', '2026-01-01T00:00:00.000Z')`,
	} {
		_, err := db.ExecContext(ctx, stmt)
		require.NoError(t, err)
	}
	_, err = db.ExecContext(ctx, `
		INSERT INTO processes (instance_id, token_hash, process_kind, hostname, pid, liveness_interval_s,
			started_at, last_heartbeat_at, alive_until)
		VALUES ('w', 'h', 'worker', 'host-a', 1, 3600, @t0, @t0, '2026-03-14T12:26:53.000Z')`,
		sql.Named("t0", timeString(t0)))
	require.NoError(t, err)
	var taskID int64
	require.NoError(t, db.QueryRowContext(ctx, `
		INSERT INTO tasks (task_type, payload, status, max_attempts, max_reclaims, lease_owner, lease_epoch,
			lease_expires_at, last_heartbeat_at, started_at, run_after, created_at, updated_at)
		VALUES ('t', '{}', 'running', 3, 3, 'w', 1, '2026-03-14T09:31:53.000Z', @t0, @t0, @t0, @t0, @t0)
		RETURNING task_id`, sql.Named("t0", timeString(t0))).Scan(&taskID))
	require.NoError(t, db.Close())

	s, err := Open(ctx, path)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	require.Equal(t, []string{"002_activity", "003_registry_events", "004_failed_by", "005_store_pulse", "006_config_written_by"}, s.applied)

	task, err := s.TaskGet(ctx, taskID)
	require.NoError(t, err)
	require.Nil(t, task.LastActivityAt)
	require.Zero(t, task.HeartbeatSchemaVersion)

	lease := store.TaskLease{TaskID: taskID, Epoch: 1, InstanceID: "w"}
	now := t0.Add(time.Minute)
	task, err = s.TaskHeartbeat(ctx, store.TaskHeartbeatParams{TaskLease: lease, LeaseTimeout: time.Hour, SchemaVersion: 1, Now: now})
	require.NoError(t, err)
	require.Nil(t, task.LastActivityAt)
	require.Equal(t, 1, task.HeartbeatSchemaVersion)

	beforeClaim := t0.Add(-time.Minute)
	task, err = s.TaskHeartbeat(ctx, store.TaskHeartbeatParams{
		TaskLease: lease, LeaseTimeout: time.Hour, SchemaVersion: 2, ActivityAt: &beforeClaim, ExpireOnActivity: true, Now: now,
	})
	require.NoError(t, err)
	require.Equal(t, &t0, task.LastActivityAt)
	require.Equal(t, t0.Add(time.Hour), *task.LeaseExpiresAt)
}
