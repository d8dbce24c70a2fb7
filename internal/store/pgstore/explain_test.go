package pgstore

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/internal/store/pgstore/pgtest"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// TestReadPlansUseIndexes runs EXPLAIN on the queries of process_status and
// list_processes (issue #6) over an analyzed history of 50,000 rows: no
// plan may read the processes table with a Seq Scan or sort it, so their
// cost does not grow with the history, and a cursor page must find its
// start with an Index Cond on the row comparison (keyset pagination), not
// filter every newer row. The reads run unprepared, so they get custom
// plans; generic plans (what a statement cache would bring) are checked
// for scans and sorts too, and a kind that has not started lately must be
// found through its own index.
func TestReadPlansUseIndexes(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, pgtest.URL(t))
	ctx := t.Context()
	_, err := s.pool.Exec(ctx, `
		INSERT INTO processes (instance_id, token_hash, process_kind, hostname, pid,
			liveness_interval_s, started_at, last_heartbeat_at, alive_until, exited_at)
		SELECT 'id-' || lpad(i::text, 6, '0'), 'x', 'kind-' || (i % 20), 'host-' || (i % 50), i, 30,
			timestamptz '2026-01-01 00:00:00Z' - make_interval(secs => i),
			timestamptz '2026-01-01 00:00:00Z', timestamptz '2026-01-01 00:01:30Z',
			CASE WHEN i % 10 = 0 THEN NULL ELSE timestamptz '2026-01-01 00:00:00Z' END
		FROM generate_series(1, 50000) AS i`)
	require.NoError(t, err)
	_, err = s.pool.Exec(ctx, `
		INSERT INTO processes (instance_id, token_hash, process_kind, hostname, pid,
			liveness_interval_s, started_at, last_heartbeat_at, alive_until, exited_at)
		SELECT 'rare-' || i, 'x', 'kind-rare', 'host-1', i, 30,
			timestamptz '2025-01-01 00:00:00Z' - make_interval(secs => i),
			timestamptz '2025-01-01 00:00:00Z', timestamptz '2025-01-01 00:01:30Z', timestamptz '2025-01-01 00:00:00Z'
		FROM generate_series(1, 5) AS i`)
	require.NoError(t, err)
	_, err = s.pool.Exec(ctx, `ANALYZE processes`)
	require.NoError(t, err)

	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cursor := &store.ProcessCursor{StartedAt: now.Add(-10 * time.Hour), InstanceID: "id-036000"}
	lists := map[string]store.ProcessListParams{
		"first page":        {Limit: 51, Now: now},
		"kind":              {Kind: "kind-7", Limit: 51, Now: now},
		"host":              {Host: "host-3", Limit: 51, Now: now},
		"cursor":            {After: cursor, Limit: 51, Now: now},
		"kind and cursor":   {Kind: "kind-7", After: cursor, Limit: 51, Now: now},
		"host and cursor":   {Host: "host-3", After: cursor, Limit: 51, Now: now},
		"status and cursor": {Status: vigiltype.ProcessStopped, After: cursor, Limit: 51, Now: now},
	}
	// The reads run unprepared (processReadMode), so each gets a custom plan
	// made with its values; a generic plan is checked too, as a statement
	// cache would make one.
	require.Equal(t, pgx.QueryExecModeExec, processReadMode)
	lists["rare kind"] = store.ProcessListParams{Kind: "kind-rare", Limit: 51, Now: now}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		t.Run(mode, func(t *testing.T) {
			plan := explainPlan(t, s, mode, processLatestSQL, []any{"kind-7"})
			requireIndexed(t, "process_status", plan)
			if mode == "force_custom_plan" {
				// A kind that has not started lately: only its own index
				// finds its newest row without reading the history.
				plan := explainPlan(t, s, mode, processLatestSQL, []any{"kind-rare"})
				requireIndexed(t, "process_status of a rare kind", plan)
				require.Contains(t, plan, "processes_kind_started_idx", "process_status of a rare kind")
			}
			for name, p := range lists {
				query, named, err := processListQuery(p)
				require.NoError(t, err)
				sql, args := positional(query, named)
				plan := explainPlan(t, s, mode, sql, args)
				if name == "rare kind" {
					// Its five rows may be fetched through the kind's index
					// and sorted: a sort of the kind's rows, not the history.
					t.Logf("list_processes %s:\n%s", name, plan)
					require.NotRegexp(t, seqScan, plan, "list_processes %s", name)
					if mode == "force_custom_plan" {
						require.Contains(t, plan, "processes_kind_started_idx", "list_processes %s", name)
					}
					continue
				}
				requireIndexed(t, "list_processes "+name, plan)
				if p.After != nil {
					require.Regexp(t, `Index Cond: .*ROW\(started_at, instance_id\) < ROW\(`, plan,
						"list_processes %s: the cursor must be an index condition", name)
				}
			}
		})
	}
}

// explainPlan prepares query on one connection, sets plan_cache_mode to
// mode and returns the text of EXPLAIN EXECUTE with args.
func explainPlan(t *testing.T, s *Store, mode, query string, args []any) string {
	t.Helper()
	ctx := t.Context()
	conn, err := s.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "SET plan_cache_mode = "+mode)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(ctx, "RESET plan_cache_mode; DEALLOCATE ALL") }()
	_, err = conn.Exec(ctx, "PREPARE explained AS "+query)
	require.NoError(t, err)
	params := make([]string, len(args))
	for i, a := range args {
		params[i] = literal(a)
	}
	exec := "EXPLAIN EXECUTE explained"
	if len(params) > 0 {
		exec += "(" + strings.Join(params, ", ") + ")"
	}
	rows, err := conn.Query(ctx, exec, pgx.QueryExecModeSimpleProtocol)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return strings.Join(lines, "\n")
}

// positional rewrites the @name parameters of query to $1, $2, … and
// returns the values in that order.
func positional(query string, named pgx.StrictNamedArgs) (string, []any) {
	index := map[string]int{}
	var args []any
	out := regexp.MustCompile(`@(\w+)`).ReplaceAllStringFunc(query, func(m string) string {
		name := m[1:]
		i, ok := index[name]
		if !ok {
			args = append(args, named[name])
			i = len(args)
			index[name] = i
		}
		return fmt.Sprintf("$%d", i)
	})
	return out, args
}

// literal is a as an SQL literal, for EXECUTE's arguments.
func literal(a any) string {
	switch v := a.(type) {
	case string:
		return "'" + strings.ReplaceAll(v, "'", "''") + "'"
	case []string:
		quoted := make([]string, len(v))
		for i, e := range v {
			quoted[i] = literal(e)
		}
		return "ARRAY[" + strings.Join(quoted, ", ") + "]::text[]"
	case time.Time:
		return "timestamptz '" + v.UTC().Format(time.RFC3339Nano) + "'"
	case *int:
		if v == nil {
			return "NULL"
		}
		return fmt.Sprint(*v)
	}
	return fmt.Sprint(a)
}

// seqScan matches a plan node that reads processes without an index;
// sorted one that sorts rows the index should have given in order.
var (
	seqScan = regexp.MustCompile(`Seq Scan on processes`)
	sorted  = regexp.MustCompile(`(?m)^\s*(->\s*)?(Incremental )?Sort\b`)
)

func requireIndexed(t *testing.T, what, plan string) {
	t.Helper()
	t.Logf("%s:\n%s", what, plan)
	require.NotRegexp(t, seqScan, plan, "%s scans the history table", what)
	require.NotRegexp(t, sorted, plan, "%s sorts the history table", what)
}

// TestTaskPlansUseIndexes runs EXPLAIN on a claim's pick and a reclaim
// pass's pick over an analyzed backlog (issue #6): each must walk its index
// in order and stop, not read and sort every scheduled or running task.
func TestTaskPlansUseIndexes(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, pgtest.URL(t))
	ctx := t.Context()
	_, err := s.pool.Exec(ctx, `
		INSERT INTO tasks (task_type, payload, status, max_attempts, max_reclaims, run_after, created_at, updated_at,
			lease_owner, lease_expires_at)
		SELECT CASE WHEN i % 3 = 0 THEN 'a' WHEN i % 3 = 1 THEN 'b' ELSE 'c' END, '{}',
			CASE WHEN i % 5 = 0 THEN 'running' ELSE 'scheduled' END, 5, 3,
			timestamptz '2026-01-01 00:00:00Z' - make_interval(secs => i),
			timestamptz '2026-01-01 00:00:00Z', timestamptz '2026-01-01 00:00:00Z',
			CASE WHEN i % 5 = 0 THEN 'w' END,
			CASE WHEN i % 5 = 0 THEN timestamptz '2026-01-01 00:00:00Z' - make_interval(secs => i) END
		FROM generate_series(1, 30000) AS i`)
	require.NoError(t, err)
	_, err = s.pool.Exec(ctx, `ANALYZE tasks`)
	require.NoError(t, err)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		t.Run(mode, func(t *testing.T) {
			for _, types := range [][]string{{"a"}, {"b", "a", "c"}} {
				sql, args := positional(`WITH next AS (`+claimPickSQL+`) SELECT task_id FROM next`,
					pgx.StrictNamedArgs{"types": types, "now": now})
				plan := explainPlan(t, s, mode, sql, args)
				t.Logf("claim %v:\n%s", types, plan)
				require.NotContains(t, plan, "Seq Scan on tasks")
				require.Regexp(t, `Index Scan using tasks_claim_idx on tasks\s+\(.*\)\n\s+Index Cond: \(\(status = 'scheduled'::text\) AND \(task_type = ty.task_type\)`, plan)
			}
			sql, args := positional(`SELECT task_id FROM tasks WHERE `+reclaimableSQL+`
				ORDER BY lease_expires_at LIMIT @limit FOR UPDATE OF tasks SKIP LOCKED`,
				pgx.StrictNamedArgs{"now": now, "limit": new(1000)})
			plan := explainPlan(t, s, mode, sql, args)
			t.Logf("reclaim:\n%s", plan)
			require.Contains(t, plan, "Index Scan using tasks_reclaim_idx on tasks")
			require.NotRegexp(t, sorted, plan)
		})
	}
}
