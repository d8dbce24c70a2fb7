// Package mcpserver is vigil's MCP server (DESIGN 7): read-only tools over
// the in-process services, served on stdio by `vigil mcp` and over
// streamable HTTP at /mcp by `vigil serve`.
package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vigil-fleet/vigil/internal/events"
	"github.com/vigil-fleet/vigil/internal/liveness"
	"github.com/vigil-fleet/vigil/internal/snapshot"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// SweeperLister reads the server's sweepers (store.Store satisfies it).
type SweeperLister interface {
	SweeperList(ctx context.Context) ([]*vigiltype.Sweeper, error)
}

// Deps are the services the tools call; all are required.
type Deps struct {
	Liveness *liveness.Service
	Events   *events.Service
	Snapshot *snapshot.Service
	Sweepers SweeperLister
	Version  string // reported to clients; "dev" when empty
}

// Tool inputs. The SDK validates them against the schema inferred from
// these types; the services validate the values.
type (
	listAgentsIn  struct{}
	agentStatusIn struct {
		Name string `json:"name" jsonschema:"the sweeper's name, e.g. lease_reclaimer"`
	}
	listProcessesIn struct {
		Kind   string `json:"kind,omitempty" jsonschema:"only instances of this process kind"`
		Status string `json:"status,omitempty" jsonschema:"alive or stopped"`
		Host   string `json:"host,omitempty" jsonschema:"only instances on this hostname"`
		Limit  int    `json:"limit,omitempty" jsonschema:"page size, 1 to 1000 (default 100)"`
		Cursor string `json:"cursor,omitempty" jsonschema:"next_cursor of the previous page"`
	}
	processStatusIn struct {
		ProcessKind string `json:"process_kind" jsonschema:"the process kind"`
	}
	fleetSnapshotIn     struct{}
	listProcessEventsIn struct {
		Agent       string `json:"agent,omitempty" jsonschema:"only events of this agent"`
		Undelivered bool   `json:"undelivered,omitempty" jsonschema:"only events not yet acknowledged"`
		Limit       int    `json:"limit,omitempty" jsonschema:"page size, 1 to 1000 (default 100)"`
	}
)

// New returns the MCP server with vigil's six tools.
func New(d Deps) *mcp.Server {
	v := d.Version
	if v == "" {
		v = "dev"
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "vigil", Version: v}, nil)
	ro := &mcp.ToolAnnotations{ReadOnlyHint: true}

	mcp.AddTool(s, &mcp.Tool{Name: "list_agents", Annotations: ro,
		Description: `The server's sweepers: {"agents":[{name, kind:"sweeper", interval_s, last_run_at, last_result_count, last_run_duration_ms, last_error}]}.`,
	}, func(ctx context.Context, _ *mcp.CallToolRequest, _ listAgentsIn) (*mcp.CallToolResult, any, error) {
		list, err := d.Sweepers.SweeperList(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("list sweepers: %w", err)
		}
		if list == nil {
			list = []*vigiltype.Sweeper{}
		}
		return nil, map[string]any{"agents": list}, nil
	})

	mcp.AddTool(s, &mcp.Tool{Name: "agent_status", Annotations: ro,
		Description: "One sweeper by name: {name, kind:\"sweeper\", interval_s, last_run_at, last_result_count, last_run_duration_ms, last_error}.",
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in agentStatusIn) (*mcp.CallToolResult, any, error) {
		if in.Name == "" {
			return nil, nil, errors.New("name: required")
		}
		list, err := d.Sweepers.SweeperList(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("list sweepers: %w", err)
		}
		for _, sw := range list {
			if sw.Name == in.Name {
				return nil, sw, nil
			}
		}
		return nil, nil, fmt.Errorf("no sweeper named %q", in.Name)
	})

	mcp.AddTool(s, &mcp.Tool{Name: "list_processes", Annotations: ro,
		Description: `Process instances newest first with their computed status (alive or stopped): {"processes":[…], "next_cursor"} ("" on the last page).`,
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in listProcessesIn) (*mcp.CallToolResult, any, error) {
		procs, next, err := d.Liveness.List(ctx, liveness.ListParams{
			Kind: in.Kind, Host: in.Host, Status: in.Status, Limit: in.Limit, Cursor: in.Cursor,
		})
		if err != nil {
			return nil, nil, err
		}
		if procs == nil {
			procs = []*vigiltype.Process{}
		}
		return nil, map[string]any{"processes": procs, "next_cursor": next}, nil
	})

	mcp.AddTool(s, &mcp.Tool{Name: "process_status", Annotations: ro,
		Description: "The newest instance of a process kind, with its computed status.",
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in processStatusIn) (*mcp.CallToolResult, any, error) {
		p, err := d.Liveness.Latest(ctx, in.ProcessKind)
		if errors.Is(err, vigiltype.ErrNotFound) {
			return nil, nil, fmt.Errorf("no process of kind %q", in.ProcessKind)
		}
		if err != nil {
			return nil, nil, err
		}
		return nil, p, nil
	})

	mcp.AddTool(s, &mcp.Tool{Name: "fleet_snapshot", Annotations: ro,
		Description: `The fleet snapshot: {"taken_at","hostname","agents":[…]}, each agent's declared status, process state and operational state.`,
	}, func(ctx context.Context, _ *mcp.CallToolRequest, _ fleetSnapshotIn) (*mcp.CallToolResult, any, error) {
		snap, err := d.Snapshot.Take(ctx)
		if err != nil {
			return nil, nil, err
		}
		return nil, snap, nil
	})

	mcp.AddTool(s, &mcp.Tool{Name: "list_process_events", Annotations: ro,
		Description: `Process events (exits, crashes, planned stops…) newest first: {"events":[…]}.`,
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in listProcessEventsIn) (*mcp.CallToolResult, any, error) {
		list, _, err := d.Events.List(ctx, events.ListParams{Agent: in.Agent, Undelivered: in.Undelivered, Limit: in.Limit})
		if err != nil {
			return nil, nil, err
		}
		if list == nil {
			list = []*vigiltype.ProcessEvent{}
		}
		return nil, map[string]any{"events": list}, nil
	})
	return s
}

// Handler serves s over streamable HTTP (mounted at /mcp by the daemon).
func Handler(s *mcp.Server) http.Handler {
	// Stateless with JSON responses: every tool is a read that answers at once,
	// and no stream outlives the API server's write timeout.
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
}
