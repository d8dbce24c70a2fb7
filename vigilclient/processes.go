package vigilclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// Instance is the credential of one registered process instance: its id and
// the instance token the server issued at registration. Every write made on
// behalf of the instance (liveness heartbeat, exit, claim and lease calls)
// carries it (DESIGN L2). String and LogValue show the id only, so the token
// does not end up in logs.
type Instance struct {
	ID    string
	Token string
}

// String returns the instance id.
func (i Instance) String() string { return i.ID }

// LogValue logs the instance id only.
func (i Instance) LogValue() slog.Value { return slog.StringValue(i.ID) }

// Lease returns the lease i holds on t after claiming it: the task id and
// t's lease_epoch, the fencing token every later call on the task carries
// (DESIGN T2).
func (i Instance) Lease(t *vigiltype.Task) Lease {
	return Lease{Instance: i, TaskID: t.TaskID, Epoch: t.LeaseEpoch}
}

// Registration is the answer to RegisterProcess: the new process row and
// the instance token that authenticates the instance's later writes. Keep
// the token secret; it is shown once.
type Registration struct {
	vigiltype.Process
	InstanceToken string `json:"instance_token"`
}

// Instance returns the credential for the registered instance.
func (r *Registration) Instance() Instance {
	return Instance{ID: r.InstanceID, Token: r.InstanceToken}
}

// RegisterParams describes a starting process (POST /v1/processes).
type RegisterParams struct {
	// ProcessKind: 1–128 chars of [A-Za-z0-9_.-].
	ProcessKind string
	// Hostname: at most 255 chars.
	Hostname string
	// PID: > 0, usually os.Getpid().
	PID int
	// LivenessInterval: how often the instance promises a liveness
	// heartbeat; > 0 and at most 24h. Sent in seconds. The server shows the
	// instance stopped once 3× this passes without one (DESIGN L3).
	LivenessInterval time.Duration
}

// RegisterProcess registers a new process instance (DESIGN L2): the server
// assigns a fresh instance_id and sets started_at = last_heartbeat_at = its
// now. Errors: ErrInvalid (a field breaks a rule), ErrUnauthorized.
func (c *Client) RegisterProcess(ctx context.Context, p RegisterParams) (*Registration, error) {
	body := map[string]any{
		"process_kind":        p.ProcessKind,
		"hostname":            p.Hostname,
		"pid":                 p.PID,
		"liveness_interval_s": p.LivenessInterval.Seconds(),
	}
	var out Registration
	if _, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/processes", body: body}, &out); err != nil {
		return nil, fmt.Errorf("register %s process: %w", p.ProcessKind, err)
	}
	if out.InstanceID == "" || out.InstanceToken == "" {
		return nil, fmt.Errorf("register %s process: answer lacks instance_id or instance_token", p.ProcessKind)
	}
	return &out, nil
}

// ProcessHeartbeat sends one liveness heartbeat for inst: the server sets
// last_heartbeat_at to its now (DESIGN L2). It returns the row when the
// server sends it back (nil otherwise). Errors: ErrNotFound,
// ErrInvalidToken, ErrInstanceExited.
func (c *Client) ProcessHeartbeat(ctx context.Context, inst Instance) (*vigiltype.Process, error) {
	return c.processWrite(ctx, inst, "heartbeat")
}

// ProcessExit records a clean exit of inst: it shows stopped at once and a
// task it still holds is reclaimed on the server's next sweep. Marking an
// exited instance again is not an error. Errors: ErrNotFound, ErrInvalidToken.
func (c *Client) ProcessExit(ctx context.Context, inst Instance) (*vigiltype.Process, error) {
	return c.processWrite(ctx, inst, "exit")
}

func (c *Client) processWrite(ctx context.Context, inst Instance, verb string) (*vigiltype.Process, error) {
	var out vigiltype.Process
	req := request{method: http.MethodPost, path: "/v1/processes/" + url.PathEscape(inst.ID) + "/" + verb, instance: inst.Token}
	if _, err := c.do(ctx, req, &out); err != nil {
		return nil, fmt.Errorf("%s of instance %s: %w", verb, inst.ID, err)
	}
	if out.InstanceID == "" {
		return nil, nil
	}
	return &out, nil
}

// ListProcessesParams filters GET /v1/processes; zero fields do not filter.
type ListProcessesParams struct {
	Kind   string
	Host   string
	Status vigiltype.ProcessStatus // ProcessAlive, ProcessStopped or "" for both
	Limit  int                     // 0: the server's default (50); at most 1000
	Cursor string                  // ProcessPage.NextCursor of the previous page
	// StartedWithin, when positive, keeps only the instances started within
	// this long before the server's now (sent in seconds): "registered
	// since I launched it", asked without comparing this host's clock with
	// the server's (DESIGN L10).
	StartedWithin time.Duration
}

// ProcessPage is one page of process instances, newest first (started_at,
// then instance_id, descending). NextCursor is "" on the last page.
type ProcessPage struct {
	Processes  []vigiltype.Process `json:"processes"`
	NextCursor string              `json:"next_cursor"`
}

// ListProcesses returns one page of process instances with their status
// computed by the server at read time (DESIGN L3, L4).
func (c *Client) ListProcesses(ctx context.Context, p ListProcessesParams) (*ProcessPage, error) {
	q := url.Values{}
	setIf(q, "kind", p.Kind)
	setIf(q, "host", p.Host)
	setIf(q, "status", string(p.Status))
	setIf(q, "cursor", p.Cursor)
	if p.Limit > 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	if p.StartedWithin > 0 {
		q.Set("started_within_s", strconv.FormatFloat(p.StartedWithin.Seconds(), 'f', -1, 64))
	}
	var out struct {
		Processes  []vigiltype.Process `json:"processes"`
		NextCursor *string             `json:"next_cursor"`
	}
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/processes", query: q}, &out); err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	return &ProcessPage{Processes: out.Processes, NextCursor: deref(out.NextCursor)}, nil
}

// GetProcess returns one process instance. Errors: ErrNotFound.
func (c *Client) GetProcess(ctx context.Context, instanceID string) (*vigiltype.Process, error) {
	var out vigiltype.Process
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/processes/" + url.PathEscape(instanceID)}, &out); err != nil {
		return nil, fmt.Errorf("get process %s: %w", instanceID, err)
	}
	return &out, nil
}

// ProcessStatus returns the most recently started instance of kind (DESIGN
// L4). Errors: ErrNotFound when the kind has never registered.
func (c *Client) ProcessStatus(ctx context.Context, kind string) (*vigiltype.Process, error) {
	var out vigiltype.Process
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/process-status/" + url.PathEscape(kind)}, &out); err != nil {
		return nil, fmt.Errorf("status of kind %s: %w", kind, err)
	}
	return &out, nil
}

// Prune deletes stopped instances whose last heartbeat is older than
// olderThan and that hold no task (DESIGN L7), and returns how many it
// deleted. olderThan is sent in seconds.
func (c *Client) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	var out struct {
		Deleted int64 `json:"deleted"`
	}
	body := map[string]any{"older_than_s": olderThan.Seconds()}
	if _, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/processes/prune", body: body}, &out); err != nil {
		return 0, fmt.Errorf("prune processes older than %s: %w", olderThan, err)
	}
	return out.Deleted, nil
}

// Health checks GET /healthz; nil means the server answered "ok".
func (c *Client) Health(ctx context.Context) error {
	var out struct {
		Status string `json:"status"`
	}
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/healthz"}, &out); err != nil {
		return fmt.Errorf("health: %w", err)
	}
	if out.Status != "ok" {
		return errors.New("health: server status is " + strconv.Quote(out.Status))
	}
	return nil
}

func setIf(q url.Values, k, v string) {
	if v != "" {
		q.Set(k, v)
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
