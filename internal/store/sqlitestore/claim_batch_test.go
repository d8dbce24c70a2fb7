package sqlitestore

import (
	"database/sql"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestClaimBatchPlanUsesRowids runs EXPLAIN QUERY PLAN on a batch claim's
// UPDATE (one type, several, more than claimTypesIndexedMax): the picked
// tasks are looked up by rowid, never by walking the scheduled tasks, and
// the pick walks tasks_claim_idx, so a claim's cost does not grow with the
// backlog (issue #6).
func TestClaimBatchPlanUsesRowids(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, filepath.Join(t.TempDir(), "vigil.db"))
	many := make([]string, claimTypesIndexedMax+1)
	for i := range many {
		many[i] = "t" + string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	for _, types := range [][]string{{"a"}, {"b", "a", "c"}, many} {
		q, args, err := claimBatchSQL(types)
		require.NoError(t, err)
		args = append(args, sql.Named("now", "2026-01-01T00:00:00.000Z"), sql.Named("max", 32),
			sql.Named("instance_id", "w"), sql.Named("default_lease_ms", 1000))
		plan := explain(t, s, q, args...)
		t.Logf("batch claim of %d types:\n%s", len(types), plan)
		require.Regexp(t, `(?m)^SEARCH tasks USING INTEGER PRIMARY KEY \(rowid=\?\)$`, plan)
		require.NotRegexp(t, regexp.MustCompile(`(?m)^SEARCH tasks USING (COVERING )?INDEX tasks_reclaim_idx`), plan)
		require.NotRegexp(t, `(?m)^SCAN tasks$`, plan)
		if len(types) <= claimTypesIndexedMax {
			require.Contains(t, plan, "USING COVERING INDEX tasks_claim_idx (status=? AND task_type=? AND run_after<?)")
		}
	}
}
