package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "modernc.org/sqlite" // the baseline's driver, the one sqlitestore uses

	"github.com/vigil-fleet/vigil/internal/daemon"
	"github.com/vigil-fleet/vigil/internal/liveness"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// Heartbeat ingest (issue #6, rows 1 and 2): liveness heartbeats over HTTP
// through the real handler and server, each answered only after the commit
// that holds it, against a baseline of one UPDATE per transaction through
// the same driver at the same concurrency, without HTTP.
func init() {
	register(Case{Name: "heartbeat-sqlite", Run: func(ctx context.Context, env Env) ([]Row, error) {
		return runHeartbeatIngest(ctx, env, hbSQLite)
	}})
	register(Case{Name: "heartbeat-postgres", NeedsPostgres: true, Run: func(ctx context.Context, env Env) ([]Row, error) {
		return runHeartbeatIngest(ctx, env, hbPostgres)
	}})
}

// hbBackend names the store a heartbeat case runs on.
type hbBackend string

const (
	hbSQLite   hbBackend = "sqlite"
	hbPostgres hbBackend = "postgres"
)

// Sizes of the heartbeat ingest cases.
const (
	hbClients       = 64   // concurrent HTTP clients, and baseline goroutines
	hbInstances     = 1000 // registered instances the heartbeats go round
	hbPGBaseConns   = 16   // the PostgreSQL baseline's pool (max_connections is shared)
	hbWarm          = time.Second
	hbDuration      = 10 * time.Second
	hbSmokeClients  = 8
	hbSmokeInstance = 50
	hbSmokeDuration = 400 * time.Millisecond
)

// hbInstance is one registered instance and its token.
type hbInstance struct{ ID, Token string }

// hbSizes returns clients, instances, warm-up and measured duration.
func hbSizes(env Env) (clients, instances int, warm, dur time.Duration) {
	if env.Smoke {
		return hbSmokeClients, hbSmokeInstance, 0, hbSmokeDuration
	}
	return hbClients, hbInstances, hbWarm, hbDuration
}

// hbDiscardLogger is the bench servers' logger: their logs are not the point.
func hbDiscardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// hbStartDaemon starts a real vigil server (the daemon's wiring: store,
// services, HTTP server on a loopback port) on db; opts adjust its config.
func hbStartDaemon(ctx context.Context, db string, opts ...func(*daemon.Config)) (*daemon.Daemon, error) {
	cfg := daemon.Config{DB: db, Addr: "127.0.0.1:0", Logger: hbDiscardLogger()}
	for _, o := range opts {
		o(&cfg)
	}
	d, err := daemon.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	d.Start(ctx)
	return d, nil
}

// hbRegister registers n instances through the liveness service.
func hbRegister(ctx context.Context, lv *liveness.Service, n int) ([]hbInstance, error) {
	out := make([]hbInstance, n)
	for i := range out {
		r, err := lv.Register(ctx, liveness.RegisterParams{
			ProcessKind: fmt.Sprintf("bench-%d", i%10), Hostname: "bench-host", PID: 1000 + i, LivenessIntervalS: 30,
		})
		if err != nil {
			return nil, err
		}
		out[i] = hbInstance{ID: r.InstanceID, Token: r.InstanceToken}
	}
	return out, nil
}

func runHeartbeatIngest(ctx context.Context, env Env, backend hbBackend) (rows []Row, err error) {
	clients, n, warm, dur := hbSizes(env)
	var db string
	switch backend {
	case hbSQLite:
		db = filepath.Join(env.Dir, fmt.Sprintf("heartbeat-%d.db", time.Now().UnixNano()))
	case hbPostgres:
		schema, err := newPGSchema(ctx, env.PostgresURL)
		if err != nil {
			return nil, err
		}
		defer func() { err = errors.Join(err, schema.Drop()) }()
		if db, err = schema.URL(nil); err != nil {
			return nil, err
		}
	}

	// The same server without group commit first (each heartbeat its own
	// transaction: the "before" of the technique), then as it ships.
	var insts []hbInstance
	measure := func(what string, opts ...func(*daemon.Config)) (st hbStats, err error) {
		d, err := hbStartDaemon(ctx, db, opts...)
		if err != nil {
			return st, err
		}
		defer func() { err = errors.Join(err, d.Stop()) }()
		if insts == nil {
			if insts, err = hbRegister(ctx, d.Liveness, n); err != nil {
				return st, err
			}
			env.Logf("  %s: %d instances registered; %d clients over HTTP for %s", backend, n, clients, dur)
		}
		client := hbHTTPClient(clients)
		defer client.CloseIdleConnections()
		url := d.URL()
		st = hbClosedLoop(ctx, clients, warm, dur, func(ctx context.Context, seq int64) error {
			in := insts[seq%int64(n)]
			return hbPost(ctx, client, url, in.ID, in.Token)
		})
		if st.N == 0 || st.Errors > 0 {
			return st, fmt.Errorf("vigil heartbeats (%s): %d ok, %d errors, first: %v", what, st.N, st.Errors, st.FirstErr)
		}
		env.Logf("  vigil, %s: %s", what, st.Summary())
		return st, nil
	}
	before, err := measure("no group commit", func(c *daemon.Config) { c.NoGroupCommit = true })
	if err != nil {
		return nil, err
	}
	vigil, err := measure("group commit")
	if err != nil {
		return nil, err
	}

	var base hbStats
	switch backend {
	case hbSQLite:
		base, err = hbBaselineSQLite(ctx, db, insts, clients, warm, dur)
	case hbPostgres:
		base, err = hbBaselinePostgres(ctx, db, insts, clients, warm, dur)
	}
	if err != nil {
		return nil, err
	}
	env.Logf("  baseline: %s", base.Summary())
	return []Row{hbRow(env, backend, clients, n, vigil, before, base)}, nil
}

// hbRow turns the two measurements into the table row with its target.
func hbRow(env Env, backend hbBackend, clients, n int, vigil, before, base hbStats) Row {
	ratio := 0.0
	if base.Rate() > 0 {
		ratio = vigil.Rate() / base.Rate()
	}
	r := Row{Figure: vigil.Summary(), Baseline: base.Summary(), Ratio: ratio}
	setup := fmt.Sprintf("%d clients, %d instances", clients, n)
	switch backend {
	case hbSQLite:
		r.Path = "heartbeat ingest over HTTP, acknowledged after a durable commit, SQLite (WAL, synchronous=NORMAL)"
		r.Target = "≥ 30,000/s; ≥ 0.85× one UPDATE per transaction"
		r.Met = vigil.Rate() >= 30000 && ratio >= 0.85
		r.Note = setup + "; baseline: one UPDATE per transaction on the one writer connection, no HTTP"
	case hbPostgres:
		r.Path = "heartbeat ingest over HTTP, acknowledged after a durable commit, PostgreSQL"
		r.Target = "≥ 20,000/s, p99 ≤ 25 ms; ≥ 2.5× one UPDATE per transaction"
		r.Met = vigil.Rate() >= 20000 && vigil.Quantile(0.99) <= 25*time.Millisecond && ratio >= 2.5
		r.Note = setup + fmt.Sprintf("; baseline: one UPDATE per transaction (autocommit) from a pool of %d connections, no HTTP", hbPGBaseConns)
	}
	r.Note += fmt.Sprintf("; before group commit (each heartbeat its own transaction, same run): %s", before.Summary())
	if env.Smoke {
		r.Note = "smoke; " + r.Note
	}
	return r
}

// hbUpdateSQL is the baseline's statement: what a heartbeat writes, guarded
// like the store's (instance, token, not exited). Placeholders: now,
// alive_until, instance_id, token_hash.
const hbUpdateSQL = `UPDATE processes SET last_heartbeat_at = $1, alive_until = $2
	WHERE instance_id = $3 AND token_hash = $4 AND exited_at IS NULL`

// hbSQLiteTime is sqlitestore's stored time layout.
const hbSQLiteTime = "2006-01-02T15:04:05.000Z"

// hbBaselineSQLite: one UPDATE per transaction (autocommit) on one writer
// connection of the same driver, WAL and synchronous=NORMAL as vigil opens
// it, from the same number of goroutines.
func hbBaselineSQLite(ctx context.Context, path string, insts []hbInstance, clients int, warm, dur time.Duration) (hbStats, error) {
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)")
	if err != nil {
		return hbStats{}, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	window := vigiltype.AliveWindow(30)
	st := hbClosedLoop(ctx, clients, warm, dur, func(ctx context.Context, seq int64) error {
		in := insts[seq%int64(len(insts))]
		now := time.Now().UTC()
		res, err := db.ExecContext(ctx, hbUpdateSQL, now.Format(hbSQLiteTime), now.Add(window).Format(hbSQLiteTime),
			in.ID, liveness.HashToken(in.Token))
		return hbOneRow(res, err)
	})
	if st.N == 0 || st.Errors > 0 {
		return st, fmt.Errorf("sqlite baseline: %d ok, %d errors, first: %v", st.N, st.Errors, st.FirstErr)
	}
	return st, nil
}

// hbBaselinePostgres: one UPDATE per transaction (autocommit) through pgx
// from the same number of goroutines.
func hbBaselinePostgres(ctx context.Context, url string, insts []hbInstance, clients int, warm, dur time.Duration) (hbStats, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return hbStats{}, errors.New("baseline: invalid PostgreSQL URL")
	}
	cfg.MaxConns = hbPGBaseConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return hbStats{}, err
	}
	defer pool.Close()
	window := vigiltype.AliveWindow(30)
	st := hbClosedLoop(ctx, clients, warm, dur, func(ctx context.Context, seq int64) error {
		in := insts[seq%int64(len(insts))]
		now := time.Now().UTC().Truncate(time.Millisecond)
		tag, err := pool.Exec(ctx, hbUpdateSQL, now, now.Add(window), in.ID, liveness.HashToken(in.Token))
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("baseline update of %s: %d rows", in.ID, tag.RowsAffected())
		}
		return nil
	})
	if st.N == 0 || st.Errors > 0 {
		return st, fmt.Errorf("postgres baseline: %d ok, %d errors, first: %v", st.N, st.Errors, st.FirstErr)
	}
	return st, nil
}

// hbOneRow wants exactly one row changed.
func hbOneRow(res sql.Result, err error) error {
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("baseline update: %d rows", n)
	}
	return nil
}
