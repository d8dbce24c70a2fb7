package bench

// Read rows (issue #6): process_status and the first page of
// list_processes over HTTP on a real loopback server, against a history of
// process instances bulk-inserted with SQL, each next to the same SQL run
// through the same driver without HTTP.

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "modernc.org/sqlite" // the driver sqlitestore uses, for the baselines

	"github.com/vigil-fleet/vigil/internal/daemon"
)

func init() {
	register(Case{Name: "status-sqlite", Run: func(ctx context.Context, env Env) ([]Row, error) {
		return runStatus(ctx, env, rdSQLite)
	}})
	register(Case{Name: "status-postgres", NeedsPostgres: true, Run: func(ctx context.Context, env Env) ([]Row, error) {
		return runStatus(ctx, env, rdPostgres)
	}})
	register(Case{Name: "list-sqlite", Run: func(ctx context.Context, env Env) ([]Row, error) {
		return runList(ctx, env, rdSQLite)
	}})
	register(Case{Name: "list-postgres", NeedsPostgres: true, Run: func(ctx context.Context, env Env) ([]Row, error) {
		return runList(ctx, env, rdPostgres)
	}})
}

// rdBackend names a storage backend of a read, claim or reclaim row.
type rdBackend string

const (
	rdSQLite   rdBackend = "SQLite"
	rdPostgres rdBackend = "PostgreSQL"
)

// Fixture shape: rdKinds kinds on rdHosts hosts; the rdAlive newest
// instances are alive, the rest are history (stopped).
const (
	rdKinds = 20
	rdHosts = 50
	rdAlive = 100
	// rdStatusKind is the kind process_status asks for.
	rdStatusKind = "kind-7"
	// rdPageLimit is list_processes' default page size.
	rdPageLimit = 50
)

// rdServer is a vigil server on a loopback port and a raw connection to its
// database for fixtures and baselines.
type rdServer struct {
	backend rdBackend
	d       *daemon.Daemon
	url     string
	http    *http.Client
	sqlite  *sql.DB       // SQLite: one connection to the same file (fixtures, baselines)
	pg      *pgxpool.Pool // PostgreSQL: a pool on the bench's schema
	schema  string        // PostgreSQL: the bench's schema
	stop    func()
}

// rdStart starts a server on a fresh database of backend: an SQLite file
// under env.Dir, or a schema of its own on env.PostgresURL (dropped by
// stop). The lease reclaimer runs every sweep (0: once an hour, so it does
// not disturb a read measurement).
func rdStart(ctx context.Context, env Env, backend rdBackend, name string, sweep time.Duration) (*rdServer, error) {
	if sweep == 0 {
		sweep = time.Hour
	}
	s := &rdServer{backend: backend}
	var cleanups []func()
	s.stop = func() {
		for _, f := range slices.Backward(cleanups) {
			f()
		}
	}
	var db string
	switch backend {
	case rdSQLite:
		db = filepath.Join(env.Dir, name+"-"+fmt.Sprint(time.Now().UnixNano())+".db")
	case rdPostgres:
		schema, err := newPGSchema(ctx, env.PostgresURL)
		if err != nil {
			return nil, err
		}
		cleanups = append(cleanups, func() { _ = schema.Drop() })
		if db, err = schema.URL(nil); err != nil {
			s.stop()
			return nil, err
		}
		s.schema = schema.Name
	}
	dctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d, err := daemon.New(dctx, daemon.Config{
		DB: db, Addr: "127.0.0.1:0", SweepInterval: sweep,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		cancel()
		s.stop()
		return nil, fmt.Errorf("start server: %w", err)
	}
	d.Start(dctx)
	cleanups = append(cleanups, func() { cancel(); _ = d.Stop() })
	s.d, s.url = d, d.URL()
	s.http = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 0}}
	cleanups = append(cleanups, s.http.CloseIdleConnections)

	switch backend {
	case rdSQLite:
		raw, err := sql.Open("sqlite", db+"?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)")
		if err != nil {
			s.stop()
			return nil, err
		}
		raw.SetMaxOpenConns(1)
		s.sqlite = raw
		cleanups = append(cleanups, func() { _ = raw.Close() })
	case rdPostgres:
		pool, err := pgxpool.New(ctx, db)
		if err != nil {
			s.stop()
			return nil, err
		}
		s.pg = pool
		cleanups = append(cleanups, pool.Close)
	}
	return s, nil
}

// rdFill grows the processes history from `from` rows to `to` rows: row i
// (1-based) is an instance of kind-(i mod rdKinds) on host-(i mod rdHosts)
// started 2i seconds before base, so growing the history adds older rows
// and leaves the newest as they were. Rows up to rdAlive are alive (a
// recent heartbeat, a long interval); the others stopped long ago: nine in
// ten exited cleanly, one in ten crashed (no exit, stale heartbeat).
func (s *rdServer) rdFill(ctx context.Context, env Env, base time.Time, from, to int) error {
	const chunk = 100_000
	for lo := from + 1; lo <= to; lo += chunk {
		hi := min(lo+chunk-1, to)
		var err error
		switch s.backend {
		case rdSQLite:
			_, err = s.sqlite.ExecContext(ctx, `
				WITH RECURSIVE n(i) AS (SELECT ?1 UNION ALL SELECT i + 1 FROM n WHERE i < ?2),
				r AS (SELECT i, strftime('%Y-%m-%dT%H:%M:%fZ', ?3, '-' || (i * 2) || ' seconds') AS st FROM n)
				INSERT INTO processes (instance_id, token_hash, process_kind, hostname, pid,
					liveness_interval_s, started_at, last_heartbeat_at, alive_until, exited_at)
				SELECT printf('`+rdInstancePrefix+`%012d', i), 'x',
					'kind-' || (i % ?4), 'host-' || (i % ?5), 1000 + i % 30000,
					CASE WHEN i <= ?6 THEN 3600 ELSE 30 END,
					st,
					CASE WHEN i <= ?6 THEN ?3 ELSE strftime('%Y-%m-%dT%H:%M:%fZ', st, '+60 seconds') END,
					CASE WHEN i <= ?6 THEN strftime('%Y-%m-%dT%H:%M:%fZ', ?3, '+10800 seconds')
						ELSE strftime('%Y-%m-%dT%H:%M:%fZ', st, '+150 seconds') END,
					CASE WHEN i <= ?6 OR i % 10 = 0 THEN NULL ELSE strftime('%Y-%m-%dT%H:%M:%fZ', st, '+61 seconds') END
				FROM r`,
				lo, hi, base.UTC().Format("2006-01-02T15:04:05.000Z"), rdKinds, rdHosts, rdAlive)
		case rdPostgres:
			_, err = s.pg.Exec(ctx, `
				INSERT INTO processes (instance_id, token_hash, process_kind, hostname, pid,
					liveness_interval_s, started_at, last_heartbeat_at, alive_until, exited_at)
				SELECT '`+rdInstancePrefix+`' || lpad(i::text, 12, '0'), 'x',
					'kind-' || (i % $4), 'host-' || (i % $5), 1000 + i % 30000,
					CASE WHEN i <= $6 THEN 3600 ELSE 30 END,
					st,
					CASE WHEN i <= $6 THEN $3 ELSE st + interval '60 seconds' END,
					CASE WHEN i <= $6 THEN $3 + interval '3 hours' ELSE st + interval '150 seconds' END,
					CASE WHEN i <= $6 OR i % 10 = 0 THEN NULL ELSE st + interval '61 seconds' END
				FROM (SELECT i, $3::timestamptz - make_interval(secs => i * 2) AS st
					FROM generate_series($1::bigint, $2::bigint) AS i) r`,
				lo, hi, base.UTC().Truncate(time.Millisecond), rdKinds, rdHosts, rdAlive)
		}
		if err != nil {
			return fmt.Errorf("insert history rows %d–%d: %w", lo, hi, err)
		}
		env.Logf("  %s history: %d / %d rows", s.backend, hi, to)
	}
	if s.backend == rdPostgres {
		// Autovacuum analyzes a table this size soon after such a load; the
		// bench does not wait for it.
		if _, err := s.pg.Exec(ctx, `VACUUM ANALYZE processes`); err != nil {
			return fmt.Errorf("analyze processes: %w", err)
		}
	}
	return nil
}

// rdGet does one GET of path and reads the whole answer, which must be 200.
func (s *rdServer) rdGet(ctx context.Context, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url+path, nil)
	if err != nil {
		return err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return nil
}

// The SQL the stores run for process_status and the first page of
// list_processes (sqlitestore and pgstore ProcessLatest and ProcessList), for
// the baselines. rdPageLimit+1 rows: the service asks for one more to know
// whether there is a next page.
const (
	rdProcessColumns = `instance_id, process_kind, hostname, pid, liveness_interval_s,
	started_at, last_heartbeat_at, exited_at, current_task_id, current_task_type`
	rdStatusSQLite = `SELECT ` + rdProcessColumns + ` FROM processes
		WHERE process_kind = ? ORDER BY started_at DESC, instance_id DESC LIMIT 1`
	rdStatusPG = `SELECT ` + rdProcessColumns + ` FROM processes
		WHERE process_kind = $1 ORDER BY started_at DESC, instance_id DESC LIMIT 1`
	rdListSQLite = `SELECT ` + rdProcessColumns + ` FROM processes
		WHERE TRUE ORDER BY started_at DESC, instance_id DESC LIMIT ?`
	rdListPG = `SELECT ` + rdProcessColumns + ` FROM processes
		WHERE TRUE ORDER BY started_at DESC, instance_id DESC LIMIT $1`
)

// rdRawQuery runs the baseline query (sqlite or pg text) with arg and reads
// every row and column, without HTTP.
func (s *rdServer) rdRawQuery(ctx context.Context, sqliteSQL, pgSQL string, arg any) error {
	var (
		id, kind, host  string
		pid             int64
		interval        float64
		taskID          sql.Null[int64]
		taskType        sql.Null[string]
		startedS, beatS string
		exitedS         sql.Null[string]
		startedT, beatT time.Time
		exitedT         *time.Time
		n               int
	)
	switch s.backend {
	case rdSQLite:
		rows, err := s.sqlite.QueryContext(ctx, sqliteSQL, arg)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := rows.Scan(&id, &kind, &host, &pid, &interval, &startedS, &beatS, &exitedS, &taskID, &taskType); err != nil {
				return err
			}
			n++
		}
		if err := rows.Err(); err != nil {
			return err
		}
	case rdPostgres:
		// Unprepared, as pgstore runs its process reads (processReadMode).
		rows, err := s.pg.Query(ctx, pgSQL, pgx.QueryExecModeExec, arg)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := rows.Scan(&id, &kind, &host, &pid, &interval, &startedT, &beatT, &exitedT, &taskID, &taskType); err != nil {
				return err
			}
			n++
		}
		if err := rows.Err(); err != nil {
			return err
		}
	}
	if n == 0 {
		return errors.New("baseline query returned no row")
	}
	return nil
}

// rdLatency is the latency distribution of one series of calls.
type rdLatency struct {
	p50, p99 time.Duration
	n        int
}

// rdInterleave measures several series at once: after warm uncounted
// calls of each, it runs n calls of each series in blocks of block calls,
// taking the series in turn, so that every series sees the same spells of
// load on a shared machine and their ratios stay meaningful.
func rdInterleave(ctx context.Context, warm, n, block int, fns ...func(ctx context.Context) error) ([]rdLatency, error) {
	for _, fn := range fns {
		for range warm {
			if err := fn(ctx); err != nil {
				return nil, err
			}
		}
	}
	d := make([][]time.Duration, len(fns))
	for len(d[0]) < n {
		for i, fn := range fns {
			for range min(block, n-len(d[i])) {
				start := time.Now()
				if err := fn(ctx); err != nil {
					return nil, err
				}
				d[i] = append(d[i], time.Since(start))
			}
		}
	}
	out := make([]rdLatency, len(fns))
	for i := range d {
		slices.Sort(d[i])
		out[i] = rdLatency{p50: d[i][n/2], p99: d[i][min(n-1, n*99/100)], n: n}
	}
	return out, nil
}

// rdMicros formats d in microseconds (or milliseconds past 10 ms).
func rdMicros(d time.Duration) string {
	if d >= 10*time.Millisecond {
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%d µs", d.Microseconds())
}

// rdSizes returns the small and the large history size and the number of
// measured calls.
func rdSizes(env Env) (small, large, calls int) {
	if env.Smoke {
		return 1_000, 5_000, 200
	}
	return 10_000, 1_000_000, 5_000
}

func runStatus(ctx context.Context, env Env, backend rdBackend) ([]Row, error) {
	small, large, calls := rdSizes(env)
	// Two servers, one per history size, measured in turns with the
	// baseline so that load on the machine hits all three alike.
	sSmall, err := rdStart(ctx, env, backend, "status-small", 0)
	if err != nil {
		return nil, err
	}
	defer sSmall.stop()
	sLarge, err := rdStart(ctx, env, backend, "status-large", 0)
	if err != nil {
		return nil, err
	}
	defer sLarge.stop()
	base := time.Now()
	if err := sSmall.rdFill(ctx, env, base, 0, small); err != nil {
		return nil, err
	}
	if err := sLarge.rdFill(ctx, env, base, 0, large); err != nil {
		return nil, err
	}
	path := "/v1/process-status/" + rdStatusKind
	got, err := rdInterleave(ctx, calls/10, calls, 100,
		func(ctx context.Context) error { return sSmall.rdGet(ctx, path) },
		func(ctx context.Context) error { return sLarge.rdGet(ctx, path) },
		func(ctx context.Context) error {
			return sLarge.rdRawQuery(ctx, rdStatusSQLite, rdStatusPG, rdStatusKind)
		})
	if err != nil {
		return nil, fmt.Errorf("process_status: %w", err)
	}
	atSmall, atLarge, raw := got[0], got[1], got[2]
	env.Logf("  process_status at %d rows: p50 %s p99 %s; at %d rows: p50 %s p99 %s; raw SQL p50 %s p99 %s",
		small, rdMicros(atSmall.p50), rdMicros(atSmall.p99), large,
		rdMicros(atLarge.p50), rdMicros(atLarge.p99), rdMicros(raw.p50), rdMicros(raw.p99))

	growth := float64(atLarge.p50) / float64(atSmall.p50)
	ratio := float64(atLarge.p50) / float64(raw.p50)
	row := Row{
		Path: fmt.Sprintf("process_status over HTTP at %s history rows, %s", rdCount(large), backend),
		Figure: fmt.Sprintf("p50 %s, p99 %s (at %s rows: p50 %s, p99 %s; growth %.2f×)",
			rdMicros(atLarge.p50), rdMicros(atLarge.p99), rdCount(small), rdMicros(atSmall.p50), rdMicros(atSmall.p99), growth),
		Baseline: fmt.Sprintf("same SQL, same driver, no HTTP: p50 %s, p99 %s", rdMicros(raw.p50), rdMicros(raw.p99)),
		Ratio:    ratio,
		Target:   "p50 ≤ 300 µs, p99 ≤ 1 ms; 10k → 1M rows ≤ 1.3×; ≤ 3× baseline at p50",
		Met: atLarge.p50 <= 300*time.Microsecond && atLarge.p99 <= time.Millisecond &&
			growth <= 1.3 && ratio <= 3,
	}
	if !row.Met {
		row.Note = rdStatusNote(atLarge, growth, ratio)
	}
	return []Row{row}, nil
}

// rdStatusNote says which part of the process_status target missed.
func rdStatusNote(l rdLatency, growth, ratio float64) string {
	var parts []string
	if l.p50 > 300*time.Microsecond {
		parts = append(parts, "p50 above 300 µs")
	}
	if l.p99 > time.Millisecond {
		parts = append(parts, "p99 above 1 ms")
	}
	if growth > 1.3 {
		parts = append(parts, fmt.Sprintf("10k → 1M growth %.2f×", growth))
	}
	if ratio > 3 {
		parts = append(parts, fmt.Sprintf("%.2f× the baseline", ratio))
	}
	return "missed: " + strings.Join(parts, ", ") + " (see docs/performance/reads.md)"
}

func runList(ctx context.Context, env Env, backend rdBackend) ([]Row, error) {
	_, large, calls := rdSizes(env)
	s, err := rdStart(ctx, env, backend, "list", 0)
	if err != nil {
		return nil, err
	}
	defer s.stop()
	base := time.Now()
	if err := s.rdFill(ctx, env, base, 0, large); err != nil {
		return nil, err
	}
	// A page deep in the history (after row large/2), through the cursor
	// the previous page would have returned: keyset pagination makes it
	// cost what the first page costs.
	depth := large / 2
	deepPath := "/v1/processes?cursor=" + rdCursor(base.Add(-time.Duration(depth)*2*time.Second), rdInstanceID(depth))
	got, err := rdInterleave(ctx, calls/10, calls, 100,
		func(ctx context.Context) error { return s.rdGet(ctx, "/v1/processes") },
		func(ctx context.Context) error { return s.rdGet(ctx, deepPath) },
		func(ctx context.Context) error { return s.rdRawQuery(ctx, rdListSQLite, rdListPG, rdPageLimit+1) })
	if err != nil {
		return nil, fmt.Errorf("list_processes: %w", err)
	}
	viaHTTP, deep, raw := got[0], got[1], got[2]
	env.Logf("  list_processes at %d rows: p50 %s p99 %s; deep page p50 %s p99 %s; raw SQL p50 %s p99 %s", large,
		rdMicros(viaHTTP.p50), rdMicros(viaHTTP.p99), rdMicros(deep.p50), rdMicros(deep.p99), rdMicros(raw.p50), rdMicros(raw.p99))
	ratio := float64(viaHTTP.p99) / float64(raw.p99)
	row := Row{
		Path: fmt.Sprintf("list_processes first page (%d) over HTTP at %s history rows, %s", rdPageLimit, rdCount(large), backend),
		Figure: fmt.Sprintf("p99 %s (p50 %s); a page after row %s by cursor: p50 %s, p99 %s",
			rdMicros(viaHTTP.p99), rdMicros(viaHTTP.p50), rdCount(depth), rdMicros(deep.p50), rdMicros(deep.p99)),
		Baseline: fmt.Sprintf("same SQL, same driver, no HTTP: p99 %s (p50 %s)", rdMicros(raw.p99), rdMicros(raw.p50)),
		Ratio:    ratio,
		Target:   "p99 ≤ 3 ms; ≤ 3× baseline at p99; no plan scans the history (EXPLAIN test)",
		Met:      viaHTTP.p99 <= 3*time.Millisecond && ratio <= 3,
	}
	if !row.Met {
		var parts []string
		if viaHTTP.p99 > 3*time.Millisecond {
			parts = append(parts, "p99 above 3 ms")
		}
		if ratio > 3 {
			parts = append(parts, fmt.Sprintf("%.2f× the baseline", ratio))
		}
		row.Note = "missed: " + strings.Join(parts, ", ") + " (see docs/performance/reads.md)"
	}
	return []Row{row}, nil
}

// rdInstancePrefix starts the instance id of fixture row i, which ends
// with i in 12 digits.
const rdInstancePrefix = "00000000-0000-4000-8000-"

// rdInstanceID is the instance id of fixture row i.
func rdInstanceID(i int) string { return fmt.Sprintf("%s%012d", rdInstancePrefix, i) }

// rdCursor is list_processes' cursor after the instance (startedAt, id):
// the API's opaque format (liveness.encodeCursor), rebuilt here to jump
// deep into the history without paging there.
func rdCursor(startedAt time.Time, id string) string {
	raw := startedAt.UTC().Truncate(time.Millisecond).Format("2006-01-02T15:04:05.000Z") + "|" + id
	return base64.RawURLEncoding.EncodeToString([]byte(raw))
}

// rdCount formats a row count: 10k, 1M.
func rdCount(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1_000 && n%1_000 == 0:
		return fmt.Sprintf("%dk", n/1_000)
	}
	return fmt.Sprint(n)
}
