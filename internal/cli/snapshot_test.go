package cli

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/clock"
	"github.com/vigil-fleet/vigil/internal/events"
	"github.com/vigil-fleet/vigil/internal/liveness"
	"github.com/vigil-fleet/vigil/internal/registry"
	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func TestSnapshotCmd(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	srv := testserver.Start(t, testserver.WithClock(clk))
	ctx := t.Context()
	host, err := os.Hostname()
	require.NoError(t, err)

	_, err = srv.Registry.Register(ctx, registry.RegisterParams{Name: "local"})
	require.NoError(t, err)
	_, err = srv.Liveness.Register(ctx, liveness.RegisterParams{ProcessKind: "local", Hostname: host, PID: os.Getpid(), LivenessIntervalS: 30})
	require.NoError(t, err)
	clk.Advance(time.Millisecond) // the registry lists oldest first
	_, err = srv.Registry.Register(ctx, registry.RegisterParams{Name: "gone"})
	require.NoError(t, err)
	code := 2
	_, err = srv.Events.Record(ctx, events.RecordParams{Agent: "gone", Kind: vigiltype.EventExit, ExitCode: &code})
	require.NoError(t, err)

	exit, out, errOut := run(t, "snapshot", "--server", srv.URL)
	require.Equal(t, 0, exit, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4, out)
	require.Equal(t, []string{"AGENT", "DECLARED", "PROCESS", "STATE", "TASK", "LAST", "EVENT"}, strings.Fields(lines[0]))
	require.Equal(t, []string{"vigil", "self-supervising", "running", "idle", "-", "-"}, strings.Fields(lines[1]))
	require.Equal(t, []string{"local", "active", "running", "idle", "-", "-"}, strings.Fields(lines[2]))
	require.Equal(t, []string{"gone", "active", "not_running", "down", "-", "exit", "code", "2"}, strings.Fields(lines[3])[:8])

	// --json is the API document, field for field.
	exit, out, errOut = run(t, "snapshot", "--json", "--server", srv.URL)
	require.Equal(t, 0, exit, errOut)
	resp, err := http.Get(srv.URL + "/v1/snapshot")
	require.NoError(t, err)
	defer resp.Body.Close()
	api, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.JSONEq(t, string(api), out)
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	require.Len(t, doc["agents"], 3)
}
