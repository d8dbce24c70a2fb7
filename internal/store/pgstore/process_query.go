package pgstore

import (
	"strings"

	"github.com/jackc/pgx/v5"

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

// processReadMode runs the read queries unprepared (one round trip: parse,
// bind, execute), so PostgreSQL plans each with the values it is given. pgx
// otherwise keeps statements prepared, and after five executions
// PostgreSQL may switch to a generic plan made without the values: for
// process_status it then chose, depending on the sample ANALYZE took,
// processes_started_idx filtered on the kind, which reads the history back
// to the kind's last start (for a kind that has not started lately, all of
// it), instead of one probe of processes_kind_started_idx.
const processReadMode = pgx.QueryExecModeExec

// processLatestSQL is process_status: the most recently started instance
// of a kind (one parameter, the kind).
const processLatestSQL = `
	SELECT ` + processColumns + ` FROM processes
	WHERE process_kind = $1
	ORDER BY started_at DESC, instance_id DESC
	LIMIT 1`

// processListQuery builds list_processes' query for p: filters, then the
// keyset cursor, newest first. The cursor is a row comparison,
// (started_at, instance_id) < (cursor), which PostgreSQL uses as an Index
// Cond on the listing's index, so a page deep in the history starts where
// the previous one ended instead of filtering every newer row.
func processListQuery(p store.ProcessListParams) (string, pgx.StrictNamedArgs, error) {
	where := []string{"TRUE"}
	args := pgx.StrictNamedArgs{"limit": sqlLimit(p.Limit)}
	if p.Kind != "" {
		where = append(where, "process_kind = @kind")
		args["kind"] = p.Kind
	}
	if p.Host != "" {
		where = append(where, "hostname = @host")
		args["host"] = p.Host
	}
	switch p.Status {
	case "":
	case vigiltype.ProcessAlive:
		where = append(where, aliveSQL)
		args["now"] = utcMS(p.Now)
	case vigiltype.ProcessStopped:
		where = append(where, "NOT "+aliveSQL)
		args["now"] = utcMS(p.Now)
	default:
		return "", nil, vigiltype.Invalid("status", "must be alive or stopped")
	}
	if p.After != nil {
		where = append(where, "(started_at, instance_id) < (@after_started_at, @after_instance_id)")
		args["after_started_at"] = utcMS(p.After.StartedAt)
		args["after_instance_id"] = p.After.InstanceID
	}
	return `
		SELECT ` + processColumns + ` FROM processes
		WHERE ` + strings.Join(where, " AND ") + `
		ORDER BY started_at DESC, instance_id DESC
		LIMIT @limit`, args, nil
}
