package bench

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// rdSmokeEnv is the Env of a smoke run in a test: tiny sizes, a scratch
// directory of the test's own, PostgreSQL from VIGIL_TEST_POSTGRES_URL.
func rdSmokeEnv(t *testing.T) Env {
	t.Helper()
	return Env{Smoke: true, PostgresURL: os.Getenv("VIGIL_TEST_POSTGRES_URL"), Dir: t.TempDir(), Log: rdTestLog{t}}
}

type rdTestLog struct{ t *testing.T }

func (l rdTestLog) Write(p []byte) (int, error) {
	l.t.Log(string(p))
	return len(p), nil
}

// rdRunSmoke runs the case named name at smoke size and checks its rows have
// figures and positive ratios.
func rdRunSmoke(t *testing.T, name string) []Row {
	t.Helper()
	env := rdSmokeEnv(t)
	var c *Case
	for _, cc := range Cases() {
		if cc.Name == name {
			c = &cc
		}
	}
	require.NotNil(t, c, "case %s is not registered", name)
	if c.NeedsPostgres && env.PostgresURL == "" {
		t.Skip("PostgreSQL case: set VIGIL_TEST_POSTGRES_URL to run it")
	}
	rows, err := c.Run(t.Context(), env)
	require.NoError(t, err)
	require.NotEmpty(t, rows)
	for _, r := range rows {
		require.NotEmpty(t, r.Path)
		require.NotEmpty(t, r.Figure, "row %s", r.Path)
		require.NotEmpty(t, r.Baseline, "row %s", r.Path)
		require.NotEmpty(t, r.Target, "row %s", r.Path)
		require.Greater(t, r.Ratio, 0.0, "row %s", r.Path)
		t.Logf("%s: %s | %s | %.2f× | met %v %s", r.Path, r.Figure, r.Baseline, r.Ratio, r.Met, r.Note)
	}
	return rows
}

func TestStatusSmoke(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { t.Parallel(); rdRunSmoke(t, "status-sqlite") })
	t.Run("postgres", func(t *testing.T) { t.Parallel(); rdRunSmoke(t, "status-postgres") })
}

func TestListSmoke(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { t.Parallel(); rdRunSmoke(t, "list-sqlite") })
	t.Run("postgres", func(t *testing.T) { t.Parallel(); rdRunSmoke(t, "list-postgres") })
}
