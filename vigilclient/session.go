package vigilclient

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// HeartbeatSchemaV2 is the lease heartbeat schema that carries activity_at
// (DESIGN T4). A heartbeat without schema_version is v1.
const HeartbeatSchemaV2 = 2

// TaskHeartbeatV2 renews lease l with a schema_version 2 heartbeat carrying
// activityAt, the time of the holder's last evidence of progress (DESIGN
// T4, H3): the server records it as last_activity_at, apart from
// last_heartbeat_at. activityAt must not be in the future by the server's
// clock nor before the claim (ErrInvalid); it is sent in UTC with
// millisecond precision. Errors as TaskHeartbeat.
func (c *Client) TaskHeartbeatV2(ctx context.Context, l Lease, activityAt time.Time) (*vigiltype.Task, error) {
	return c.leaseCall(ctx, l, "heartbeat", map[string]any{
		"schema_version": HeartbeatSchemaV2,
		"activity_at":    activityAt.UTC().Format("2006-01-02T15:04:05.000Z07:00"),
	})
}

// TaskHeartbeatAge renews l with a v2 heartbeat whose activity is given as
// its age, measured on this host's own clock (activity_age_ms, DESIGN T7):
// the server places the activity at its now − age, so this host's clock
// being off does not matter. Errors as TaskHeartbeat; ErrInvalid from a
// server that predates activity_age_ms (send TaskHeartbeatV2 then).
func (c *Client) TaskHeartbeatAge(ctx context.Context, l Lease, age time.Duration) (*vigiltype.Task, error) {
	return c.leaseCall(ctx, l, "heartbeat", map[string]any{
		"schema_version":  HeartbeatSchemaV2,
		"activity_age_ms": max(age, 0).Milliseconds(),
	})
}

// ClaimByID claims the scheduled task taskID for inst (POST /v1/tasks/claim
// with task_id), for a session that was told which task to work on. The
// returned task is running under a fresh lease: use inst.Lease(task).
// Errors: ErrNotFound (no such task or instance), an *APIError with Code
// CodeNotClaimable (409) when the task is not claimable now,
// ErrInvalidToken, ErrInstanceExited, ErrInstanceStopped.
func (c *Client) ClaimByID(ctx context.Context, inst Instance, taskID int64) (*vigiltype.Task, error) {
	body := map[string]any{"instance_id": inst.ID, "task_id": taskID}
	var out vigiltype.Task
	status, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/tasks/claim", instance: inst.Token, body: body}, &out)
	if err != nil {
		return nil, fmt.Errorf("claim task %d for instance %s: %w", taskID, inst.ID, err)
	}
	if status == http.StatusNoContent || out.TaskID == 0 {
		return nil, fmt.Errorf("claim task %d for instance %s: the server claimed nothing", taskID, inst.ID)
	}
	return &out, nil
}

// HeartbeatVersions is the answer of GET /v1/heartbeat-versions: per host,
// which lease heartbeat schema versions it sent within Window (the "all
// hosts emit v2" check of DESIGN T4).
type HeartbeatVersions struct {
	Window  time.Duration          `json:"-"`
	WindowS float64                `json:"window_s"`
	Hosts   []HostHeartbeatVersion `json:"hosts"`
}

// HostHeartbeatVersion is one (host, schema version) pair: when that host
// last sent a heartbeat of that version and how many it sent in the window.
type HostHeartbeatVersion struct {
	Hostname      string    `json:"hostname"`
	SchemaVersion int       `json:"schema_version"`
	LastSentAt    time.Time `json:"last_sent_at"`
	Heartbeats    int64     `json:"heartbeats"`
}

// HeartbeatVersions returns, per host, the lease heartbeat schema versions
// sent in the last window (0: the server's default), sent in whole seconds.
func (c *Client) HeartbeatVersions(ctx context.Context, window time.Duration) (*HeartbeatVersions, error) {
	q := url.Values{}
	if window > 0 {
		q.Set("window_s", strconv.FormatInt(int64(window.Round(time.Second)/time.Second), 10))
	}
	var out HeartbeatVersions
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/heartbeat-versions", query: q}, &out); err != nil {
		return nil, fmt.Errorf("heartbeat versions: %w", err)
	}
	out.Window = time.Duration(out.WindowS * float64(time.Second))
	return &out, nil
}

// CutoverVerdict says whether the activity-only cutover (seed 002, phase 3;
// `--lease-expiry activity-only`, DESIGN T6) is safe on the evidence of one
// HeartbeatVersions answer: every host that sent lease heartbeats in the
// window sent v2 only.
type CutoverVerdict struct {
	// Safe is true when at least one host sent heartbeats and none sent v1.
	Safe bool `json:"safe_to_cut_over"`
	// Hosts counts the hosts that sent lease heartbeats in the window.
	Hosts int `json:"hosts"`
	// V1Hosts are the hosts that still sent v1, sorted.
	V1Hosts []string `json:"v1_hosts"`
	// Message is the verdict in one line, as `vigil heartbeat versions`
	// prints it.
	Message string `json:"message"`
}

// Verdict judges v for the activity-only cutover (see CutoverVerdict).
func (v *HeartbeatVersions) Verdict() CutoverVerdict {
	hosts := map[string]bool{}
	v1 := map[string]bool{}
	for _, h := range v.Hosts {
		hosts[h.Hostname] = true
		if h.SchemaVersion < 2 && h.Heartbeats > 0 {
			v1[h.Hostname] = true
		}
	}
	out := CutoverVerdict{Hosts: len(hosts), V1Hosts: make([]string, 0, len(v1))}
	for h := range v1 {
		out.V1Hosts = append(out.V1Hosts, h)
	}
	slices.Sort(out.V1Hosts)
	window := time.Duration(v.WindowS * float64(time.Second)).String()
	switch {
	case len(hosts) == 0:
		out.Message = "no lease heartbeats in the last " + window + ": nothing to judge the cutover by"
	case len(v1) == 0:
		out.Safe = true
		out.Message = fmt.Sprintf("all %d hosts sent v2 only in the last %s: safe to cut over (--lease-expiry activity-only)", len(hosts), window)
	default:
		out.Message = fmt.Sprintf("%d of %d hosts still send v1 (%s) in the last %s: not safe to cut over",
			len(v1), len(hosts), strings.Join(out.V1Hosts, ", "), window)
	}
	return out
}
