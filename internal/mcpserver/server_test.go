package mcpserver_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vigil-fleet/vigil/internal/events"
	"github.com/vigil-fleet/vigil/internal/liveness"
	"github.com/vigil-fleet/vigil/internal/mcpserver"
	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// connect serves New over the test server's services on an in-memory
// transport and returns a connected client session.
func connect(t *testing.T, srv *testserver.Server) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	s := mcpserver.New(mcpserver.Deps{
		Liveness: srv.Liveness, Events: srv.Events, Snapshot: srv.Snapshot, Sweepers: srv.Store(),
	})
	st, ct := mcp.NewInMemoryTransports()
	ss, err := s.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// call calls a tool and decodes its JSON text content into out (when non-nil).
// It returns the result for IsError checks.
func call(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any, out any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error: %v", name, err)
	}
	if out != nil && !res.IsError {
		if err := json.Unmarshal([]byte(text(res)), out); err != nil {
			t.Fatalf("%s: decode %q: %v", name, text(res), err)
		}
	}
	return res
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func seed(t *testing.T, srv *testserver.Server) {
	t.Helper()
	ctx := context.Background()
	if _, err := srv.Liveness.Register(ctx, liveness.RegisterParams{
		ProcessKind: "worker", Hostname: "host-a", PID: 42, LivenessIntervalS: 30,
	}); err != nil {
		t.Fatal(err)
	}
	code := 1
	if _, err := srv.Events.Record(ctx, events.RecordParams{Agent: "worker", Kind: vigiltype.EventExit, ExitCode: &code}); err != nil {
		t.Fatal(err)
	}
}

func TestTools(t *testing.T) {
	srv := testserver.Start(t)
	seed(t, srv)
	cs := connect(t, srv)
	ctx := context.Background()

	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
	}
	for _, want := range []string{"list_agents", "agent_status", "list_processes", "process_status", "fleet_snapshot", "list_process_events"} {
		if !slices.Contains(names, want) {
			t.Errorf("tool %s missing; have %v", want, names)
		}
	}

	var agents struct {
		Agents []map[string]any `json:"agents"`
	}
	if res := call(t, cs, "list_agents", nil, &agents); res.IsError {
		t.Fatalf("list_agents: %s", text(res))
	}
	if len(agents.Agents) == 0 {
		t.Fatal("list_agents: no sweepers (want lease_reclaimer)")
	}
	for _, a := range agents.Agents {
		if a["kind"] != "sweeper" {
			t.Errorf("list_agents row kind = %v, want sweeper", a["kind"])
		}
		for _, k := range []string{"name", "interval_s", "last_run_at", "last_result_count", "last_run_duration_ms", "last_error"} {
			if _, ok := a[k]; !ok {
				t.Errorf("list_agents row lacks %s: %v", k, a)
			}
		}
		var one map[string]any
		if res := call(t, cs, "agent_status", map[string]any{"name": a["name"]}, &one); res.IsError || one["name"] != a["name"] {
			t.Errorf("agent_status %v: %s", a["name"], text(res))
		}
	}
	if res := call(t, cs, "agent_status", map[string]any{"name": "nope"}, nil); !res.IsError || !strings.Contains(text(res), "nope") {
		t.Errorf("agent_status unknown: IsError=%v %q", res.IsError, text(res))
	}

	var procs struct {
		Processes []vigiltype.Process `json:"processes"`
		Next      *string             `json:"next_cursor"`
	}
	if res := call(t, cs, "list_processes", map[string]any{"kind": "worker", "status": "alive"}, &procs); res.IsError {
		t.Fatalf("list_processes: %s", text(res))
	}
	if len(procs.Processes) != 1 || procs.Processes[0].ProcessKind != "worker" || procs.Next == nil {
		t.Errorf("list_processes = %+v", procs)
	}

	var p vigiltype.Process
	if res := call(t, cs, "process_status", map[string]any{"process_kind": "worker"}, &p); res.IsError || p.ProcessKind != "worker" {
		t.Errorf("process_status worker: %s", text(res))
	}
	if res := call(t, cs, "process_status", map[string]any{"process_kind": "ghost"}, nil); !res.IsError || !strings.Contains(text(res), `no process of kind "ghost"`) {
		t.Errorf("process_status ghost: IsError=%v %q", res.IsError, text(res))
	}

	var snap map[string]any
	if res := call(t, cs, "fleet_snapshot", nil, &snap); res.IsError {
		t.Fatalf("fleet_snapshot: %s", text(res))
	}
	if _, ok := snap["agents"]; !ok {
		t.Errorf("fleet_snapshot lacks agents: %v", snap)
	}

	var evs struct {
		Events []vigiltype.ProcessEvent `json:"events"`
	}
	if res := call(t, cs, "list_process_events", map[string]any{"agent": "worker", "undelivered": true, "limit": 10}, &evs); res.IsError {
		t.Fatalf("list_process_events: %s", text(res))
	}
	if len(evs.Events) != 1 || evs.Events[0].Agent != "worker" {
		t.Errorf("list_process_events = %+v", evs)
	}
}

func TestBadArguments(t *testing.T) {
	srv := testserver.Start(t)
	cs := connect(t, srv)
	for _, tc := range []struct {
		tool string
		args map[string]any
	}{
		{"list_processes", map[string]any{"status": "zombie"}},
		{"list_processes", map[string]any{"limit": -1}},
		{"list_processes", map[string]any{"cursor": "garbage"}},
		{"list_processes", map[string]any{"limit": "ten"}},
		{"list_process_events", map[string]any{"limit": -1}},
		{"process_status", map[string]any{}},
		{"agent_status", map[string]any{}},
	} {
		if res := call(t, cs, tc.tool, tc.args, nil); !res.IsError {
			t.Errorf("%s %v: want a tool error, got %q", tc.tool, tc.args, text(res))
		}
	}
}

func TestStreamableHTTP(t *testing.T) {
	srv := testserver.Start(t)
	seed(t, srv)
	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp", DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	var p vigiltype.Process
	if res := call(t, cs, "process_status", map[string]any{"process_kind": "worker"}, &p); res.IsError || p.ProcessKind != "worker" {
		t.Errorf("process_status over HTTP: %s", text(res))
	}
}
