package vigilclient

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// Lease names a held lease: the holder instance, the task and the
// lease_epoch returned by the claim (DESIGN T2). Every call on a claimed
// task carries it; the server refuses a stale epoch with 409 (ErrStaleEpoch)
// and changes nothing. Build one with Instance.Lease.
type Lease struct {
	Instance Instance
	TaskID   int64
	Epoch    int64
}

// EnqueueParams describes a new task (POST /v1/tasks, DESIGN T1). Zero
// fields take the server's defaults.
type EnqueueParams struct {
	// TaskType: required; 1–128 chars of [A-Za-z0-9_.-].
	TaskType string
	// Payload is marshalled with encoding/json (pass a json.RawMessage to
	// send bytes as they are); nil sends none and the server stores {}.
	Payload any
	// MaxAttempts: handler failures before dead_letter; 0 = server default
	// (5), else 1–1000.
	MaxAttempts int
	// MaxReclaims: leases taken back from a dead or silent holder before
	// dead_letter; nil = server default (3), else 0–1000 (new(0) for none).
	MaxReclaims *int
	// LeaseTimeout: this task's lease window; 0 = the server's
	// --lease-timeout (default 5 min), else 1s–24h. Sent in seconds.
	LeaseTimeout time.Duration
	// Delay: the task is claimable this long after enqueue. Sent in seconds.
	Delay time.Duration
	// ActivityGated marks work whose holder sends v2 (activity) heartbeats:
	// without LeaseTimeout its lease window is 30 min instead of the
	// server's (DESIGN T4).
	ActivityGated bool
}

// Enqueue adds a scheduled task to the outbox. Errors: ErrInvalid.
func (c *Client) Enqueue(ctx context.Context, p EnqueueParams) (*vigiltype.Task, error) {
	body := map[string]any{"task_type": p.TaskType}
	if p.Payload != nil {
		body["payload"] = p.Payload
	}
	if p.MaxAttempts != 0 {
		body["max_attempts"] = p.MaxAttempts
	}
	if p.MaxReclaims != nil {
		body["max_reclaims"] = *p.MaxReclaims
	}
	if p.LeaseTimeout != 0 {
		body["lease_timeout_s"] = p.LeaseTimeout.Seconds()
	}
	if p.Delay != 0 {
		body["delay_s"] = p.Delay.Seconds()
	}
	if p.ActivityGated {
		body["activity_gated"] = true
	}
	var out vigiltype.Task
	if _, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/tasks", body: body}, &out); err != nil {
		return nil, fmt.Errorf("enqueue %s task: %w", p.TaskType, err)
	}
	return &out, nil
}

// ListTasksParams filters GET /v1/tasks; zero fields do not filter.
type ListTasksParams struct {
	Status   vigiltype.TaskStatus
	TaskType string
	Limit    int    // 0: the server's default (50); at most 1000
	Cursor   string // TaskPage.NextCursor of the previous page
}

// TaskPage is one page of tasks, highest id first. NextCursor is "" on the
// last page.
type TaskPage struct {
	Tasks      []vigiltype.Task `json:"tasks"`
	NextCursor string           `json:"next_cursor"`
}

// ListTasks returns one page of tasks.
func (c *Client) ListTasks(ctx context.Context, p ListTasksParams) (*TaskPage, error) {
	q := url.Values{}
	setIf(q, "status", string(p.Status))
	setIf(q, "type", p.TaskType)
	setIf(q, "cursor", p.Cursor)
	if p.Limit > 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	var out struct {
		Tasks      []vigiltype.Task `json:"tasks"`
		NextCursor *string          `json:"next_cursor"`
	}
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/tasks", query: q}, &out); err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	return &TaskPage{Tasks: out.Tasks, NextCursor: deref(out.NextCursor)}, nil
}

// GetTask returns one task. Errors: ErrNotFound.
func (c *Client) GetTask(ctx context.Context, taskID int64) (*vigiltype.Task, error) {
	var out vigiltype.Task
	if _, err := c.do(ctx, request{method: http.MethodGet, path: taskPath(taskID, "")}, &out); err != nil {
		return nil, fmt.Errorf("get task %d: %w", taskID, err)
	}
	return &out, nil
}

// Claim atomically takes the oldest claimable task of one of taskTypes for
// inst (DESIGN T2). The returned task is running under a fresh lease: use
// inst.Lease(task) for every later call on it. It returns nil, nil when
// nothing is claimable (204). Errors: ErrInvalid, ErrNotFound (no such
// instance), ErrInvalidToken, ErrInstanceExited.
func (c *Client) Claim(ctx context.Context, inst Instance, taskTypes []string) (*vigiltype.Task, error) {
	body := map[string]any{"instance_id": inst.ID, "task_types": taskTypes}
	var out vigiltype.Task
	status, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/tasks/claim", instance: inst.Token, body: body}, &out)
	if err != nil {
		return nil, fmt.Errorf("claim %v for instance %s: %w", taskTypes, inst.ID, err)
	}
	if status == http.StatusNoContent || out.TaskID == 0 {
		return nil, nil
	}
	return &out, nil
}

// TaskHeartbeat renews lease l (DESIGN T3): the server sets
// last_heartbeat_at = now and lease_expires_at = now + the lease window. It
// returns the task as the server sends it back (nil if it sends no body).
// Errors: ErrStaleEpoch (the lease is no longer held: do not retry),
// ErrNotFound, ErrInvalidToken.
func (c *Client) TaskHeartbeat(ctx context.Context, l Lease) (*vigiltype.Task, error) {
	return c.leaseCall(ctx, l, "heartbeat", nil)
}

// Complete finishes the task held under l with result, marshalled with
// encoding/json (nil stores null; pass a json.RawMessage to send bytes as
// they are). Errors as TaskHeartbeat.
func (c *Client) Complete(ctx context.Context, l Lease, result any) (*vigiltype.Task, error) {
	return c.leaseCall(ctx, l, "complete", map[string]any{"result": result})
}

// Fail records a handler failure with message (required) for the task held
// under l: attempts + 1, then back to scheduled after a backoff, or
// dead_letter at max_attempts. retryAfter > 0 replaces the server's backoff
// (2s doubling, capped at 10 min); it is sent in seconds. Errors as
// TaskHeartbeat.
func (c *Client) Fail(ctx context.Context, l Lease, message string, retryAfter time.Duration) (*vigiltype.Task, error) {
	extra := map[string]any{"error": message}
	if retryAfter > 0 {
		extra["retry_after_s"] = retryAfter.Seconds()
	}
	return c.leaseCall(ctx, l, "fail", extra)
}

// Release gives the task held under l back: scheduled now, no attempt
// counted. Errors as TaskHeartbeat.
func (c *Client) Release(ctx context.Context, l Lease) (*vigiltype.Task, error) {
	return c.leaseCall(ctx, l, "release", nil)
}

func (c *Client) leaseCall(ctx context.Context, l Lease, verb string, extra map[string]any) (*vigiltype.Task, error) {
	body := map[string]any{"instance_id": l.Instance.ID, "lease_epoch": l.Epoch}
	for k, v := range extra {
		body[k] = v
	}
	var out vigiltype.Task
	req := request{method: http.MethodPost, path: taskPath(l.TaskID, verb), instance: l.Instance.Token, body: body}
	if _, err := c.do(ctx, req, &out); err != nil {
		return nil, fmt.Errorf("%s task %d at epoch %d: %w", verb, l.TaskID, l.Epoch, err)
	}
	if out.TaskID == 0 {
		return nil, nil
	}
	return &out, nil
}

// Sweepers returns the status of the server's background loops, in the
// list_agents / agent_status shape (DESIGN §7).
func (c *Client) Sweepers(ctx context.Context) ([]vigiltype.Sweeper, error) {
	var out struct {
		Sweepers []vigiltype.Sweeper `json:"sweepers"`
	}
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/sweepers"}, &out); err != nil {
		return nil, fmt.Errorf("list sweepers: %w", err)
	}
	return out.Sweepers, nil
}

func taskPath(id int64, verb string) string {
	p := "/v1/tasks/" + strconv.FormatInt(id, 10)
	if verb != "" {
		p += "/" + verb
	}
	return p
}
