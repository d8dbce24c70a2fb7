package bench

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// hbTestLog sends a case's progress lines to the test log.
type hbTestLog struct{ t *testing.T }

func (l hbTestLog) Write(p []byte) (int, error) {
	l.t.Log(string(p))
	return len(p), nil
}

// TestHeartbeatCasesSmoke runs the heartbeat ingest and fleet load cases at
// smoke size (a few seconds each), as CI does through `vigil bench --smoke`:
// rows come back with figures, and the ingest rows with a positive ratio to
// their same-run baseline.
func TestHeartbeatCasesSmoke(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"heartbeat-sqlite", "heartbeat-postgres", "fleet-load-postgres"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var c *Case
			for _, cc := range Cases() {
				if cc.Name == name {
					c = &cc
				}
			}
			require.NotNil(t, c, "case %s is not registered", name)
			env := Env{Smoke: true, PostgresURL: os.Getenv("VIGIL_TEST_POSTGRES_URL"), Dir: t.TempDir(), Log: hbTestLog{t}}
			if c.NeedsPostgres && env.PostgresURL == "" {
				t.Skip("PostgreSQL case: set VIGIL_TEST_POSTGRES_URL to run it")
			}
			start := time.Now()
			rows, err := c.Run(t.Context(), env)
			require.NoError(t, err)
			t.Logf("%s: smoke run in %s", name, time.Since(start).Round(time.Millisecond))
			require.NotEmpty(t, rows)
			for _, r := range rows {
				require.NotEmpty(t, r.Path)
				require.NotEmpty(t, r.Figure)
				require.NotEmpty(t, r.Baseline)
				require.NotEmpty(t, r.Target)
				require.Contains(t, r.Note, "smoke")
				if c.Name != "fleet-load-postgres" { // no baseline: it reports the achieved rate
					require.Positive(t, r.Ratio, "ratio to the same-run baseline")
				}
			}
		})
	}
}
