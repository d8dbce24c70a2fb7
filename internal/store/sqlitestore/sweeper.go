package sqlitestore

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// sweeperColumns are the sweepers columns scanSweeper reads, in order.
const sweeperColumns = `name, interval_s, last_run_at, last_result_count, last_run_duration_ms, last_error`

// scanSweeper converts one sweepers row (sweeperColumns) to a Sweeper. It is
// the only place sweeper rows become vigiltype values. Kind is not stored:
// it is always vigiltype.SweeperKind.
func scanSweeper(row rowScanner) (*vigiltype.Sweeper, error) {
	var (
		sw        vigiltype.Sweeper
		lastRunAt sql.Null[string]
		lastError sql.Null[string]
	)
	if err := row.Scan(&sw.Name, &sw.IntervalS, &lastRunAt, &sw.LastResultCount,
		&sw.LastRunDurationMS, &lastError); err != nil {
		return nil, err
	}
	var tp timeParser
	sw.LastRunAt = tp.nullTime(lastRunAt)
	if tp.err != nil {
		return nil, fmt.Errorf("sweeper %s: %w", sw.Name, tp.err)
	}
	sw.Kind = vigiltype.SweeperKind
	sw.LastError = nullPtr(lastError)
	return &sw, nil
}

// SweeperRecord implements store.Store. Kind is ignored.
func (s *Store) SweeperRecord(ctx context.Context, sw *vigiltype.Sweeper) error {
	var lastRunAt any // NULL until the sweeper has run
	if sw.LastRunAt != nil {
		lastRunAt = timeString(*sw.LastRunAt)
	}
	_, err := s.writer.ExecContext(ctx, `
		INSERT INTO sweepers (`+sweeperColumns+`)
		VALUES (@name, @interval_s, @last_run_at, @last_result_count, @last_run_duration_ms, @last_error)
		ON CONFLICT (name) DO UPDATE SET
			interval_s = excluded.interval_s,
			last_run_at = excluded.last_run_at,
			last_result_count = excluded.last_result_count,
			last_run_duration_ms = excluded.last_run_duration_ms,
			last_error = excluded.last_error`,
		sql.Named("name", sw.Name),
		sql.Named("interval_s", sw.IntervalS),
		sql.Named("last_run_at", lastRunAt),
		sql.Named("last_result_count", sw.LastResultCount),
		sql.Named("last_run_duration_ms", sw.LastRunDurationMS),
		sql.Named("last_error", sw.LastError),
	)
	if err != nil {
		return fmt.Errorf("record sweeper %s: %w", sw.Name, err)
	}
	return nil
}

// SweeperList implements store.Store.
func (s *Store) SweeperList(ctx context.Context) ([]*vigiltype.Sweeper, error) {
	rows, err := s.reader.QueryContext(ctx, `SELECT `+sweeperColumns+` FROM sweepers ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list sweepers: %w", err)
	}
	defer rows.Close()
	var sweepers []*vigiltype.Sweeper
	for rows.Next() {
		sw, err := scanSweeper(rows)
		if err != nil {
			return nil, fmt.Errorf("list sweepers: %w", err)
		}
		sweepers = append(sweepers, sw)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list sweepers: %w", err)
	}
	return sweepers, nil
}
