package pgstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// leaseWindowMSSQL is a running lease's window in whole milliseconds: the
// time its last renewal (or the claim) granted it.
const leaseWindowMSSQL = `round(extract(epoch FROM (lease_expires_at - COALESCE(last_heartbeat_at, started_at))) * 1000)::bigint`

// StorePulse implements store.Store.
func (s *Store) StorePulse(ctx context.Context, p store.StorePulseParams) (*store.StorePulseResult, error) {
	var res *store.StorePulseResult
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		res, err = pulseTx(ctx, tx, p)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store pulse: %w", interpretError(err))
	}
	return res, nil
}

// pulseTx is StorePulse's step inside tx (also run first by a reclaim
// pass). The pulse row is taken FOR UPDATE, so of several servers pulsing
// at once one acts on a gap and the others see its pulse.
func pulseTx(ctx context.Context, tx pgx.Tx, p store.StorePulseParams) (*store.StorePulseResult, error) {
	now := utcMS(p.Now)
	tol := cmp.Or(p.FutureTolerance, vigiltype.FutureTolerance)
	res := &store.StorePulseResult{}
	checkFuture := p.CheckFuture

	var prev time.Time
	err := tx.QueryRow(ctx, `SELECT pulsed_at FROM store_pulse WHERE id = 1 FOR UPDATE`).Scan(&prev)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if _, err := tx.Exec(ctx, `INSERT INTO store_pulse (id, pulsed_at) VALUES (1, $1) ON CONFLICT (id) DO NOTHING`, now); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, err
	default:
		prev = prev.UTC()
		if prev.After(now.Add(tol)) {
			checkFuture = true // the clock stepped back past the tolerance
		}
		args := pgx.StrictNamedArgs{"now": now, "prev": prev}
		if (p.Gap > 0 && now.Sub(prev) > p.Gap) || (p.Force && now.After(prev)) {
			checkFuture = true
			tag, err := tx.Exec(ctx, `
				UPDATE processes SET alive_until = `+aliveUntilSQL+`
				WHERE exited_at IS NULL AND alive_until >= @prev AND alive_until < `+aliveUntilSQL, args)
			if err != nil {
				return nil, err
			}
			res.GraceProcesses = tag.RowsAffected()
			tag, err = tx.Exec(ctx, `
				UPDATE tasks SET lease_expires_at = `+sqlAddMS("@now", leaseWindowMSSQL)+`
				WHERE status = 'running' AND lease_expires_at >= @prev
					AND lease_expires_at < `+sqlAddMS("@now", leaseWindowMSSQL), args)
			if err != nil {
				return nil, err
			}
			res.GraceLeases = tag.RowsAffected()
			res.OutageFrom, res.OutageTo = prev, now
			if _, err := tx.Exec(ctx, `
				UPDATE store_pulse SET pulsed_at = @now, outage_from = @prev, outage_to = @now WHERE id = 1`, args); err != nil {
				return nil, err
			}
		} else if _, err := tx.Exec(ctx, `UPDATE store_pulse SET pulsed_at = $1 WHERE id = 1`, now); err != nil {
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
	args := pgx.StrictNamedArgs{"now": now, "future": now.Add(tol)}
	tag, err := tx.Exec(ctx, `
		UPDATE processes SET alive_until = `+aliveUntilSQL+`
		WHERE exited_at IS NULL AND alive_until > `+aliveUntilSQL+`
			AND (last_heartbeat_at > @future OR alive_until > `+sqlAddMS("@future", "trunc(liveness_interval_s * "+strconv.Itoa(vigiltype.AliveWindowFactor)+" * 1000)::bigint")+`)`, args)
	if err != nil {
		return nil, err
	}
	res.FutureProcesses = tag.RowsAffected()
	tag, err = tx.Exec(ctx, `
		UPDATE tasks SET lease_expires_at = `+sqlAddMS("@now", leaseWindowMSSQL)+`
		WHERE status = 'running' AND (last_heartbeat_at > @future OR last_activity_at > @future)
			AND lease_expires_at > `+sqlAddMS("@now", leaseWindowMSSQL), args)
	if err != nil {
		return nil, err
	}
	res.FutureLeases = tag.RowsAffected()
	return res, nil
}
