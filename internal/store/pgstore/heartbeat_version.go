package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// heartbeatVersionColumns are the heartbeat_versions columns
// scanHeartbeatVersion reads, in order.
const heartbeatVersionColumns = `hostname, schema_version, last_sent_at, heartbeats`

// scanHeartbeatVersion converts one heartbeat_versions row
// (heartbeatVersionColumns) to a HeartbeatVersion. It is the only place
// heartbeat_versions rows become vigiltype values.
func scanHeartbeatVersion(row rowScanner) (*vigiltype.HeartbeatVersion, error) {
	var hv vigiltype.HeartbeatVersion
	if err := row.Scan(&hv.Hostname, &hv.SchemaVersion, &hv.LastSentAt, &hv.Heartbeats); err != nil {
		return nil, err
	}
	hv.LastSentAt = hv.LastSentAt.UTC()
	return &hv, nil
}

// countHeartbeat counts one lease heartbeat of schemaVersion sent at now by
// instanceID under its hostname, inside the heartbeat's transaction:
// heartbeats + 1, and last_sent_at = now unless the row already holds a
// later time (a server whose clock lags). INSERT … ON CONFLICT is atomic
// under concurrent heartbeats from other servers. An instance without a
// processes row (impossible for a lease holder, which is never pruned)
// counts nothing.
func countHeartbeat(ctx context.Context, tx pgx.Tx, instanceID string, schemaVersion int, now time.Time) error {
	_, err := tx.Exec(ctx, `
		INSERT INTO heartbeat_versions (`+heartbeatVersionColumns+`)
		SELECT hostname, @schema_version::bigint, @now::timestamptz, 1 FROM processes
		WHERE instance_id = @instance_id
		ON CONFLICT (hostname, schema_version) DO UPDATE SET
			last_sent_at = GREATEST(heartbeat_versions.last_sent_at, excluded.last_sent_at),
			heartbeats = heartbeat_versions.heartbeats + 1`,
		pgx.StrictNamedArgs{"schema_version": schemaVersion, "now": utcMS(now), "instance_id": instanceID},
	)
	if err != nil {
		return fmt.Errorf("count heartbeat version %d: %w", schemaVersion, interpretError(err))
	}
	return nil
}

// HeartbeatVersionList implements store.Store.
func (s *Store) HeartbeatVersionList(ctx context.Context, since time.Time) ([]*vigiltype.HeartbeatVersion, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT `+heartbeatVersionColumns+` FROM heartbeat_versions
		WHERE last_sent_at >= $1
		ORDER BY hostname, schema_version`, utcMS(since))
	if err != nil {
		return nil, fmt.Errorf("list heartbeat versions: %w", interpretError(err))
	}
	versions, err := pgx.AppendRows([]*vigiltype.HeartbeatVersion(nil), rows,
		func(row pgx.CollectableRow) (*vigiltype.HeartbeatVersion, error) {
			return scanHeartbeatVersion(row)
		})
	if err != nil {
		return nil, fmt.Errorf("list heartbeat versions: %w", interpretError(err))
	}
	return versions, nil
}
