package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/bench"
)

// vigil bench wires the harness: --list names every case, a smoke run of one
// case prints its row as JSON or writes the Markdown table, and a bad --only
// is refused naming the flag.
func TestBenchCommand(t *testing.T) {
	t.Parallel()
	code, out, _ := run(t, "bench", "--list")
	require.Equal(t, 0, code)
	for _, c := range bench.Cases() {
		require.Contains(t, out, c.Name)
	}

	code, out, errOut := run(t, "bench", "--smoke", "--only", "^reclaim-sqlite$", "--postgres", "", "--json")
	require.Equal(t, 0, code, errOut)
	var doc struct {
		Smoke bool        `json:"smoke"`
		Rows  []bench.Row `json:"rows"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	require.True(t, doc.Smoke)
	require.NotEmpty(t, doc.Rows)
	require.NotEmpty(t, doc.Rows[0].Figure)
	require.Contains(t, errOut, "run reclaim-sqlite", "progress goes to stderr")

	md := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	code, _, errOut = run(t, "bench", "--smoke", "--only", "^reclaim-sqlite$", "--postgres", "", "--out", md)
	require.Equal(t, 0, code, errOut)
	data, err := os.ReadFile(md)
	require.NoError(t, err)
	require.Contains(t, string(data), "| hot path | figure | baseline | ratio | target | met | note |")
	require.Contains(t, string(data), "Smoke run")

	require.Contains(t, string(data), "n/a (smoke)", "a smoke run judges no target")
	require.False(t, doc.Rows[0].Met)

	code, _, errOut = run(t, "bench", "--only", "[")
	require.Equal(t, 1, code)
	require.True(t, strings.Contains(errOut, "--only"), errOut)

	code, _, errOut = run(t, "bench", "--smoke", "--only", "^reclaim-sqlite$", "--postgres", "", "--out", filepath.Join(t.TempDir(), "no", "such", "dir.md"))
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "--out")
	require.NotContains(t, errOut, "run reclaim-sqlite", "refused before measuring")

	code, _, errOut = run(t, "bench", "--smoke", "--only", "^reclaim-postgres$", "--postgres", "")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "give --postgres URL")

	code, _, errOut = run(t, "bench", "--smoke", "--only", "no-such-case", "--postgres", "")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "no case matches --only")
}
