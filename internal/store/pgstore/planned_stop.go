package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// plannedStopColumns are the planned_stops columns scanPlannedStop reads,
// in order.
const plannedStopColumns = `agent, reason, created_at, expires_at`

// scanPlannedStop converts one planned_stops row (plannedStopColumns) to a
// PlannedStop. It is the only place planned stop rows become vigiltype
// values.
func scanPlannedStop(row rowScanner) (*vigiltype.PlannedStop, error) {
	var ps vigiltype.PlannedStop
	if err := row.Scan(&ps.Agent, &ps.Reason, &ps.CreatedAt, &ps.ExpiresAt); err != nil {
		return nil, err
	}
	ps.CreatedAt = ps.CreatedAt.UTC()
	ps.ExpiresAt = ps.ExpiresAt.UTC()
	return &ps, nil
}

// PlannedStopWrite implements store.Store. expires_at is Now + TTL at the
// store's millisecond precision.
func (s *Store) PlannedStopWrite(ctx context.Context, p store.PlannedStopParams) (*vigiltype.PlannedStop, error) {
	now := utcMS(p.Now)
	ps, err := scanPlannedStop(s.pool.QueryRow(ctx, `
		INSERT INTO planned_stops (`+plannedStopColumns+`)
		VALUES (@agent, @reason, @now, @expires_at)
		ON CONFLICT (agent) DO UPDATE SET
			reason = excluded.reason,
			created_at = excluded.created_at,
			expires_at = excluded.expires_at
		RETURNING `+plannedStopColumns,
		pgx.StrictNamedArgs{
			"agent":      p.Agent,
			"reason":     p.Reason,
			"now":        now,
			"expires_at": utcMS(now.Add(p.TTL)),
		}))
	if err != nil {
		return nil, fmt.Errorf("write planned stop of agent %q: %w", p.Agent, interpretError(err))
	}
	return ps, nil
}

// PlannedStopGet implements store.Store. A marker written after now (by a
// server whose clock runs ahead) does not cover now either.
func (s *Store) PlannedStopGet(ctx context.Context, agent string, now time.Time) (*vigiltype.PlannedStop, error) {
	ps, err := scanPlannedStop(s.pool.QueryRow(ctx, `
		SELECT `+plannedStopColumns+` FROM planned_stops
		WHERE agent = @agent AND created_at <= @now AND @now <= expires_at`,
		pgx.StrictNamedArgs{"agent": agent, "now": utcMS(now)}))
	err = interpretError(err)
	if errors.Is(err, vigiltype.ErrNotFound) {
		return nil, fmt.Errorf("planned stop of agent %q: %w", agent, vigiltype.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get planned stop of agent %q: %w", agent, err)
	}
	return ps, nil
}
