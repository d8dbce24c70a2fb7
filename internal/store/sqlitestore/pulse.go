package sqlitestore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// leaseWindowMSSQL is a running lease's window in whole milliseconds: the
// time its last renewal (or the claim) granted it.
const leaseWindowMSSQL = `CAST(ROUND((julianday(lease_expires_at) - julianday(COALESCE(last_heartbeat_at, started_at))) * 86400000) AS INTEGER)`

// StorePulse implements store.Store.
func (s *Store) StorePulse(ctx context.Context, p store.StorePulseParams) (*store.StorePulseResult, error) {
	var res *store.StorePulseResult
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		res, err = pulseTx(ctx, tx, p)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store pulse: %w", err)
	}
	return res, nil
}

// pulseTx is StorePulse's step inside tx (also run first by a reclaim pass).
func pulseTx(ctx context.Context, tx *sql.Tx, p store.StorePulseParams) (*store.StorePulseResult, error) {
	now := utcMS(p.Now)
	nowS := timeString(now)
	tol := cmp.Or(p.FutureTolerance, vigiltype.FutureTolerance)
	res := &store.StorePulseResult{}
	checkFuture := p.CheckFuture

	var prevS string
	err := tx.QueryRowContext(ctx, `SELECT pulsed_at FROM store_pulse WHERE id = 1`).Scan(&prevS)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if _, err := tx.ExecContext(ctx, `INSERT INTO store_pulse (id, pulsed_at) VALUES (1, ?)`, nowS); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, err
	default:
		prev, err := parseTime(prevS)
		if err != nil {
			return nil, fmt.Errorf("pulsed_at: %w", err)
		}
		if prev.After(now.Add(tol)) {
			checkFuture = true // the clock stepped back past the tolerance
		}
		if (p.Gap > 0 && now.Sub(prev) > p.Gap) || (p.Force && now.After(prev)) {
			checkFuture = true
			r, err := tx.ExecContext(ctx, `
				UPDATE processes SET alive_until = `+aliveUntilSQL+`
				WHERE exited_at IS NULL AND alive_until >= @prev AND alive_until < `+aliveUntilSQL,
				sql.Named("now", nowS), sql.Named("prev", prevS))
			if err != nil {
				return nil, err
			}
			res.GraceProcesses, _ = r.RowsAffected()
			r, err = tx.ExecContext(ctx, `
				UPDATE tasks SET lease_expires_at = `+sqlAddMS("@now", leaseWindowMSSQL)+`
				WHERE status = 'running' AND lease_expires_at >= @prev
					AND lease_expires_at < `+sqlAddMS("@now", leaseWindowMSSQL),
				sql.Named("now", nowS), sql.Named("prev", prevS))
			if err != nil {
				return nil, err
			}
			res.GraceLeases, _ = r.RowsAffected()
			res.OutageFrom, res.OutageTo = prev, now
			if _, err := tx.ExecContext(ctx, `
				UPDATE store_pulse SET pulsed_at = @now, outage_from = @prev, outage_to = @now WHERE id = 1`,
				sql.Named("now", nowS), sql.Named("prev", prevS)); err != nil {
				return nil, err
			}
		} else if _, err := tx.ExecContext(ctx, `UPDATE store_pulse SET pulsed_at = ? WHERE id = 1`, nowS); err != nil {
			return nil, err
		}
	}
	if !checkFuture {
		return res, nil
	}
	// DESIGN L9: a row dated ahead of the clock is not heard from after
	// now: it keeps at most one window from now — the alive window for an
	// instance, the lease's own window for a lease — never the time it was
	// dated for. A live holder (a server clock stepped back) heartbeats
	// within it and carries on; a dead one is judged when it ends. The
	// same bound applies to an alive_until a grace dated ahead (a clock
	// that jumped forward, then back).
	future := timeString(now.Add(tol))
	r, err := tx.ExecContext(ctx, `
		UPDATE processes SET alive_until = `+aliveUntilSQL+`
		WHERE exited_at IS NULL AND alive_until > `+aliveUntilSQL+`
			AND (last_heartbeat_at > @future OR alive_until > `+sqlAddMS("@future", "CAST(liveness_interval_s * "+strconv.Itoa(vigiltype.AliveWindowFactor)+" * 1000 AS INTEGER)")+`)`,
		sql.Named("now", nowS), sql.Named("future", future))
	if err != nil {
		return nil, err
	}
	res.FutureProcesses, _ = r.RowsAffected()
	r, err = tx.ExecContext(ctx, `
		UPDATE tasks SET lease_expires_at = `+sqlAddMS("@now", leaseWindowMSSQL)+`
		WHERE status = 'running' AND (last_heartbeat_at > @future OR last_activity_at > @future)
			AND lease_expires_at > `+sqlAddMS("@now", leaseWindowMSSQL),
		sql.Named("now", nowS), sql.Named("future", future))
	if err != nil {
		return nil, err
	}
	res.FutureLeases, _ = r.RowsAffected()
	return res, nil
}
