package sqlitestore

import (
	"database/sql"
	"strings"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// The read queries of process_status and list_processes (DESIGN L4), kept
// apart from the methods so that a test can EXPLAIN exactly what they run
// (explain_test.go: no plan may scan the history table).
//
// Both walk an index newest first and stop at their LIMIT, so their cost
// does not grow with the history: process_status reads
// processes_kind_started_idx (process_kind, started_at DESC, instance_id
// DESC), the listing processes_started_idx or the kind or host index.

// processLatestSQL is process_status: the most recently started instance
// of a kind (one parameter, the kind).
const processLatestSQL = `
	SELECT ` + processColumns + ` FROM processes
	WHERE process_kind = ?
	ORDER BY started_at DESC, instance_id DESC
	LIMIT 1`

// processListQuery builds list_processes' query for p: filters, then the
// keyset cursor, newest first. The cursor is a row-value comparison,
// (started_at, instance_id) < (cursor), which SQLite turns into a range on
// the listing's index, so a page deep in the history starts where the
// previous one ended instead of walking every newer row.
func processListQuery(p store.ProcessListParams) (string, []any, error) {
	where := []string{"TRUE"}
	args := []any{sql.Named("now", timeString(utcMS(p.Now))), sql.Named("limit", sqlLimit(p.Limit))}
	if p.Kind != "" {
		where = append(where, "process_kind = @kind")
		args = append(args, sql.Named("kind", p.Kind))
	}
	if p.Host != "" {
		where = append(where, "hostname = @host")
		args = append(args, sql.Named("host", p.Host))
	}
	switch p.Status {
	case "":
	case vigiltype.ProcessAlive:
		where = append(where, aliveSQL)
	case vigiltype.ProcessStopped:
		where = append(where, "NOT "+aliveSQL)
	default:
		return "", nil, vigiltype.Invalid("status", "must be alive or stopped")
	}
	if p.After != nil {
		where = append(where, "(started_at, instance_id) < (@after_started_at, @after_instance_id)")
		args = append(args,
			sql.Named("after_started_at", timeString(p.After.StartedAt)),
			sql.Named("after_instance_id", p.After.InstanceID))
	}
	return `
		SELECT ` + processColumns + ` FROM processes
		WHERE ` + strings.Join(where, " AND ") + `
		ORDER BY started_at DESC, instance_id DESC
		LIMIT @limit`, args, nil
}
