package vigilclient

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// AgentParams is a whole agent registry record (DESIGN R1).
type AgentParams struct {
	Name     string
	Function string
	TickCron string // 5-field cron, a descriptor (@hourly), or ""
	Config   any    // opaque; marshalled to JSON; nil is null
}

// RegisterAgent writes a registry record unconditionally: an existing one
// of that name is replaced (created_at, status and config reset). Errors:
// ErrInvalid.
func (c *Client) RegisterAgent(ctx context.Context, p AgentParams) (*vigiltype.Agent, error) {
	body := map[string]any{"name": p.Name, "function": p.Function, "tick_cron": p.TickCron, "config": p.Config}
	var out vigiltype.Agent
	if _, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/agents", body: body}, &out); err != nil {
		return nil, fmt.Errorf("register agent %s: %w", p.Name, err)
	}
	return &out, nil
}

// ListAgents returns every registry record, stopped ones included, oldest first.
func (c *Client) ListAgents(ctx context.Context) ([]vigiltype.Agent, error) {
	var out struct {
		Agents []vigiltype.Agent `json:"agents"`
	}
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/agents"}, &out); err != nil {
		return nil, fmt.Errorf("list agents: %w", err)
	}
	return out.Agents, nil
}

// GetAgent returns one registry record. Errors: ErrNotFound.
func (c *Client) GetAgent(ctx context.Context, name string) (*vigiltype.Agent, error) {
	var out vigiltype.Agent
	if _, err := c.do(ctx, request{method: http.MethodGet, path: agentPath(name, "")}, &out); err != nil {
		return nil, fmt.Errorf("get agent %s: %w", name, err)
	}
	return &out, nil
}

// AgentUpdate is a partial update of a record read at Version; nil fields
// are left as they are.
type AgentUpdate struct {
	Version  int64
	Function *string
	TickCron *string
	Config   json.RawMessage
}

// UpdateAgent changes the given fields if the record is still at
// u.Version (compare-and-swap). Errors: ErrConflict (the record changed:
// read it again), ErrNotFound, ErrInvalid.
func (c *Client) UpdateAgent(ctx context.Context, name string, u AgentUpdate) (*vigiltype.Agent, error) {
	body := map[string]any{"version": u.Version}
	if u.Function != nil {
		body["function"] = *u.Function
	}
	if u.TickCron != nil {
		body["tick_cron"] = *u.TickCron
	}
	if u.Config != nil {
		body["config"] = u.Config
	}
	var out vigiltype.Agent
	if _, err := c.do(ctx, request{method: http.MethodPatch, path: agentPath(name, ""), body: body}, &out); err != nil {
		return nil, fmt.Errorf("update agent %s: %w", name, err)
	}
	return &out, nil
}

// MarkAgent sets a record's declared status: vigiltype.AgentStopped
// (stopped_at = now) or vigiltype.AgentActive. Errors: ErrNotFound.
func (c *Client) MarkAgent(ctx context.Context, name string, status vigiltype.AgentStatus) (*vigiltype.Agent, error) {
	verb := "mark-active"
	if status == vigiltype.AgentStopped {
		verb = "mark-stopped"
	}
	var out vigiltype.Agent
	if _, err := c.do(ctx, request{method: http.MethodPost, path: agentPath(name, verb)}, &out); err != nil {
		return nil, fmt.Errorf("%s agent %s: %w", verb, name, err)
	}
	return &out, nil
}

// PlannedStop records that agent is stopped on purpose: its exits within
// ttl (0: the server's 120s) are written suppressed (DESIGN E2).
func (c *Client) PlannedStop(ctx context.Context, agent, reason string, ttl time.Duration) (*vigiltype.PlannedStop, error) {
	body := map[string]any{"reason": reason}
	if ttl != 0 {
		body["ttl_s"] = ttl.Seconds()
	}
	var out vigiltype.PlannedStop
	if _, err := c.do(ctx, request{method: http.MethodPost, path: agentPath(agent, "planned-stop"), body: body}, &out); err != nil {
		return nil, fmt.Errorf("planned stop of agent %s: %w", agent, err)
	}
	return &out, nil
}

// EventParams is one process event as a supervisor reports it; the server
// stamps its time.
type EventParams struct {
	Agent       string
	Kind        vigiltype.EventKind
	ExitCode    *int
	Signal      string
	RunDuration time.Duration // sent in milliseconds
	StderrTail  string
	Detail      any // marshalled to JSON; nil is null
	// Launched is when the process the event is about was launched, read
	// from this host's clock (time.Now() at the launch, monotonic reading
	// included); zero when not known. It is sent as launch_age_ms, its age
	// at the call: the server places the launch on its own clock, never
	// comparing this host's clock with its own (DESIGN L10), and a planned
	// stop covers only the processes launched before it (E2).
	Launched time.Time
}

// RecordEvent appends a process event (DESIGN E1). Errors: ErrInvalid.
func (c *Client) RecordEvent(ctx context.Context, p EventParams) (*vigiltype.ProcessEvent, error) {
	body := map[string]any{
		"agent": p.Agent, "kind": p.Kind, "exit_code": p.ExitCode, "signal": p.Signal,
		"run_duration_ms": p.RunDuration.Milliseconds(), "stderr_tail": p.StderrTail, "detail": p.Detail,
	}
	if !p.Launched.IsZero() {
		body["launch_age_ms"] = max(0, time.Since(p.Launched).Milliseconds())
	}
	var out vigiltype.ProcessEvent
	if _, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/events", body: body}, &out); err != nil {
		return nil, fmt.Errorf("record %s event of agent %s: %w", p.Kind, p.Agent, err)
	}
	return &out, nil
}

// ListEventsParams filters GET /v1/events; zero fields do not filter.
type ListEventsParams struct {
	Agent       string
	Undelivered bool
	Limit       int
	Cursor      string
}

// EventPage is one page of events, newest first.
type EventPage struct {
	Events     []vigiltype.ProcessEvent `json:"events"`
	NextCursor string                   `json:"next_cursor"`
}

// ListEvents returns one page of process events, newest first.
func (c *Client) ListEvents(ctx context.Context, p ListEventsParams) (*EventPage, error) {
	q := url.Values{}
	setIf(q, "agent", p.Agent)
	setIf(q, "cursor", p.Cursor)
	if p.Undelivered {
		q.Set("undelivered", "true")
	}
	if p.Limit != 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	var out struct {
		Events     []vigiltype.ProcessEvent `json:"events"`
		NextCursor *string                  `json:"next_cursor"`
	}
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/events", query: q}, &out); err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	return &EventPage{Events: out.Events, NextCursor: deref(out.NextCursor)}, nil
}

// AckEvent marks an event delivered with kind ("" is "acknowledged"); a
// second ack keeps the first. Errors: ErrNotFound.
func (c *Client) AckEvent(ctx context.Context, eventID int64, kind string) (*vigiltype.ProcessEvent, error) {
	body := map[string]any{}
	if kind != "" {
		body["delivery_kind"] = kind
	}
	var out vigiltype.ProcessEvent
	path := "/v1/events/" + strconv.FormatInt(eventID, 10) + "/ack"
	if _, err := c.do(ctx, request{method: http.MethodPost, path: path, body: body}, &out); err != nil {
		return nil, fmt.Errorf("ack event %d: %w", eventID, err)
	}
	return &out, nil
}

func agentPath(name, verb string) string {
	p := "/v1/agents/" + url.PathEscape(name)
	if verb != "" {
		p += "/" + verb
	}
	return p
}

// StalledTasks lists the running tasks of agent kind that started more than
// after ago (0: the server's 30 min), oldest first (DESIGN S4).
func (c *Client) StalledTasks(ctx context.Context, kind string, after time.Duration) ([]vigiltype.Task, error) {
	q := url.Values{"kind": {kind}}
	if after != 0 {
		q.Set("after_s", strconv.FormatFloat(after.Seconds(), 'f', -1, 64))
	}
	var out struct {
		Tasks []vigiltype.Task `json:"tasks"`
	}
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/tasks/stalled", query: q}, &out); err != nil {
		return nil, fmt.Errorf("stalled tasks of %s: %w", kind, err)
	}
	return out.Tasks, nil
}

// ReclaimStalled takes back a stalled task if it still runs at epoch
// (compare-and-swap). Errors: ErrStaleEpoch (it moved on: leave it),
// ErrNotFound, ErrInvalid.
func (c *Client) ReclaimStalled(ctx context.Context, taskID, epoch int64, reason string) (*vigiltype.Task, error) {
	body := map[string]any{"lease_epoch": epoch, "reason": reason}
	var out vigiltype.Task
	if _, err := c.do(ctx, request{method: http.MethodPost, path: taskPath(taskID, "reclaim"), body: body}, &out); err != nil {
		return nil, fmt.Errorf("reclaim stalled task %d: %w", taskID, err)
	}
	return &out, nil
}

// ActivePlannedStop returns agent's planned stop marker if one covers now.
// Errors: ErrNotFound when none does.
func (c *Client) ActivePlannedStop(ctx context.Context, agent string) (*vigiltype.PlannedStop, error) {
	var out vigiltype.PlannedStop
	if _, err := c.do(ctx, request{method: http.MethodGet, path: agentPath(agent, "planned-stop")}, &out); err != nil {
		return nil, fmt.Errorf("planned stop of agent %s: %w", agent, err)
	}
	return &out, nil
}
