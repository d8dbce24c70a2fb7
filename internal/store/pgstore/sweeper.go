package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// sweeperColumns are the sweepers columns scanSweeper reads, in order.
const sweeperColumns = `name, interval_s, last_run_at, last_result_count, last_run_duration_ms, last_error`

// scanSweeper converts one sweepers row (sweeperColumns) to a Sweeper. It is
// the only place sweeper rows become vigiltype values. Kind is not stored:
// it is always vigiltype.SweeperKind.
func scanSweeper(row rowScanner) (*vigiltype.Sweeper, error) {
	var sw vigiltype.Sweeper
	if err := row.Scan(&sw.Name, &sw.IntervalS, &sw.LastRunAt, &sw.LastResultCount,
		&sw.LastRunDurationMS, &sw.LastError); err != nil {
		return nil, err
	}
	sw.Kind = vigiltype.SweeperKind
	sw.LastRunAt = utcPtr(sw.LastRunAt)
	return &sw, nil
}

// SweeperRecord implements store.Store. Kind is ignored.
func (s *Store) SweeperRecord(ctx context.Context, sw *vigiltype.Sweeper) error {
	_, err := s.pool.Exec(ctx, `
		INSERT INTO sweepers (`+sweeperColumns+`)
		VALUES (@name, @interval_s, @last_run_at, @last_result_count, @last_run_duration_ms, @last_error)
		ON CONFLICT (name) DO UPDATE SET
			interval_s = excluded.interval_s,
			last_run_at = excluded.last_run_at,
			last_result_count = excluded.last_result_count,
			last_run_duration_ms = excluded.last_run_duration_ms,
			last_error = excluded.last_error`,
		pgx.StrictNamedArgs{
			"name":                 sw.Name,
			"interval_s":           sw.IntervalS,
			"last_run_at":          utcMSPtr(sw.LastRunAt), // NULL until the sweeper has run
			"last_result_count":    sw.LastResultCount,
			"last_run_duration_ms": sw.LastRunDurationMS,
			"last_error":           sw.LastError,
		},
	)
	if err != nil {
		return fmt.Errorf("record sweeper %s: %w", sw.Name, interpretError(err))
	}
	return nil
}

// SweeperList implements store.Store.
func (s *Store) SweeperList(ctx context.Context) ([]*vigiltype.Sweeper, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+sweeperColumns+` FROM sweepers ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list sweepers: %w", interpretError(err))
	}
	sweepers, err := pgx.AppendRows([]*vigiltype.Sweeper(nil), rows, func(row pgx.CollectableRow) (*vigiltype.Sweeper, error) {
		return scanSweeper(row)
	})
	if err != nil {
		return nil, fmt.Errorf("list sweepers: %w", interpretError(err))
	}
	return sweepers, nil
}
