package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"sync"
)

// preparedMax bounds how many statements one pool keeps prepared. The
// cached statements are the hot paths' (claim, lease writes, token checks),
// whose SQL text takes a handful of forms; past the bound a statement is
// simply run unprepared.
const preparedMax = 256

// prepared keeps statements prepared once per SQL text on one pool, so a
// hot path stops paying SQLite's parse and plan on every call: on the claim
// and complete path that was about a quarter of the server's CPU (issue #6).
// database/sql re-prepares a statement on each connection that runs it,
// once, so one *sql.Stmt serves a whole pool.
type prepared struct {
	db *sql.DB
	mu sync.Mutex
	m  map[string]*sql.Stmt
}

func newPrepared(db *sql.DB) *prepared {
	return &prepared{db: db, m: make(map[string]*sql.Stmt)}
}

// stmt returns the statement for query, preparing it on first use; nil
// (run it unprepared) when the cache is full or preparing failed, in which
// case running it reports the error. Call it outside a transaction on the
// same pool: preparing needs a free connection, and the writer has one.
func (p *prepared) stmt(ctx context.Context, query string) *sql.Stmt {
	p.mu.Lock()
	st, ok := p.m[query]
	full := len(p.m) >= preparedMax
	p.mu.Unlock()
	if ok {
		return st
	}
	if full {
		return nil
	}
	// Prepared without the lock: it may wait for the writer, and callers
	// whose statements are cached must not wait with it.
	st, err := p.db.PrepareContext(ctx, query)
	if err != nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if prev, ok := p.m[query]; ok { // prepared meanwhile by another caller
		_ = st.Close()
		return prev
	}
	if p.m == nil { // closed meanwhile
		_ = st.Close()
		return nil
	}
	p.m[query] = st
	return st
}

// close closes every prepared statement.
func (p *prepared) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, st := range p.m {
		errs = append(errs, st.Close())
	}
	p.m = nil
	return errors.Join(errs...)
}

// txStmts are the writer's prepared statements a transaction will run,
// looked up before it begins (preparing inside it would wait for the one
// writer connection the transaction holds).
type txStmts map[string]*sql.Stmt

// writerStmts prepares queries on the writer, before a transaction.
func (s *Store) writerStmts(ctx context.Context, queries ...string) txStmts {
	out := make(txStmts, len(queries))
	for _, q := range queries {
		if st := s.wprep.stmt(ctx, q); st != nil {
			out[q] = st
		}
	}
	return out
}

// queryRow runs query in tx, through its prepared statement when there is one.
func (ts txStmts) queryRow(ctx context.Context, tx *sql.Tx, query string, args ...any) *sql.Row {
	if st, ok := ts[query]; ok {
		return tx.StmtContext(ctx, st).QueryRowContext(ctx, args...)
	}
	return tx.QueryRowContext(ctx, query, args...)
}

// exec runs query in tx, through its prepared statement when there is one.
func (ts txStmts) exec(ctx context.Context, tx *sql.Tx, query string, args ...any) (sql.Result, error) {
	if st, ok := ts[query]; ok {
		return tx.StmtContext(ctx, st).ExecContext(ctx, args...)
	}
	return tx.ExecContext(ctx, query, args...)
}

// readRow runs query on the reader pool through its prepared statement.
func (s *Store) readRow(ctx context.Context, query string, args ...any) *sql.Row {
	if st := s.rprep.stmt(ctx, query); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return s.reader.QueryRowContext(ctx, query, args...)
}
