package pgstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// heartbeatBatchSQL writes every heartbeat of a batch in one statement: the
// batch arrives as three arrays (instance ids, token hashes, nows), and each
// row is guarded as ProcessHeartbeat guards it (instance, token hash, not
// exited). Rows it does not return were refused.
var heartbeatBatchSQL = `
	UPDATE processes
	SET last_heartbeat_at = b.b_now, alive_until = ` + sqlAddMS("b.b_now",
	"trunc(liveness_interval_s * "+strconv.Itoa(vigiltype.AliveWindowFactor)+" * 1000)::bigint") + `
	FROM unnest(@ids::text[], @hashes::text[], @nows::timestamptz[]) AS b(b_id, b_hash, b_now)
	WHERE instance_id = b.b_id AND token_hash = b.b_hash AND exited_at IS NULL
	RETURNING ` + processColumns + `, token_hash`

// ProcessHeartbeatBatch implements store.Store: one UPDATE over the whole
// batch (its own transaction), then, only when some row was refused, one
// read that says why.
func (s *Store) ProcessHeartbeatBatch(ctx context.Context, items []store.ProcessHeartbeatParams) ([]store.ProcessHeartbeatResult, error) {
	if len(items) == 0 {
		return nil, nil
	}
	writes := store.CoalesceHeartbeats(items)
	ids := make([]string, len(writes))
	hashes := make([]string, len(writes))
	nows := make([]time.Time, len(writes))
	for i, w := range writes {
		ids[i], hashes[i], nows[i] = w.InstanceID, w.TokenHash, utcMS(w.Now)
	}
	written := make([]store.ProcessHeartbeatResult, len(writes))
	err := func() error {
		// One statement, so one implicit transaction: no BEGIN and COMMIT
		// round trips. Explaining refusals afterwards reads committed rows,
		// as ProcessHeartbeat's READ COMMITTED read after its UPDATE does.
		rows, err := s.pool.Query(ctx, heartbeatBatchSQL, pgx.StrictNamedArgs{"ids": ids, "hashes": hashes, "nows": nows})
		if err != nil {
			return err
		}
		type key struct{ id, hash string }
		returned := make(map[key]*vigiltype.Process, len(writes))
		for rows.Next() {
			var hash string
			p, err := scanProcess(withTokenHash{row: rows, hash: &hash}, time.Time{}) // status set below
			if err != nil {
				rows.Close()
				return err
			}
			returned[key{p.InstanceID, hash}] = p
		}
		if err := rows.Err(); err != nil {
			return err
		}
		var refused []int
		for i, w := range writes {
			if p, ok := returned[key{w.InstanceID, w.TokenHash}]; ok {
				p.SetStoredDeadline(p.AliveUntil(), nows[i]) // a heartbeat just set alive_until to its window
				written[i].Process = p
				continue
			}
			refused = append(refused, i)
		}
		if len(refused) == 0 {
			return nil
		}
		return heartbeatRefusals(ctx, s.pool, writes, refused, written)
	}()
	if err != nil {
		return nil, fmt.Errorf("heartbeat %d processes: %w", len(writes), interpretError(err))
	}
	return store.HeartbeatResults(len(items), writes, written), nil
}

// heartbeatRefusals explains each refused write of a batch as
// processRefusal does (ErrNotFound, then ErrInvalidToken, then
// ErrInstanceExited), with one read for all of them.
func heartbeatRefusals(ctx context.Context, q hbQuerier, writes []store.HeartbeatWrite, refused []int, written []store.ProcessHeartbeatResult) error {
	ids := make([]string, len(refused))
	for j, i := range refused {
		ids[j] = writes[i].InstanceID
	}
	rows, err := q.Query(ctx, `SELECT instance_id, token_hash, exited_at FROM processes WHERE instance_id = ANY(@ids::text[])`,
		pgx.StrictNamedArgs{"ids": ids})
	if err != nil {
		return err
	}
	type stored struct {
		hash   string
		exited bool
	}
	found := make(map[string]stored, len(ids))
	var (
		id, hash string
		exitedAt *time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &hash, &exitedAt}, func() error {
		found[id] = stored{hash: hash, exited: exitedAt != nil}
		return nil
	})
	if err != nil {
		return err
	}
	for _, i := range refused {
		w := writes[i]
		var why error
		st, ok := found[w.InstanceID]
		switch {
		case !ok:
			why = vigiltype.ErrNotFound
		case st.hash != w.TokenHash:
			why = vigiltype.ErrInvalidToken
		case st.exited:
			why = vigiltype.ErrInstanceExited
		default:
			return fmt.Errorf("process %s: write matched no row for no known reason", w.InstanceID)
		}
		written[i].Err = fmt.Errorf("heartbeat process %s: %w", w.InstanceID, why)
	}
	return nil
}

// withTokenHash scans a row of processColumns followed by token_hash.
type withTokenHash struct {
	row  rowScanner
	hash *string
}

func (w withTokenHash) Scan(dest ...any) error { return w.row.Scan(append(dest, w.hash)...) }

// hbQuerier is a pool, a connection or a transaction.
type hbQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}
