//go:build linux

package bench

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSupervisorCasesSmoke runs the supervisor's rows at smoke size: each
// comes back with figures and a positive ratio, and no process any of them
// started is left running.
func TestSupervisorCasesSmoke(t *testing.T) {
	t.Parallel()
	env := Env{Smoke: true, Dir: t.TempDir(), Log: supTestLog{t}}
	for _, run := range []func(context.Context, Env) ([]Row, error){runSupervisorRestart, runSupervisorMemory} {
		rows, err := run(t.Context(), env)
		require.NoError(t, err)
		require.Len(t, rows, 1)
		r := rows[0]
		require.NotEmpty(t, r.Path)
		require.NotEmpty(t, r.Figure)
		require.NotEmpty(t, r.Baseline)
		require.NotEmpty(t, r.Target)
		require.Positive(t, r.Ratio, "%+v", r)
	}
	require.Empty(t, supMarkedPIDs(supTokenPrefix), "processes left behind")
}

// TestSupervisorCasesRegistered checks that `vigil bench --only` finds the
// supervisor's rows by the names issue #6 uses.
func TestSupervisorCasesRegistered(t *testing.T) {
	t.Parallel()
	var names []string
	for _, c := range Cases() {
		names = append(names, c.Name)
	}
	require.Contains(t, names, "restart")
	require.Contains(t, names, "supervisor-memory")
}

// supTestLog sends Env.Log lines to the test log.
type supTestLog struct{ t *testing.T }

func (w supTestLog) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
