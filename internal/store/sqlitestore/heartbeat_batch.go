package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// heartbeatSQL is ProcessHeartbeat's write, guarded by instance, token hash
// and "not exited".
var heartbeatSQL = `
	UPDATE processes
	SET last_heartbeat_at = @now, alive_until = ` + aliveUntilSQL + `
	WHERE instance_id = @instance_id AND token_hash = @token_hash AND exited_at IS NULL
	RETURNING ` + processColumns

// ProcessHeartbeatBatch implements store.Store: one IMMEDIATE transaction on
// the writer connection, one prepared UPDATE per instance.
func (s *Store) ProcessHeartbeatBatch(ctx context.Context, items []store.ProcessHeartbeatParams) ([]store.ProcessHeartbeatResult, error) {
	if len(items) == 0 {
		return nil, nil
	}
	writes := store.CoalesceHeartbeats(items)
	written := make([]store.ProcessHeartbeatResult, len(writes))
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		stmt, err := tx.PrepareContext(ctx, heartbeatSQL)
		if err != nil {
			return err
		}
		defer stmt.Close()
		for i, w := range writes {
			now := utcMS(w.Now)
			proc, err := scanProcess(stmt.QueryRowContext(ctx,
				sql.Named("now", timeString(now)),
				sql.Named("instance_id", w.InstanceID),
				sql.Named("token_hash", w.TokenHash),
			), now)
			if errors.Is(err, sql.ErrNoRows) {
				err = processRefusal(ctx, tx, w.InstanceID, w.TokenHash)
				if !isRefusal(err) {
					return fmt.Errorf("heartbeat process %s: %w", w.InstanceID, err)
				}
				written[i].Err = fmt.Errorf("heartbeat process %s: %w", w.InstanceID, err)
				continue
			}
			if err != nil {
				return fmt.Errorf("heartbeat process %s: %w", w.InstanceID, err)
			}
			written[i].Process = proc
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("heartbeat %d processes: %w", len(writes), err)
	}
	return store.HeartbeatResults(len(items), writes, written), nil
}

// isRefusal reports whether err is one of the answers processRefusal gives
// for a guarded write that matched no row.
func isRefusal(err error) bool {
	return errors.Is(err, vigiltype.ErrNotFound) || errors.Is(err, vigiltype.ErrInvalidToken) ||
		errors.Is(err, vigiltype.ErrInstanceExited)
}
