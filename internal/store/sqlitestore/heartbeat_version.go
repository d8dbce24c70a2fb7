package sqlitestore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// heartbeatVersionColumns are the heartbeat_versions columns
// scanHeartbeatVersion reads, in order.
const heartbeatVersionColumns = `hostname, schema_version, last_sent_at, heartbeats`

// scanHeartbeatVersion converts one heartbeat_versions row
// (heartbeatVersionColumns) to a HeartbeatVersion. It is the only place
// heartbeat_versions rows become vigiltype values.
func scanHeartbeatVersion(row rowScanner) (*vigiltype.HeartbeatVersion, error) {
	var (
		hv         vigiltype.HeartbeatVersion
		lastSentAt string
	)
	if err := row.Scan(&hv.Hostname, &hv.SchemaVersion, &lastSentAt, &hv.Heartbeats); err != nil {
		return nil, err
	}
	var tp timeParser
	hv.LastSentAt = tp.time(lastSentAt)
	if tp.err != nil {
		return nil, fmt.Errorf("heartbeat version %s/%d: %w", hv.Hostname, hv.SchemaVersion, tp.err)
	}
	return &hv, nil
}

// countHeartbeat counts one lease heartbeat of schemaVersion sent at now
// (stored text) by instanceID under its hostname, inside the heartbeat's
// transaction: heartbeats + 1, and last_sent_at = now unless the row
// already holds a later time (a server whose clock lags). An instance
// without a processes row (impossible for a lease holder, which is never
// pruned) counts nothing.
func countHeartbeat(ctx context.Context, tx *sql.Tx, instanceID string, schemaVersion int, now string) error {
	_, err := tx.ExecContext(ctx, `
		INSERT INTO heartbeat_versions (`+heartbeatVersionColumns+`)
		SELECT hostname, @schema_version, @now, 1 FROM processes WHERE instance_id = @instance_id
		ON CONFLICT (hostname, schema_version) DO UPDATE SET
			last_sent_at = max(last_sent_at, excluded.last_sent_at),
			heartbeats = heartbeats + 1`,
		sql.Named("schema_version", schemaVersion),
		sql.Named("now", now),
		sql.Named("instance_id", instanceID),
	)
	if err != nil {
		return fmt.Errorf("count heartbeat version %d: %w", schemaVersion, err)
	}
	return nil
}

// HeartbeatVersionList implements store.Store.
func (s *Store) HeartbeatVersionList(ctx context.Context, since time.Time) ([]*vigiltype.HeartbeatVersion, error) {
	rows, err := s.reader.QueryContext(ctx, `
		SELECT `+heartbeatVersionColumns+` FROM heartbeat_versions
		WHERE last_sent_at >= ?
		ORDER BY hostname, schema_version`, timeString(since))
	if err != nil {
		return nil, fmt.Errorf("list heartbeat versions: %w", err)
	}
	defer rows.Close()
	var versions []*vigiltype.HeartbeatVersion
	for rows.Next() {
		hv, err := scanHeartbeatVersion(rows)
		if err != nil {
			return nil, fmt.Errorf("list heartbeat versions: %w", err)
		}
		versions = append(versions, hv)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list heartbeat versions: %w", err)
	}
	return versions, nil
}
