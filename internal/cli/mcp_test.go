package cli

import (
	"bytes"
	"io"
	"path/filepath"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

func TestMCPStdio(t *testing.T) {
	t.Parallel()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	var stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Main([]string{"mcp", "--db", filepath.Join(t.TempDir(), "vigil.db")}, inR, outW, &stderr)
		outW.Close()
	}()

	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).
		Connect(t.Context(), &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	require.NoError(t, err)
	tools, err := cs.ListTools(t.Context(), nil)
	require.NoError(t, err)
	require.Len(t, tools.Tools, 6)
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "list_processes", Arguments: map[string]any{}})
	require.NoError(t, err)
	require.False(t, res.IsError)
	res, err = cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "process_status", Arguments: map[string]any{"process_kind": "ghost"}})
	require.NoError(t, err)
	require.True(t, res.IsError)

	require.NoError(t, cs.Close()) // closes stdin: the command ends
	require.Equal(t, 0, <-done, stderr.String())
}
