package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
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

// TestMCPHelperProcess is not a test of its own: run by TestMCPBindsNoPort
// as a child process (the os/exec helper-process pattern), it is `vigil mcp`.
func TestMCPHelperProcess(t *testing.T) {
	db := os.Getenv("VIGIL_TEST_MCP_HELPER_DB")
	if db == "" {
		t.Skip("the child process of TestMCPBindsNoPort")
	}
	os.Exit(Main([]string{"mcp", "--db", db}, os.Stdin, os.Stdout, os.Stderr))
}

// vigil mcp speaks on stdio only: its process holds no listening socket
// while it serves (it once bound an unused loopback port).
func TestMCPBindsNoPort(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads the process's sockets from /proc")
	}
	t.Parallel()
	// The check sees a listener when there is one: this process's own.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	port := fmt.Sprintf(":%04X", ln.Addr().(*net.TCPAddr).Port)
	require.True(t, slices.ContainsFunc(listeningSockets(t, os.Getpid()), func(a string) bool {
		return strings.HasSuffix(a, port)
	}), "the check finds this process's own listener")

	cmd := exec.Command(os.Args[0], "-test.run=^TestMCPHelperProcess$")
	cmd.Env = append(os.Environ(), "VIGIL_TEST_MCP_HELPER_DB="+filepath.Join(t.TempDir(), "vigil.db"))
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).
		Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err)
	tools, err := cs.ListTools(t.Context(), nil)
	require.NoError(t, err, stderr.String())
	require.Len(t, tools.Tools, 6) // serving: its store is open and its services wired
	require.Empty(t, listeningSockets(t, cmd.Process.Pid), "vigil mcp listens on no port")
	require.NoError(t, cs.Close()) // closes its stdin: it ends
	require.True(t, cmd.ProcessState.Success(), stderr.String())
}

// listeningSockets lists the local addresses ("0100007F:1F4A", hex as in
// /proc/net/tcp) of the TCP sockets in LISTEN state that process pid holds.
func listeningSockets(t *testing.T, pid int) []string {
	t.Helper()
	proc := "/proc/" + strconv.Itoa(pid)
	fds, err := os.ReadDir(proc + "/fd")
	require.NoError(t, err)
	inodes := map[string]bool{}
	for _, fd := range fds {
		target, err := os.Readlink(proc + "/fd/" + fd.Name())
		if inode, ok := strings.CutPrefix(target, "socket:["); err == nil && ok {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	var listening []string
	for _, table := range []string{"/net/tcp", "/net/tcp6"} {
		data, err := os.ReadFile(proc + table)
		if errors.Is(err, fs.ErrNotExist) {
			continue // no IPv6
		}
		require.NoError(t, err)
		for _, line := range strings.Split(string(data), "\n")[1:] {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			f := strings.Fields(line)
			if len(f) > 9 && f[3] == "0A" && inodes[f[9]] {
				listening = append(listening, f[1])
			}
		}
	}
	return listening
}
