// Package vigiltype holds the public types shared by vigil's server, its
// storage backends and its Go client: process instances, tasks with their
// leases, sweeper status, and the sentinel errors every layer maps to.
//
// It imports only the standard library so that agent programs can depend on
// it without pulling in the server.
package vigiltype

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ProcessStatus is the liveness status of a process instance. It is computed
// at read time from the server's clock and never stored (DESIGN L3).
type ProcessStatus string

const (
	// ProcessAlive means now - last_heartbeat_at <= AliveWindowFactor × liveness_interval_s
	// and the instance has not reported a clean exit.
	ProcessAlive ProcessStatus = "alive"
	// ProcessStopped means the alive window has passed, or the instance exited.
	ProcessStopped ProcessStatus = "stopped"
)

// AliveWindowFactor is how many liveness intervals may pass without a
// heartbeat before an instance shows stopped (DESIGN L3: 3×).
const AliveWindowFactor = 3

// Valid reports whether s is a known process status.
func (s ProcessStatus) Valid() bool { return s == ProcessAlive || s == ProcessStopped }

// Process is one OS process instance (DESIGN L1). A restart makes a new row
// with a fresh InstanceID; rows are history and are only removed by prune.
type Process struct {
	InstanceID        string        `json:"instance_id"`
	ProcessKind       string        `json:"process_kind"`
	Hostname          string        `json:"hostname"`
	PID               int           `json:"pid"`
	LivenessIntervalS float64       `json:"liveness_interval_s"`
	StartedAt         time.Time     `json:"started_at"`
	LastHeartbeatAt   time.Time     `json:"last_heartbeat_at"`
	ExitedAt          *time.Time    `json:"exited_at,omitempty"`
	CurrentTaskID     *int64        `json:"current_task_id"`
	CurrentTaskType   *string       `json:"current_task_type"`
	Status            ProcessStatus `json:"status"`
	// GraceUntil is set while the instance is alive only by the store
	// outage grace (DESIGN L8): its own heartbeat window has passed, but the
	// store could not be written for a while, so it is not judged stopped
	// before this instant (one full alive window of writable store).
	GraceUntil *time.Time `json:"grace_until,omitempty"`
	// StatusReason says why Status is what it is when the heartbeat age
	// alone does not: the outage grace, or a last heartbeat dated in the
	// future (DESIGN L9). Empty otherwise.
	StatusReason string `json:"status_reason,omitempty"`
}

// FutureTolerance is how far ahead of the server's clock a stored time may
// be before it counts as not heard from (DESIGN L9): a last heartbeat dated
// more than this in the future (a restore from a host whose clock ran
// ahead, or a server clock stepped back) does not keep an instance alive.
const FutureTolerance = 5 * time.Second

// AliveUntil is the last instant at which the instance still counts as alive:
// last_heartbeat_at + AliveWindowFactor × liveness_interval_s.
func (p *Process) AliveUntil() time.Time {
	return p.LastHeartbeatAt.Add(AliveWindow(p.LivenessIntervalS))
}

// AliveWindow converts a liveness interval in seconds to the alive window
// (AliveWindowFactor × interval), rounded to the millisecond the stores keep.
func AliveWindow(livenessIntervalS float64) time.Duration {
	return (time.Duration(livenessIntervalS*AliveWindowFactor*1000) * time.Millisecond)
}

// SetStoredDeadline computes Status, GraceUntil and StatusReason at now
// from the alive_until a store read for p: the heartbeat's own window, or
// later while a store outage grace lasts (DESIGN L8). A last heartbeat
// dated more than FutureTolerance ahead of now is not heard from (L9): the
// instance is alive only up to the stored alive_until, which the store's
// pulse cuts to one alive window from when it saw the row, and its reason
// says so. Stores call it once per row they read.
func (p *Process) SetStoredDeadline(aliveUntil, now time.Time) {
	p.GraceUntil, p.StatusReason = nil, ""
	future := p.LastHeartbeatAt.After(now.Add(FutureTolerance))
	if p.ExitedAt == nil && (future || aliveUntil.After(p.AliveUntil())) && !now.After(aliveUntil) {
		until := aliveUntil
		p.GraceUntil = &until
	}
	p.Status = p.ComputeStatus(now)
	switch {
	case p.ExitedAt != nil:
	case future:
		p.StatusReason = fmt.Sprintf("last heartbeat dated %s, ahead of the server's clock (%s): not heard from since",
			p.LastHeartbeatAt.UTC().Format(time.RFC3339Nano), now.UTC().Format(time.RFC3339Nano))
		if p.GraceUntil != nil {
			p.StatusReason += "; judged by its heartbeats after " + p.GraceUntil.UTC().Format(time.RFC3339Nano)
		}
	case p.GraceUntil != nil && now.After(p.AliveUntil()):
		p.StatusReason = "store outage grace: heartbeats could not be written while the store was unavailable; " +
			"judged by its heartbeats again after " + p.GraceUntil.UTC().Format(time.RFC3339Nano)
	}
}

// ComputeStatus returns the status of p at now (DESIGN L3): alive while
// now is within the alive window of its last heartbeat, or up to
// GraceUntil (L8); stopped once exited or past both. A last heartbeat
// dated more than FutureTolerance ahead of now counts for nothing (L9):
// only GraceUntil can keep such an instance alive.
func (p *Process) ComputeStatus(now time.Time) ProcessStatus {
	deadline := p.AliveUntil()
	if p.LastHeartbeatAt.After(now.Add(FutureTolerance)) {
		deadline = time.Time{}
	}
	if p.GraceUntil != nil && p.GraceUntil.After(deadline) {
		deadline = *p.GraceUntil
	}
	if p.ExitedAt != nil || now.After(deadline) {
		return ProcessStopped
	}
	return ProcessAlive
}

// TaskStatus is the state of a task in the outbox (DESIGN T1).
type TaskStatus string

const (
	TaskScheduled  TaskStatus = "scheduled"   // waiting for run_after, then claimable
	TaskRunning    TaskStatus = "running"     // claimed under a lease
	TaskCompleted  TaskStatus = "completed"   // finished; result and completed_by set
	TaskDeadLetter TaskStatus = "dead_letter" // gave up: max_attempts failures or max_reclaims reclaims
)

// Valid reports whether s is a known task status.
func (s TaskStatus) Valid() bool {
	switch s {
	case TaskScheduled, TaskRunning, TaskCompleted, TaskDeadLetter:
		return true
	}
	return false
}

// Task is a unit of work in the outbox together with its current lease
// (DESIGN T1–T3).
//
// Attempts counts runs that ended in a handler failure (fail calls); Reclaims
// counts leases taken back from a holder that died or stopped renewing. Each
// has its own limit (MaxAttempts, MaxReclaims); passing either dead-letters
// the task with the reason in LastError.
type Task struct {
	TaskID      int64           `json:"task_id"`
	TaskType    string          `json:"task_type"`
	Payload     json.RawMessage `json:"payload"`
	Status      TaskStatus      `json:"status"`
	Attempts    int             `json:"attempts"`
	MaxAttempts int             `json:"max_attempts"`
	Reclaims    int             `json:"reclaims"`
	MaxReclaims int             `json:"max_reclaims"`
	// LeaseTimeoutS is this task's own lease window in seconds; 0 means the
	// server's --lease-timeout applies.
	LeaseTimeoutS   float64    `json:"lease_timeout_s"`
	LeaseOwner      *string    `json:"lease_owner"`
	LeaseEpoch      int64      `json:"lease_epoch"`
	LeaseExpiresAt  *time.Time `json:"lease_expires_at"`
	LastHeartbeatAt *time.Time `json:"last_heartbeat_at"`
	// LastActivityAt is the last evidence of progress: the claim, then the
	// latest activity_at of a v2 heartbeat (DESIGN T4). Kept apart from
	// LastHeartbeatAt.
	LastActivityAt *time.Time `json:"last_activity_at"`
	// HeartbeatSchemaVersion is the schema version of the last lease
	// heartbeat (1 or 2), 0 before the first.
	HeartbeatSchemaVersion int             `json:"heartbeat_schema_version"`
	StartedAt              *time.Time      `json:"started_at"`
	RunAfter               time.Time       `json:"run_after"`
	CreatedAt              time.Time       `json:"created_at"`
	UpdatedAt              time.Time       `json:"updated_at"`
	CompletedAt            *time.Time      `json:"completed_at"`
	Result                 json.RawMessage `json:"result"`
	CompletedBy            *string         `json:"completed_by"`
	LastError              *string         `json:"last_error"`
	// Stalled is computed on read, never stored (DESIGN T6): the task is
	// running, its lease is renewed (not expired), and its holder reports
	// activity (v2 heartbeats) but none newer than the server's activity
	// staleness bound — heartbeating without progress, apart from a holder
	// that stopped heartbeating (whose lease expires).
	Stalled bool `json:"stalled"`
}

// ActivityStalenessDefault is how old a running task's last activity may
// be before the task shows stalled (DESIGN T6; seed 002's 900s).
const ActivityStalenessDefault = 900 * time.Second

// ComputeStalled reports whether t is stalled at now under the staleness
// bound (see Task.Stalled). A task whose holder never sent a v2 heartbeat
// has no activity to judge and is never stalled.
func (t *Task) ComputeStalled(now time.Time, staleness time.Duration) bool {
	return t.Status == TaskRunning && t.HeartbeatSchemaVersion == 2 &&
		t.LastActivityAt != nil && now.Sub(*t.LastActivityAt) > staleness &&
		t.LeaseExpiresAt != nil && !now.After(*t.LeaseExpiresAt)
}

// Sweeper is the status of one background loop inside the server, in the
// list_agents / agent_status shape (DESIGN §7: kind "sweeper").
type Sweeper struct {
	Name              string     `json:"name"`
	Kind              string     `json:"kind"` // always "sweeper"
	IntervalS         float64    `json:"interval_s"`
	LastRunAt         *time.Time `json:"last_run_at"`
	LastResultCount   int        `json:"last_result_count"`
	LastRunDurationMS float64    `json:"last_run_duration_ms"`
	LastError         *string    `json:"last_error"`
}

// HeartbeatVersion is what one host sent of one heartbeat schema version
// (DESIGN T4 adoption view).
type HeartbeatVersion struct {
	Hostname      string    `json:"hostname"`
	SchemaVersion int       `json:"schema_version"`
	LastSentAt    time.Time `json:"last_sent_at"`
	// Heartbeats counts every lease heartbeat of this version from this host.
	Heartbeats int64 `json:"heartbeats"`
}

// AgentStatus is an agent's declared status in the registry: durable
// intent, never inferred from a live process (DESIGN R1, F2).
type AgentStatus string

const (
	AgentActive  AgentStatus = "active"  // should be running
	AgentStopped AgentStatus = "stopped" // stopped on purpose (stopped_at set)
)

// Agent is a registry record (DESIGN R1): a named, always-on worker. Its
// processes report Name as their kind.
type Agent struct {
	Name     string `json:"name"`
	Function string `json:"function"`
	// TickCron is a standard 5-field cron spec, or "" for none.
	TickCron string `json:"tick_cron"`
	// Config is opaque to vigil: the caller's construction details.
	Config    json.RawMessage `json:"config"`
	Status    AgentStatus     `json:"status"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
	StoppedAt *time.Time      `json:"stopped_at"`
	// Version grows with every write; an update names the version it read
	// (compare-and-swap) and fails with ErrConflict when it moved.
	Version int64 `json:"version"`
	// ConfigWrittenBy is the role of the token that last wrote Config
	// ("operator", "agent", "read"), "" when unknown (written before
	// roles, or without a config). A supervisor launches a registry
	// record's command only when it says "operator" (and the supervisor
	// was started with --allow-registered-launch).
	ConfigWrittenBy string `json:"config_written_by"`
}

// EventKind is the kind of a process event (DESIGN E1).
type EventKind string

const (
	EventExit           EventKind = "exit"            // the agent's process exited
	EventStallKill      EventKind = "stall_kill"      // killed for running a task past stall_after
	EventLaunchFailure  EventKind = "launch_failure"  // the command could not be started
	EventFlapping       EventKind = "flapping"        // too many exits in a window
	EventStartupTimeout EventKind = "startup_timeout" // no instance registered in time
)

// Valid reports whether k is a known event kind.
func (k EventKind) Valid() bool {
	switch k {
	case EventExit, EventStallKill, EventLaunchFailure, EventFlapping, EventStartupTimeout:
		return true
	}
	return false
}

// DeliverySuppressed is the delivery_kind of an event written while a
// planned stop covered it (DESIGN E2): delivered at once, nobody alerted.
const DeliverySuppressed = "suppressed"

// ProcessEvent is a durable record of an unexpected exit, a stall kill or a
// launch failure (DESIGN E1). DeliveredAt is set when a consumer (or a
// planned stop) has dealt with it.
type ProcessEvent struct {
	EventID       int64           `json:"event_id"`
	Agent         string          `json:"agent"`
	Kind          EventKind       `json:"kind"`
	At            time.Time       `json:"at"`
	ExitCode      *int            `json:"exit_code"`
	Signal        string          `json:"signal,omitempty"`
	RunDurationMS int64           `json:"run_duration_ms"`
	StderrTail    string          `json:"stderr_tail,omitempty"` // last lines of stderr
	Detail        json.RawMessage `json:"detail"`                // kind-specific, opaque
	DeliveredAt   *time.Time      `json:"delivered_at"`
	DeliveryKind  *string         `json:"delivery_kind"`
}

// PlannedStop says an operator stops an agent on purpose: until ExpiresAt,
// exits of the agent's processes that were running when it was written
// (CreatedAt) are written already delivered, delivery_kind "suppressed"; a
// process launched after it is not covered (DESIGN E2).
type PlannedStop struct {
	Agent     string    `json:"agent"`
	Reason    string    `json:"reason"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
	// AgeMS is how long before the read the marker was written, in
	// milliseconds of the server's clock (now - created_at, computed at
	// read time like a process's status; 0 in the answer to a write). A
	// supervisor places the marker on its own monotonic clock with it
	// rather than compare CreatedAt with its own clock (DESIGN L10).
	AgeMS int64 `json:"age_ms"`
}

// SweeperKind is the kind every Sweeper reports.
const SweeperKind = "sweeper"

// Sentinel errors. Stores, services and the HTTP client all return these
// (wrapped), so callers test with errors.Is whichever layer they talk to.
var (
	// ErrNotFound: no such process instance, task or kind. HTTP 404.
	ErrNotFound = errors.New("not found")
	// ErrStaleEpoch: the caller's lease_epoch is not the task's current
	// epoch, or the task is no longer running under the caller's lease
	// (it was reclaimed, completed or released). Nothing was changed. HTTP 409.
	ErrStaleEpoch = errors.New("stale lease epoch: the lease is no longer held")
	// ErrInvalidToken: the instance token does not match the instance. HTTP 403.
	ErrInvalidToken = errors.New("instance token does not match")
	// ErrForbidden: the bearer token's role may not make this call (an
	// agent or read token on an operator route, docs/security.md). HTTP 403.
	ErrForbidden = errors.New("forbidden: the token's role does not allow this call")
	// ErrInstanceExited: the instance already reported its exit. HTTP 409.
	ErrInstanceExited = errors.New("instance has exited")
	// ErrInstanceStopped: the instance missed its liveness heartbeats and
	// shows stopped, so it may not claim work until a heartbeat brings it
	// back. HTTP 409.
	ErrInstanceStopped = errors.New("instance is stopped: send a liveness heartbeat first")
	// ErrConflict: a compare-and-swap lost a race (the record's version
	// moved since it was read); nothing was written. HTTP 409.
	ErrConflict = errors.New("conflict: the record changed since it was read")
	// ErrNotClaimable: a claim by task id named a task that is not waiting
	// to be claimed (running, finished, or its run_after is later). HTTP 409.
	ErrNotClaimable = errors.New("task is not claimable")
	// ErrInvalid: the request broke a validation rule; the wrapping error
	// names the field. HTTP 400.
	ErrInvalid = errors.New("invalid input")
	// ErrUnauthorized: the server token is missing or wrong. HTTP 401.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrOutcomeConflict: a complete or fail repeated by the holder at the
	// epoch its lease ended with differs from the outcome stored then (a
	// different result, or a different error text); the wrapping
	// *OutcomeConflictError names the field. Nothing was written. The same
	// call repeated exactly answers with the stored task (DESIGN T8).
	// HTTP 409 outcome_conflict.
	ErrOutcomeConflict = errors.New("the task already holds a different outcome from this lease")
	// ErrUnavailable: the store cannot be reached (connection refused or
	// lost, the database shutting down or not accepting connections, a
	// disk I/O error, a lock held past the busy timeout). The call may
	// succeed if sent again later; whether a write landed is unknown, so
	// only calls that are safe to repeat should be. HTTP 503 unavailable,
	// with Retry-After.
	ErrUnavailable = errors.New("the store is unavailable")
)

// OutcomeConflictError is a repeated complete or fail that disagrees with
// the stored outcome in Field. It matches ErrOutcomeConflict with errors.Is.
type OutcomeConflictError struct {
	Field string
	Rule  string
}

func (e *OutcomeConflictError) Error() string { return e.Field + ": " + e.Rule }

// Is makes errors.Is(err, ErrOutcomeConflict) true for every OutcomeConflictError.
func (e *OutcomeConflictError) Is(target error) bool { return target == ErrOutcomeConflict }

// FieldError is a validation failure naming the field and the rule it broke.
// It matches ErrInvalid with errors.Is.
type FieldError struct {
	Field string
	Rule  string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Rule }

// Is makes errors.Is(err, ErrInvalid) true for every FieldError.
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

// Invalid returns a *FieldError for field breaking rule.
func Invalid(field, rule string) error { return &FieldError{Field: field, Rule: rule} }

// NameMaxLen is the longest process kind, task type or agent name accepted.
const NameMaxLen = 128

// CheckName validates a process kind, task type or agent name: 1 to
// NameMaxLen characters of [A-Za-z0-9_.-]. The error names field.
func CheckName(field, value string) error {
	if value == "" {
		return Invalid(field, "is required")
	}
	if len(value) > NameMaxLen {
		return Invalid(field, "must be at most 128 characters")
	}
	for _, r := range value {
		ok := r == '_' || r == '-' || r == '.' ||
			(r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9')
		if !ok {
			return Invalid(field, "may only contain letters, digits, '_', '-' and '.'")
		}
	}
	return nil
}

// JSONDepthMax is the deepest nesting of arrays and objects accepted in any
// JSON value vigil stores (payload, result, config, detail): deeper input is
// refused alike by every backend rather than by one of them.
const JSONDepthMax = 64

// CheckJSON validates an opaque JSON value: valid, at most maxBytes long and
// at most JSONDepthMax deep. The error names field.
func CheckJSON(field string, raw []byte, maxBytes int) error {
	if len(raw) > maxBytes {
		return Invalid(field, fmt.Sprintf("must be at most %d bytes of JSON", maxBytes))
	}
	if !json.Valid(raw) {
		return Invalid(field, "must be valid JSON")
	}
	if jsonDepth(raw) > JSONDepthMax {
		return Invalid(field, fmt.Sprintf("must not nest arrays and objects more than %d deep", JSONDepthMax))
	}
	return nil
}

// jsonDepth is the deepest nesting of valid JSON raw.
func jsonDepth(raw []byte) int {
	depth, deepest := 0, 0
	inString, escaped := false, false
	for _, c := range raw {
		switch {
		case inString && escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case inString:
		case c == '[' || c == '{':
			depth++
			deepest = max(deepest, depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	return deepest
}
