package pgstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/internal/store/pgstore/pgtest"
	"github.com/vigil-fleet/vigil/internal/store/storetest"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestStore(t *testing.T) {
	t.Parallel()
	storetest.Exercise(t.Context(), t, func(t *testing.T) store.Store {
		return openTestStore(t, pgtest.URL(t))
	})
}

// TestStoreSessionTimeZone runs the suite on connections whose session
// TimeZone is far from UTC (+12:45): times read back, times written into
// reasons and time comparisons must not depend on it.
func TestStoreSessionTimeZone(t *testing.T) {
	t.Parallel()
	storetest.Exercise(t.Context(), t, func(t *testing.T) store.Store {
		return openTestStore(t, withParam(t, pgtest.URL(t), "timezone", "Pacific/Chatham"))
	})
}

// openTestStore opens the store at url and closes it when t ends.
func openTestStore(t *testing.T, url string) *Store {
	t.Helper()
	s, err := Open(t.Context(), url)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// rawPool connects to url without the store, for looking at what it wrote.
func rawPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// withParam returns the URL u with the query parameter key set to value.
func withParam(t *testing.T, u, key, value string) string {
	t.Helper()
	parsed, err := url.Parse(u)
	require.NoError(t, err)
	q := parsed.Query()
	q.Set(key, value)
	parsed.RawQuery = q.Encode()
	return parsed.String()
}

// t0 is the reference instant of these tests.
var t0 = time.Date(2026, time.March, 14, 9, 26, 53, 0, time.UTC)

// register inserts an instance with a one-hour liveness interval at now.
func register(t *testing.T, s *Store, instanceID string, now time.Time) {
	t.Helper()
	_, err := s.ProcessRegister(t.Context(), store.ProcessRegisterParams{
		InstanceID: instanceID, TokenHash: "h", ProcessKind: "worker", Hostname: "host", PID: 1,
		LivenessIntervalS: 3600, Now: now,
	})
	require.NoError(t, err)
}

// enqueue inserts n tasks of type "t" claimable at t0, in one statement.
func enqueue(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	_, err := pool.Exec(t.Context(), `
		INSERT INTO tasks (task_type, payload, status, max_attempts, max_reclaims, run_after, created_at, updated_at)
		SELECT 't', '{}', 'scheduled', 3, 3, $1, $1, $1 FROM generate_series(1, $2)`, t0, n)
	require.NoError(t, err)
}

func TestOpenErrorsNeverContainThePassword(t *testing.T) {
	t.Parallel()
	const password = "hunter2"
	for _, connString := range []string{
		"postgres://u:hunter2@127.0.0.1:1/x",                            // nothing listens on port 1
		"postgresql://u:hunter2@127.0.0.1:1/x?sslmode=disable",          // same, other scheme
		"postgres://u@127.0.0.1:1/x?password=hunter2",                   // password as a parameter
		"postgres://u:hunter2@127.0.0.1:1/x?sslmode=bogus",              // parse error
		"postgres://u:hunter2@127.0.0.1:notaport/x",                     // parse error
		"postgres://u:hunter2@[::1/x",                                   // malformed host
		"postgres://u:hun/ter2@127.0.0.1:1/x",                           // '/' in the password, unescaped
		"postgres://u:hun%2Fter2@127.0.0.1:1/x",                         // escaped
		"postgres://u:hunter2@127.0.0.1:1/x?connect_timeout=notanumber", // bad parameter
		"host=127.0.0.1 port=1 user=u password=hunter2 dbname=x",        // keyword/value
		"host=127.0.0.1 port=1 user=u password='hunter2' dbname=x",      // quoted
		"host=127.0.0.1 port=x user=u password=hunter2",                 // keyword/value parse error
	} {
		t.Run(connString, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			s, err := Open(ctx, connString)
			require.Error(t, err)
			require.Nil(t, s)
			for _, text := range []string{err.Error(), fmt.Sprintf("%v", err), fmt.Sprintf("%+v", err), fmt.Sprintf("%q", err)} {
				require.NotContains(t, text, password)
				require.NotContains(t, text, "ter2")
			}
			for e := errors.Unwrap(err); e != nil; e = errors.Unwrap(e) {
				require.NotContains(t, e.Error(), password, "wrapped error")
			}
			require.Contains(t, err.Error(), "open postgres store")

			_, err = MigrateOnly(ctx, connString)
			require.Error(t, err)
			require.NotContains(t, err.Error(), password)
		})
	}

	// The error says what failed and where.
	_, err := Open(t.Context(), "postgres://u:hunter2@127.0.0.1:1/x")
	require.ErrorContains(t, err, "postgres://u:xxxxx@127.0.0.1:1/x")
	require.ErrorContains(t, err, "connect")
}

func TestRedact(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://u:hunter2@db.example:5432/vigil?sslmode=require": "postgres://u:xxxxx@db.example:5432/vigil?sslmode=require",
		"postgres://u@db/vigil?password=hunter2":                     "postgres://u@db/vigil?password=xxxxx",
		"postgres://db/vigil":                                        "postgres://db/vigil",
		"postgres://u:hunter2@[::1/x":                                "postgres://…",
		"host=db user=u password=hunter2 dbname=vigil":               "host=db user=u password=xxxxx dbname=vigil",
	} {
		require.Equal(t, want, Redact(in), in)
	}
}

func TestMigrationsIdempotent(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.URL(t)
	migrations, err := loadMigrations()
	require.NoError(t, err)
	require.NotEmpty(t, migrations)
	var names []string
	for _, m := range migrations {
		names = append(names, m.String())
	}
	require.Equal(t, "001_initial", names[0])

	// Ahead of a rollout: everything applied once, then nothing.
	applied, err := MigrateOnly(ctx, url)
	require.NoError(t, err)
	require.Equal(t, names, applied)
	applied, err = MigrateOnly(ctx, url)
	require.NoError(t, err)
	require.Empty(t, applied)

	s, err := Open(ctx, url)
	require.NoError(t, err)
	task, err := s.TaskEnqueue(ctx, store.TaskEnqueueParams{
		TaskType: "email", MaxAttempts: 1, MaxReclaims: 1, RunAfter: t0, Now: t0,
	})
	require.NoError(t, err)
	require.NoError(t, s.Close())

	// Reopening applies nothing twice and keeps the data.
	s = openTestStore(t, url)
	_, err = s.TaskGet(ctx, task.TaskID)
	require.NoError(t, err)
	requireMigrationsRecorded(t, rawPool(t, url), migrations)
}

// requireMigrationsRecorded checks that schema_migrations holds exactly
// migrations, with sqlitestore's numbers and names.
func requireMigrationsRecorded(t *testing.T, pool *pgxpool.Pool, migrations []migration) {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT version, name FROM schema_migrations ORDER BY version`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (migration, error) {
		var m migration
		err := row.Scan(&m.version, &m.name)
		return m, err
	})
	require.NoError(t, err)
	require.Len(t, got, len(migrations))
	for i, m := range migrations {
		require.Equal(t, m.version, got[i].version)
		require.Equal(t, m.name, got[i].name)
	}
	require.Equal(t, migration{version: 1, name: "initial"}, got[0])
}

// TestConcurrentOpen starts four servers at once on a fresh schema: the
// advisory lock lets one apply the migrations while the others wait and
// then find them applied.
func TestConcurrentOpen(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	migrations, err := loadMigrations()
	require.NoError(t, err)

	const servers = 4
	stores := make([]*Store, servers)
	errs := make([]error, servers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range servers {
		wg.Go(func() {
			<-start
			stores[i], errs[i] = Open(t.Context(), url)
		})
	}
	close(start)
	wg.Wait()
	for i := range servers {
		require.NoError(t, errs[i])
		t.Cleanup(func() { require.NoError(t, stores[i].Close()) })
	}
	requireMigrationsRecorded(t, rawPool(t, url), migrations)
	for _, s := range stores {
		sweepers, err := s.SweeperList(t.Context())
		require.NoError(t, err)
		require.Empty(t, sweepers)
	}
}

// TestConcurrentClaimsAcrossServers has two stores (two pools: two vigil
// servers) on one database, each with many claimers: no task is claimed
// twice, and every task is claimed once.
func TestConcurrentClaimsAcrossServers(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	servers := []*Store{openTestStore(t, url), openTestStore(t, url)}
	const (
		tasks            = 500
		workersPerServer = 8
	)
	enqueue(t, rawPool(t, url), tasks)
	now := t0.Add(time.Second)

	type worker struct {
		s       *Store
		id      string
		claimed []int64
		err     error
	}
	var workers []*worker
	for i, s := range servers {
		for j := range workersPerServer {
			w := &worker{s: s, id: fmt.Sprintf("server%d-w%d", i, j)}
			register(t, s, w.id, t0)
			workers = append(workers, w)
		}
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() {
			<-start
			for {
				task, err := w.s.TaskClaim(t.Context(), store.TaskClaimParams{
					InstanceID: w.id, Types: []string{"t"}, LeaseTimeout: time.Minute, Now: now,
				})
				if err != nil || task == nil {
					w.err = err
					return
				}
				w.claimed = append(w.claimed, task.TaskID)
				lease := store.TaskLease{TaskID: task.TaskID, Epoch: task.LeaseEpoch, InstanceID: w.id}
				if _, err := w.s.TaskComplete(t.Context(), store.TaskCompleteParams{TaskLease: lease, Now: now}); err != nil {
					w.err = err
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()

	seen := make(map[int64]string)
	perServer := make([]int, len(servers))
	for _, w := range workers {
		require.NoError(t, w.err, w.id)
		for _, id := range w.claimed {
			require.Empty(t, seen[id], "task %d claimed by %s and %s", id, seen[id], w.id)
			seen[id] = w.id
		}
		if strings.HasPrefix(w.id, "server0") {
			perServer[0] += len(w.claimed)
		} else {
			perServer[1] += len(w.claimed)
		}
	}
	require.Len(t, seen, tasks)
	t.Logf("claims per server: %v", perServer)

	var notDone int
	require.NoError(t, rawPool(t, url).QueryRow(t.Context(),
		`SELECT count(*) FROM tasks WHERE status <> 'completed' OR lease_epoch <> 1`).Scan(&notDone))
	require.Zero(t, notDone)
}

// TestConcurrentReclaimAcrossServers has two stores sweep the same 500
// expired leases at once, in small batches from several goroutines each:
// every lease is reclaimed exactly once.
func TestConcurrentReclaimAcrossServers(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	servers := []*Store{openTestStore(t, url), openTestStore(t, url)}
	pool := rawPool(t, url)
	const tasks = 500
	register(t, servers[0], "holder", t0)
	enqueue(t, pool, tasks)
	// Claimed at t0 with a one-minute lease.
	_, err := pool.Exec(t.Context(), `
		UPDATE tasks SET status = 'running', lease_owner = 'holder', lease_epoch = 1,
			started_at = $1, last_heartbeat_at = $1, lease_expires_at = $1::timestamptz + interval '1 minute'`, t0)
	require.NoError(t, err)
	now := t0.Add(2 * time.Minute)

	const sweepersPerServer = 4
	type sweeper struct {
		reclaimed []int64
		err       error
	}
	var sweepers []*sweeper
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, s := range servers {
		for range sweepersPerServer {
			sw := &sweeper{}
			sweepers = append(sweepers, sw)
			wg.Go(func() {
				<-start
				for {
					got, err := s.TaskReclaim(t.Context(), store.TaskReclaimParams{Now: now, Limit: 25})
					if err != nil || len(got) == 0 {
						sw.err = err
						return
					}
					for _, task := range got {
						sw.reclaimed = append(sw.reclaimed, task.TaskID)
					}
				}
			})
		}
	}
	close(start)
	wg.Wait()

	seen := make(map[int64]bool)
	total := 0
	for _, sw := range sweepers {
		require.NoError(t, sw.err)
		total += len(sw.reclaimed)
		for _, id := range sw.reclaimed {
			require.False(t, seen[id], "task %d reclaimed twice", id)
			seen[id] = true
		}
	}
	require.Equal(t, tasks, total)

	var wrong int
	require.NoError(t, pool.QueryRow(t.Context(), `
		SELECT count(*) FROM tasks
		WHERE reclaims <> 1 OR status <> 'scheduled' OR lease_owner IS NOT NULL`).Scan(&wrong))
	require.Zero(t, wrong)
}

// TestReclaimRacingLeaseCalls runs reclaims while the holder completes,
// heartbeats and releases the same expired leases from the other server:
// each task ends either reclaimed (and its holder's call refused with
// ErrStaleEpoch) or changed by its holder (and not reclaimed), never both.
func TestReclaimRacingLeaseCalls(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	holderSide, sweeperSide := openTestStore(t, url), openTestStore(t, url)
	pool := rawPool(t, url)
	const tasks = 300
	register(t, holderSide, "holder", t0)
	enqueue(t, pool, tasks)
	var held []*vigiltype.Task
	for range tasks {
		task, err := holderSide.TaskClaim(t.Context(), store.TaskClaimParams{
			InstanceID: "holder", Types: []string{"t"}, LeaseTimeout: time.Minute, Now: t0,
		})
		require.NoError(t, err)
		held = append(held, task)
	}
	now := t0.Add(2 * time.Minute) // every lease has expired

	var (
		wg        sync.WaitGroup
		reclaimed = make(map[int64]bool)
		holderOK  = make(map[int64]bool)
		errs      []error
		mu        sync.Mutex
		start     = make(chan struct{})
	)
	wg.Go(func() {
		<-start
		for {
			got, err := sweeperSide.TaskReclaim(t.Context(), store.TaskReclaimParams{Now: now, Limit: 10})
			mu.Lock()
			if err != nil {
				errs = append(errs, err)
			}
			for _, task := range got {
				reclaimed[task.TaskID] = true
			}
			mu.Unlock()
			if err != nil || len(got) == 0 {
				return
			}
		}
	})
	// The holder's calls: complete, release or renew, by task.
	holderCall := func(i int) {
		task := held[i]
		lease := store.TaskLease{TaskID: task.TaskID, Epoch: task.LeaseEpoch, InstanceID: "holder"}
		var err error
		switch i % 3 {
		case 0:
			_, err = holderSide.TaskComplete(t.Context(), store.TaskCompleteParams{TaskLease: lease, Now: now})
		case 1:
			_, err = holderSide.TaskRelease(t.Context(), store.TaskReleaseParams{TaskLease: lease, Now: now})
		case 2:
			_, err = holderSide.TaskHeartbeat(t.Context(), store.TaskHeartbeatParams{
				TaskLease: lease, LeaseTimeout: time.Hour, SchemaVersion: 1, Now: now,
			})
		}
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err == nil:
			holderOK[task.TaskID] = true
		case !errors.Is(err, vigiltype.ErrStaleEpoch):
			errs = append(errs, err)
		}
	}
	// The holder works from the newest task down, in several goroutines,
	// while the sweeper works up from the oldest: they meet in the middle.
	const holderGoroutines = 4
	for g := range holderGoroutines {
		wg.Go(func() {
			<-start
			for i := len(held) - 1 - g; i >= 0; i -= holderGoroutines {
				holderCall(i)
			}
		})
	}
	close(start)
	wg.Wait()
	require.Empty(t, errs)
	t.Logf("reclaimed %d, changed by their holder %d", len(reclaimed), len(holderOK))

	for _, task := range held {
		id := task.TaskID
		require.True(t, reclaimed[id] != holderOK[id], "task %d: reclaimed=%v holder call succeeded=%v", id, reclaimed[id], holderOK[id])
		got, err := sweeperSide.TaskGet(t.Context(), id)
		require.NoError(t, err)
		if reclaimed[id] {
			require.Equal(t, 1, got.Reclaims, "task %d", id)
			require.Equal(t, vigiltype.TaskScheduled, got.Status)
		} else {
			require.Zero(t, got.Reclaims, "task %d", id)
		}
	}
}

// TestStoresTrustTheirCallersClock pins down that the store is
// clock-agnostic: it decides by the "now" each caller passes. Two servers
// whose clocks are minutes apart therefore disagree about leases and
// liveness — the server running ahead reclaims a lease its holder renewed a
// moment ago by the other server's clock. A daemon with several servers on
// one database must pass one fleet clock; Store.Now (the database's clock)
// is one all of them can read.
func TestStoresTrustTheirCallersClock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.URL(t)
	behind, ahead := openTestStore(t, url), openTestStore(t, url)
	const skew = 6 * time.Minute
	enqueue(t, rawPool(t, url), 1)

	register(t, behind, "w", t0)
	task, err := behind.TaskClaim(ctx, store.TaskClaimParams{
		InstanceID: "w", Types: []string{"t"}, LeaseTimeout: 5 * time.Minute, Now: t0,
	})
	require.NoError(t, err)
	renewed := t0.Add(time.Minute)
	lease := store.TaskLease{TaskID: task.TaskID, Epoch: task.LeaseEpoch, InstanceID: "w"}
	_, err = behind.TaskHeartbeat(ctx, store.TaskHeartbeatParams{
		TaskLease: lease, LeaseTimeout: 5 * time.Minute, SchemaVersion: 1, Now: renewed,
	})
	require.NoError(t, err)

	// By the lagging server's clock the lease has four minutes to run...
	got, err := behind.TaskReclaim(ctx, store.TaskReclaimParams{Now: renewed})
	require.NoError(t, err)
	require.Empty(t, got)
	// ...but the server six minutes ahead, sweeping at the same instant,
	// sees it expired and takes it.
	got, err = ahead.TaskReclaim(ctx, store.TaskReclaimParams{Now: renewed.Add(skew)})
	require.NoError(t, err)
	require.Len(t, got, 1)
	_, err = behind.TaskHeartbeat(ctx, store.TaskHeartbeatParams{
		TaskLease: lease, LeaseTimeout: 5 * time.Minute, SchemaVersion: 1, Now: renewed,
	})
	require.ErrorIs(t, err, vigiltype.ErrStaleEpoch)

	// Both servers read the same clock from the database.
	a, err := behind.Now(ctx)
	require.NoError(t, err)
	b, err := ahead.Now(ctx)
	require.NoError(t, err)
	require.Equal(t, time.UTC, a.Location())
	require.False(t, b.Before(a), "database clock went back: %s then %s", a, b)
	require.Less(t, b.Sub(a), 5*time.Second)
}

// TestStoredTimes checks what lands in the database: whole milliseconds,
// and alive_until / lease_expires_at computed in SQL agreeing exactly with
// vigiltype.AliveWindow and Go's duration arithmetic.
func TestStoredTimes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.URL(t)
	s := openTestStore(t, url)
	pool := rawPool(t, url)
	now := time.Date(2026, 12, 31, 23, 59, 58, 123_456_789, time.UTC)

	for i, interval := range []float64{0.1, 1.5, 10, 33.333, 0.0007, 86400} {
		id := fmt.Sprintf("inst-%d", i)
		_, err := s.ProcessRegister(ctx, store.ProcessRegisterParams{
			InstanceID: id, TokenHash: "h", ProcessKind: "k", Hostname: "h", PID: 1, LivenessIntervalS: interval, Now: now,
		})
		require.NoError(t, err)
		hb := now.Add(1234 * time.Millisecond)
		proc, err := s.ProcessHeartbeat(ctx, store.ProcessHeartbeatParams{InstanceID: id, TokenHash: "h", Now: hb})
		require.NoError(t, err)

		var lastHeartbeat, aliveUntil time.Time
		require.NoError(t, pool.QueryRow(ctx,
			`SELECT last_heartbeat_at, alive_until FROM processes WHERE instance_id = $1`, id).
			Scan(&lastHeartbeat, &aliveUntil))
		require.True(t, time.Date(2026, 12, 31, 23, 59, 59, 357_000_000, time.UTC).Equal(lastHeartbeat), lastHeartbeat)
		require.True(t, proc.AliveUntil().Equal(aliveUntil), "interval %v: %s", interval, aliveUntil)
		require.True(t, utcMS(hb).Add(vigiltype.AliveWindow(interval)).Equal(aliveUntil), "interval %v", interval)
	}

	for _, lease := range []time.Duration{time.Millisecond, 1500 * time.Millisecond, 5 * time.Minute, 24 * time.Hour} {
		task, err := s.TaskEnqueue(ctx, store.TaskEnqueueParams{
			TaskType: "t", MaxAttempts: 1, MaxReclaims: 1, LeaseTimeout: lease, RunAfter: now, Now: now,
		})
		require.NoError(t, err)
		claimed, err := s.TaskClaim(ctx, store.TaskClaimParams{
			InstanceID: "inst-5", Types: []string{"t"}, LeaseTimeout: time.Hour, Now: now,
		})
		require.NoError(t, err)
		require.Equal(t, task.TaskID, claimed.TaskID)
		var expires time.Time
		require.NoError(t, pool.QueryRow(ctx,
			`SELECT lease_expires_at FROM tasks WHERE task_id = $1`, task.TaskID).Scan(&expires))
		require.True(t, utcMS(now).Add(lease).Equal(expires), "lease %v: %s", lease, expires)
	}

	// Nothing finer than a millisecond was written.
	var fine int
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT count(*) FROM processes
		WHERE date_trunc('milliseconds', started_at) <> started_at
			OR date_trunc('milliseconds', last_heartbeat_at) <> last_heartbeat_at
			OR date_trunc('milliseconds', alive_until) <> alive_until`).Scan(&fine))
	require.Zero(t, fine)
}

// TestValuesPostgreSQLCannotStore: text with a NUL character (valid in Go
// and in SQLite) cannot be stored in PostgreSQL; it is refused with
// ErrInvalid (HTTP 400), not an internal error, and nothing changes.
func TestValuesPostgreSQLCannotStore(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := openTestStore(t, pgtest.URL(t))

	_, err := s.ProcessRegister(ctx, store.ProcessRegisterParams{
		InstanceID: "w", TokenHash: "h", ProcessKind: "k", Hostname: "bad\x00host", PID: 1, LivenessIntervalS: 1, Now: t0,
	})
	require.ErrorIs(t, err, vigiltype.ErrInvalid)
	require.NotContains(t, err.Error(), "SQLSTATE")

	register(t, s, "w", t0)
	_, err = s.TaskEnqueue(ctx, store.TaskEnqueueParams{TaskType: "t", MaxAttempts: 1, MaxReclaims: 1, RunAfter: t0, Now: t0})
	require.NoError(t, err)
	task, err := s.TaskClaim(ctx, store.TaskClaimParams{InstanceID: "w", Types: []string{"t"}, LeaseTimeout: time.Minute, Now: t0})
	require.NoError(t, err)
	lease := store.TaskLease{TaskID: task.TaskID, Epoch: task.LeaseEpoch, InstanceID: "w"}
	_, err = s.TaskFail(ctx, store.TaskFailParams{TaskLease: lease, Error: "boom\x00", RetryAt: t0, Now: t0})
	require.ErrorIs(t, err, vigiltype.ErrInvalid)
	got, err := s.TaskGet(ctx, task.TaskID)
	require.NoError(t, err)
	require.Equal(t, task, got)

	// So is such text in an agent record or a process event; nothing is
	// written.
	_, err = s.AgentRegister(ctx, store.AgentRegisterParams{Name: "research", Function: "bad\x00function", Now: t0})
	require.ErrorIs(t, err, vigiltype.ErrInvalid)
	_, err = s.AgentGet(ctx, "research")
	require.ErrorIs(t, err, vigiltype.ErrNotFound)
	_, err = s.EventRecord(ctx, store.EventRecordParams{Agent: "research", Kind: vigiltype.EventExit, At: t0, StderrTail: "bad\x00tail"})
	require.ErrorIs(t, err, vigiltype.ErrInvalid)
	events, err := s.EventList(ctx, store.EventListParams{})
	require.NoError(t, err)
	require.Empty(t, events)

	// A duplicate instance is refused with sqlitestore's words.
	_, err = s.ProcessRegister(ctx, store.ProcessRegisterParams{
		InstanceID: "w", TokenHash: "h2", ProcessKind: "k", Hostname: "h", PID: 1, LivenessIntervalS: 1, Now: t0,
	})
	require.EqualError(t, err, "register process w: instance_id already exists")
}

// TestOrderingColumnsAreByteOrdered: the columns listings order by compare
// bytes (COLLATE "C"), like SQLite, whatever the database's collation; so
// do the agent names that key the registry, events and planned stops.
func TestOrderingColumnsAreByteOrdered(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	openTestStore(t, url)
	rows, err := rawPool(t, url).Query(t.Context(), `
		SELECT table_name || '.' || column_name, coalesce(collation_name, '')
		FROM information_schema.columns
		WHERE table_schema = current_schema() AND column_name IN ('instance_id', 'name', 'hostname', 'agent')
			AND table_name IN ('processes', 'sweepers', 'heartbeat_versions', 'agents', 'process_events', 'planned_stops')
			AND (table_name, column_name) <> ('processes', 'hostname') -- filtered on, never ordered by
		ORDER BY 1`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) ([2]string, error) {
		var c [2]string
		err := row.Scan(&c[0], &c[1])
		return c, err
	})
	require.NoError(t, err)
	require.Equal(t, [][2]string{
		{"agents.name", "C"}, {"heartbeat_versions.hostname", "C"}, {"planned_stops.agent", "C"},
		{"process_events.agent", "C"}, {"processes.instance_id", "C"}, {"sweepers.name", "C"},
	}, got)
}

// TestMigrationsMatchSQLite: both backends carry the same migrations, with
// the same numbers and names (STYLE §2).
func TestMigrationsMatchSQLite(t *testing.T) {
	t.Parallel()
	migrations, err := loadMigrations()
	require.NoError(t, err)
	var names []string
	for _, m := range migrations {
		names = append(names, m.String()+".sql")
	}
	entries, err := os.ReadDir(filepath.Join("..", "sqlitestore", "migrations"))
	require.NoError(t, err)
	var sqliteNames []string
	for _, e := range entries {
		sqliteNames = append(sqliteNames, e.Name())
	}
	require.Equal(t, sqliteNames, names)
}

// TestUpgradeFrom001 opens a schema that has only 001_initial, with a task
// claimed before 002_activity existed: Open applies 002 and 003, the task
// reads with no activity and heartbeat version 0, and a v2 heartbeat takes
// its claim (started_at) as the activity it never moves back from.
func TestUpgradeFrom001(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.URL(t)
	migrations, err := loadMigrations()
	require.NoError(t, err)

	pool := rawPool(t, url)
	for _, stmt := range []string{
		`CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT clock_timestamp())`,
		migrations[0].sql,
		`INSERT INTO schema_migrations (version, name) VALUES (1, 'initial')`,
	} {
		_, err := pool.Exec(ctx, stmt)
		require.NoError(t, err)
	}
	_, err = pool.Exec(ctx, `
		INSERT INTO processes (instance_id, token_hash, process_kind, hostname, pid, liveness_interval_s,
			started_at, last_heartbeat_at, alive_until)
		VALUES ('w', 'h', 'worker', 'host-a', 1, 3600, $1, $1, $1::timestamptz + interval '3 hours')`, t0)
	require.NoError(t, err)
	var taskID int64
	require.NoError(t, pool.QueryRow(ctx, `
		INSERT INTO tasks (task_type, payload, status, max_attempts, max_reclaims, lease_owner, lease_epoch,
			lease_expires_at, last_heartbeat_at, started_at, run_after, created_at, updated_at)
		VALUES ('t', '{}', 'running', 3, 3, 'w', 1, $1::timestamptz + interval '5 minutes', $1, $1, $1, $1, $1)
		RETURNING task_id`, t0).Scan(&taskID))

	applied, err := MigrateOnly(ctx, url)
	require.NoError(t, err)
	require.Equal(t, []string{"002_activity", "003_registry_events", "004_failed_by", "005_store_pulse", "006_config_written_by"}, applied)
	s := openTestStore(t, url)

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

// TestClaimByIDNeverWaits: a claim by id of a task another transaction
// holds locked is refused at once with ErrNotClaimable instead of waiting
// for the lock while holding the instance's row (which a reclaim or lease
// end of that task, holding the task's lock, may be waiting for). Once the
// lock is gone the task is claimable.
func TestClaimByIDNeverWaits(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.URL(t)
	s := openTestStore(t, url)
	pool := rawPool(t, url)
	register(t, s, "w", t0)
	enqueue(t, pool, 1)
	var taskID int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT task_id FROM tasks`).Scan(&taskID))

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM tasks WHERE task_id = $1 FOR UPDATE`, taskID)
	require.NoError(t, err)

	claimCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = s.TaskClaim(claimCtx, store.TaskClaimParams{InstanceID: "w", TaskID: taskID, LeaseTimeout: time.Minute, Now: t0})
	require.ErrorIs(t, err, vigiltype.ErrNotClaimable)
	require.NoError(t, tx.Rollback(ctx))

	task, err := s.TaskClaim(ctx, store.TaskClaimParams{InstanceID: "w", TaskID: taskID, LeaseTimeout: time.Minute, Now: t0})
	require.NoError(t, err)
	require.Equal(t, taskID, task.TaskID)
}

// TestEventIDsCommitOutOfOrder pins down the event cursor rule with several
// writers (STYLE: an auto-increment cursor is only safe with one writer):
// an event whose transaction commits after a higher id is missed by a
// reader paging back by BeforeID past it, and is still found by the next
// poll of the undelivered events, which is how a consumer must read them.
func TestEventIDsCommitOutOfOrder(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.URL(t)
	s := openTestStore(t, url)

	// Another server's insert takes the lower id and commits last.
	tx, err := rawPool(t, url).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var lateID int64
	require.NoError(t, tx.QueryRow(ctx, `
		INSERT INTO process_events (agent, kind, at, signal, run_duration_ms, stderr_tail)
		VALUES ('research', 'exit', $1, '', 0, '') RETURNING event_id`, t0).Scan(&lateID))
	early, err := s.EventRecord(ctx, store.EventRecordParams{Agent: "research", Kind: vigiltype.EventExit, At: t0})
	require.NoError(t, err)
	require.Greater(t, early.EventID, lateID)

	// A reader pages: the newest page holds only the committed event, and
	// the next page (below it) is empty.
	page, err := s.EventList(ctx, store.EventListParams{Limit: 1})
	require.NoError(t, err)
	require.Len(t, page, 1)
	require.Equal(t, early.EventID, page[0].EventID)
	_, err = s.EventAck(ctx, early.EventID, "slack", t0)
	require.NoError(t, err)
	page, err = s.EventList(ctx, store.EventListParams{BeforeID: early.EventID, Limit: 1})
	require.NoError(t, err)
	require.Empty(t, page)

	// The late event commits: a paging reader already went past its id, a
	// consumer polling the undelivered events finds it.
	require.NoError(t, tx.Commit(ctx))
	undelivered, err := s.EventList(ctx, store.EventListParams{Undelivered: true})
	require.NoError(t, err)
	require.Len(t, undelivered, 1)
	require.Equal(t, lateID, undelivered[0].EventID)
}
