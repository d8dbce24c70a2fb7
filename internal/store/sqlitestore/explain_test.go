package sqlitestore

import (
	"database/sql"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// TestReadPlansUseIndexes runs EXPLAIN QUERY PLAN on the queries of
// process_status and list_processes (issue #6): none may scan the history
// table without an index or sort it, so their cost does not grow with the
// history; a cursor page must start with a range search on the index
// (keyset pagination), not walk every newer row. Plans are checked on a
// fresh database (no statistics, as vigil runs) and again after ANALYZE.
func TestReadPlansUseIndexes(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "vigil.db")
	s := openTestStore(t, path)
	db := rawDB(t, path)
	_, err := db.ExecContext(t.Context(), `
		WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000)
		INSERT INTO processes (instance_id, token_hash, process_kind, hostname, pid,
			liveness_interval_s, started_at, last_heartbeat_at, alive_until, exited_at)
		SELECT printf('id-%06d', i), 'x', 'kind-' || (i % 20), 'host-' || (i % 50), i, 30,
			strftime('%Y-%m-%dT%H:%M:%fZ', '2026-01-01T00:00:00.000Z', '-' || i || ' seconds'),
			'2026-01-01T00:00:00.000Z', '2026-01-01T00:01:30.000Z',
			CASE WHEN i % 10 = 0 THEN NULL ELSE '2026-01-01T00:00:00.000Z' END
		FROM n`)
	require.NoError(t, err)

	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cursor := &store.ProcessCursor{StartedAt: now.Add(-time.Hour), InstanceID: "id-003600"}
	lists := map[string]store.ProcessListParams{
		"first page":        {Limit: 51, Now: now},
		"kind":              {Kind: "kind-7", Limit: 51, Now: now},
		"host":              {Host: "host-3", Limit: 51, Now: now},
		"cursor":            {After: cursor, Limit: 51, Now: now},
		"kind and cursor":   {Kind: "kind-7", After: cursor, Limit: 51, Now: now},
		"host and cursor":   {Host: "host-3", After: cursor, Limit: 51, Now: now},
		"status and cursor": {Status: vigiltype.ProcessStopped, After: cursor, Limit: 51, Now: now},
	}
	check := func(t *testing.T) {
		plan := explain(t, s, processLatestSQL, "kind-7")
		requireIndexed(t, "process_status", plan)
		require.Contains(t, plan, "SEARCH processes USING INDEX processes_kind_started_idx (process_kind=?)", "process_status")
		for name, p := range lists {
			query, args, err := processListQuery(p)
			require.NoError(t, err)
			plan := explain(t, s, query, args...)
			requireIndexed(t, "list_processes "+name, plan)
			switch {
			case p.Kind != "":
				require.Contains(t, plan, "processes_kind_started_idx", "list_processes %s", name)
			case p.Host != "":
				require.Contains(t, plan, "processes_host_started_idx", "list_processes %s", name)
			}
			if p.After != nil {
				require.Regexp(t, `SEARCH processes USING INDEX \w+ \(.*\(started_at,instance_id\)<\(\?,\?\)\)`, plan,
					"list_processes %s: the cursor must be a range on the index", name)
			}
		}
	}
	t.Run("fresh", check)
	_, err = db.ExecContext(t.Context(), `ANALYZE`)
	require.NoError(t, err)
	t.Run("analyzed", check)
}

// explain returns the EXPLAIN QUERY PLAN lines of query, one per line.
func explain(t *testing.T, s *Store, query string, args ...any) string {
	t.Helper()
	rows, err := s.reader.QueryContext(t.Context(), "EXPLAIN QUERY PLAN "+query, args...)
	require.NoError(t, err)
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		require.NoError(t, rows.Scan(&id, &parent, &unused, &detail))
		lines = append(lines, detail)
	}
	require.NoError(t, rows.Err())
	return strings.Join(lines, "\n")
}

// fullScan matches a plan line that reads the processes table without an
// index; tempSort one that sorts rows the index should have given in order.
var (
	fullScan = regexp.MustCompile(`(?m)^SCAN processes$`)
	tempSort = regexp.MustCompile(`USE TEMP B-TREE`)
)

func requireIndexed(t *testing.T, what, plan string) {
	t.Helper()
	t.Logf("%s:\n%s", what, plan)
	require.NotRegexp(t, fullScan, plan, "%s scans the history table", what)
	require.NotRegexp(t, tempSort, plan, "%s sorts the history table", what)
}

// TestTaskPlansUseIndexes runs EXPLAIN QUERY PLAN on a claim's pick (one
// type, several) and a reclaim pass's pick (issue #6): each must walk its
// index in order and stop, not read and sort the whole backlog.
func TestTaskPlansUseIndexes(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, filepath.Join(t.TempDir(), "vigil.db"))
	for _, types := range [][]string{{"a"}, {"b", "a", "c", "a"}} {
		pick, args, err := claimPickSQL(types)
		require.NoError(t, err)
		args = append(args, sql.Named("now", "2026-01-01T00:00:00.000Z"))
		plan := explain(t, s, "SELECT task_id FROM tasks WHERE task_id = "+pick, args...)
		t.Logf("claim %v:\n%s", types, plan)
		require.Contains(t, plan, "USING COVERING INDEX tasks_claim_idx (status=? AND task_type=? AND run_after<?)")
		require.NotRegexp(t, `(?m)^SCAN tasks$`, plan)
		require.Equal(t, len(slices.Compact(slices.Sorted(slices.Values(types))))-1, strings.Count(plan, "UNION ALL"))
		if len(types) == 1 {
			require.NotContains(t, plan, "TEMP B-TREE", "claim %v", types)
		}
	}
	plan := explain(t, s, `SELECT task_id FROM tasks WHERE `+reclaimableSQL+` ORDER BY lease_expires_at, task_id LIMIT 1000`,
		sql.Named("now", "2026-01-01T00:00:00.000Z"))
	t.Logf("reclaim:\n%s", plan)
	require.Contains(t, plan, "SEARCH tasks USING INDEX tasks_reclaim_idx (status=?)")
	require.NotContains(t, plan, "TEMP B-TREE")
}
