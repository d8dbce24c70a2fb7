package pgstore

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/store/pgstore/pgtest"
)

// TestClaimBatchPlanUsesPrimaryKey runs EXPLAIN on a batch claim's
// statement over an analyzed backlog, under custom and generic plans: the
// pick walks tasks_claim_idx and the claimed tasks are looked up by
// primary key, never by a Seq Scan of the backlog (issue #6).
func TestClaimBatchPlanUsesPrimaryKey(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, pgtest.URL(t))
	ctx := t.Context()
	_, err := s.pool.Exec(ctx, `
		INSERT INTO tasks (task_type, payload, status, max_attempts, max_reclaims, run_after, created_at, updated_at)
		SELECT CASE WHEN i % 3 = 0 THEN 'a' WHEN i % 3 = 1 THEN 'b' ELSE 'c' END, '{}', 'scheduled', 5, 3,
			timestamptz '2026-01-01 00:00:00Z' - make_interval(secs => i),
			timestamptz '2026-01-01 00:00:00Z', timestamptz '2026-01-01 00:00:00Z'
		FROM generate_series(1, 30000) AS i`)
	require.NoError(t, err)
	_, err = s.pool.Exec(ctx, `ANALYZE tasks`)
	require.NoError(t, err)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		t.Run(mode, func(t *testing.T) {
			for _, types := range [][]string{{"a"}, {"b", "a", "c"}} {
				sql, args := positional(claimBatchSQL, pgx.StrictNamedArgs{
					"instance_id": "w", "now": now, "default_lease_ms": 300000, "types": types, "max": 32,
				})
				plan := explainPlan(t, s, mode, sql, args)
				t.Logf("batch claim %v:\n%s", types, plan)
				require.NotContains(t, plan, "Seq Scan on tasks")
				require.Contains(t, plan, "Index Scan using tasks_pkey on tasks")
				require.Regexp(t, `Index Scan using tasks_claim_idx on tasks\s+\(.*\)\n\s+Index Cond: \(\(status = 'scheduled'::text\) AND \(task_type = ty.task_type\)`, plan)
			}
		})
	}
}
