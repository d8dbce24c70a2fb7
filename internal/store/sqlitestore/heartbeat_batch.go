package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// heartbeatBatchSQL writes every heartbeat of a batch in one statement,
// prepared once on the writer (the driver parses every statement it runs
// unprepared, and this one's parse costs more than its run). The batch arrives as
// one JSON array of [instance_id, token_hash, now] triples, and each row is
// guarded as ProcessHeartbeat guards it (instance, token hash, not exited).
// Rows it does not return were refused.
var heartbeatBatchSQL = `
	UPDATE processes
	SET last_heartbeat_at = b.b_now, alive_until = ` + sqlAddMS("b.b_now",
	"CAST(liveness_interval_s * "+strconv.Itoa(vigiltype.AliveWindowFactor)+" * 1000 AS INTEGER)") + `
	FROM (SELECT value ->> 0 AS b_id, value ->> 1 AS b_hash, value ->> 2 AS b_now FROM json_each(@batch)) AS b
	WHERE instance_id = b.b_id AND token_hash = b.b_hash AND exited_at IS NULL
	RETURNING ` + processColumns + `, token_hash`

// ProcessHeartbeatBatch implements store.Store: one IMMEDIATE transaction on
// the writer connection holding one UPDATE for the whole batch and, only
// for refused rows, the read that says why.
func (s *Store) ProcessHeartbeatBatch(ctx context.Context, items []store.ProcessHeartbeatParams) ([]store.ProcessHeartbeatResult, error) {
	if len(items) == 0 {
		return nil, nil
	}
	writes := store.CoalesceHeartbeats(items)
	batch := make([][3]string, len(writes))
	for i, w := range writes {
		batch[i] = [3]string{w.InstanceID, w.TokenHash, timeString(w.Now)}
	}
	arg, err := json.Marshal(batch)
	if err != nil {
		return nil, fmt.Errorf("heartbeat %d processes: %w", len(writes), err)
	}
	written := make([]store.ProcessHeartbeatResult, len(writes))
	stmts := s.writerStmts(ctx, heartbeatBatchSQL) // parsed once per store, not per batch
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		var rows *sql.Rows
		if st, ok := stmts[heartbeatBatchSQL]; ok {
			rows, err = tx.StmtContext(ctx, st).QueryContext(ctx, sql.Named("batch", string(arg)))
		} else {
			rows, err = tx.QueryContext(ctx, heartbeatBatchSQL, sql.Named("batch", string(arg)))
		}
		if err != nil {
			return err
		}
		type key struct{ id, hash string }
		returned := make(map[key]*vigiltype.Process, len(writes))
		for rows.Next() {
			var hash string
			p, err := scanProcess(withTokenHash{row: rows, hash: &hash}, utcMS(writes[0].Now)) // status set below
			if err != nil {
				rows.Close()
				return err
			}
			returned[key{p.InstanceID, hash}] = p
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return err
		}
		for i, w := range writes {
			if p, ok := returned[key{w.InstanceID, w.TokenHash}]; ok {
				p.SetStoredDeadline(p.AliveUntil(), utcMS(w.Now)) // a heartbeat just set alive_until to its window
				written[i].Process = p
				continue
			}
			why := processRefusal(ctx, tx, w.InstanceID, w.TokenHash)
			if !isRefusal(why) {
				return fmt.Errorf("heartbeat process %s: %w", w.InstanceID, why)
			}
			written[i].Err = fmt.Errorf("heartbeat process %s: %w", w.InstanceID, why)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("heartbeat %d processes: %w", len(writes), err)
	}
	return store.HeartbeatResults(len(items), writes, written), nil
}

// withTokenHash scans a row of processColumns followed by token_hash.
type withTokenHash struct {
	row  rowScanner
	hash *string
}

func (w withTokenHash) Scan(dest ...any) error { return w.row.Scan(append(dest, w.hash)...) }

// isRefusal reports whether err is one of the answers processRefusal gives
// for a guarded write that matched no row.
func isRefusal(err error) bool {
	return errors.Is(err, vigiltype.ErrNotFound) || errors.Is(err, vigiltype.ErrInvalidToken) ||
		errors.Is(err, vigiltype.ErrInstanceExited)
}
