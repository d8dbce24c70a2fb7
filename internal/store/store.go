// Package store is vigil's storage seam: the one interface every backend
// implements (SQLite now, PostgreSQL next), its parameter structs, and the
// rules every backend follows.
//
// Rules for every backend (the conformance suite in storetest checks them):
//   - Time never comes from the database or the host clock inside a method:
//     every method that needs "now" takes it in its params (STYLE §4), and
//     every stored time is UTC with millisecond precision.
//   - "No rows" and refused writes map to vigiltype's sentinels: ErrNotFound,
//     ErrStaleEpoch, ErrInvalidToken, ErrInstanceExited, ErrOutcomeConflict.
//   - A write that changes a task under a lease repeats its whole predicate
//     (task id, status running, lease owner, epoch) in its WHERE clause, so a
//     task completed or re-claimed in between is left alone.
//   - Claims are atomic: two callers never receive the same task at one epoch.
package store

import (
	"context"
	"encoding/json"
	"time"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// Store is implemented by each backend. Method names are Noun+Verb so they
// sort by table.
type Store interface {
	// ProcessRegister inserts a new process instance with
	// started_at = last_heartbeat_at = Now (DESIGN L2).
	ProcessRegister(ctx context.Context, p ProcessRegisterParams) (*vigiltype.Process, error)
	// ProcessCheckToken returns nil if tokenHash is the instance's token hash,
	// ErrNotFound if there is no such instance, ErrInvalidToken otherwise.
	ProcessCheckToken(ctx context.Context, instanceID, tokenHash string) error
	// ProcessHeartbeat sets last_heartbeat_at = Now for an instance whose
	// token hash matches. ErrNotFound, ErrInvalidToken, ErrInstanceExited.
	ProcessHeartbeat(ctx context.Context, p ProcessHeartbeatParams) (*vigiltype.Process, error)
	// ProcessHeartbeatBatch records many liveness heartbeats in one
	// transaction (group commit): each item is written and answered as
	// ProcessHeartbeat would, result i answering item i. Items of one
	// instance with its token share one write at their latest Now (last
	// value wins) and the row as written. A refused item (ErrNotFound,
	// ErrInvalidToken, ErrInstanceExited in its result) changes nothing and
	// does not affect the others. The error is for the transaction as a
	// whole: when it is not nil nothing was written.
	ProcessHeartbeatBatch(ctx context.Context, items []ProcessHeartbeatParams) ([]ProcessHeartbeatResult, error)
	// ProcessMarkExited records a clean exit (exited_at = Now) so the instance
	// shows stopped at once; its current task fields are cleared. Marking an
	// already exited instance again is not an error.
	ProcessMarkExited(ctx context.Context, p ProcessMarkExitedParams) (*vigiltype.Process, error)
	// ProcessGet returns one instance with its status computed at Now.
	ProcessGet(ctx context.Context, instanceID string, now time.Time) (*vigiltype.Process, error)
	// ProcessLatest returns the most recently started instance of a kind
	// (DESIGN L4 process_status), ErrNotFound when the kind has none.
	ProcessLatest(ctx context.Context, kind string, now time.Time) (*vigiltype.Process, error)
	// ProcessList returns up to Limit instances newest first (started_at
	// desc, instance_id desc), strictly after the cursor when one is given.
	ProcessList(ctx context.Context, p ProcessListParams) ([]*vigiltype.Process, error)
	// ProcessCounts returns how many instances of each kind are alive and
	// stopped at now (for /metrics), ordered by kind then status; kinds
	// with no instances are absent.
	ProcessCounts(ctx context.Context, now time.Time) ([]ProcessCount, error)
	// ProcessPrune deletes stopped instances whose last heartbeat is before
	// Before and that hold no running task; it returns how many it deleted.
	ProcessPrune(ctx context.Context, p ProcessPruneParams) (int64, error)

	// TaskEnqueue inserts a scheduled task.
	TaskEnqueue(ctx context.Context, p TaskEnqueueParams) (*vigiltype.Task, error)
	// TaskGet returns one task, ErrNotFound when there is none.
	TaskGet(ctx context.Context, taskID int64) (*vigiltype.Task, error)
	// TaskList returns up to Limit tasks, newest (highest id) first,
	// strictly below BeforeID when it is non-zero.
	TaskList(ctx context.Context, p TaskListParams) ([]*vigiltype.Task, error)
	// TaskClaim atomically takes the oldest claimable task (status scheduled,
	// run_after <= Now, type in Types) — or, when TaskID is set, that task if
	// it is claimable (ErrNotFound when it does not exist, ErrNotClaimable
	// when it is not scheduled or its run_after is later) — for InstanceID:
	// status running, last_activity_at = Now,
	// lease_epoch + 1, lease_owner, started_at, last_heartbeat_at = Now,
	// lease_expires_at = Now + the task's window (or LeaseTimeout), and sets
	// the instance's current_task_id/type (DESIGN L6). It returns nil, nil
	// when nothing is claimable.
	TaskClaim(ctx context.Context, p TaskClaimParams) (*vigiltype.Task, error)
	// TaskClaimBatch takes up to Max claimable tasks of Types for
	// InstanceID in one transaction, in the order single claims would take
	// them (oldest run_after, then task id), and returns them in that
	// order; an empty slice when nothing is claimable. Each task is claimed
	// exactly as TaskClaim claims one (its own lease_epoch + 1, lease_owner,
	// started_at, …), concurrent batches never take the same task, and the
	// instance's current_task_id/type name the last task taken. ErrInvalid
	// (max_tasks) for a Max outside 1–TaskClaimBatchMax.
	TaskClaimBatch(ctx context.Context, p TaskClaimBatchParams) ([]*vigiltype.Task, error)
	// TaskHeartbeat renews a held lease (DESIGN T3, T4): last_heartbeat_at
	// = Now, heartbeat_schema_version = SchemaVersion, last_activity_at =
	// the later of its value and ActivityAt (v2), and lease_expires_at =
	// base + the task's window (or LeaseTimeout), where base is the new
	// last_activity_at when ExpireOnActivity (so a late, older ActivityAt
	// cannot shorten the lease), else Now. In the same transaction it counts the
	// heartbeat in heartbeat_versions under the holder's hostname and
	// SchemaVersion (last_sent_at = Now). ErrStaleEpoch when the lease is not
	// held at that epoch by that instance; ErrNotFound when there is no such
	// task.
	TaskHeartbeat(ctx context.Context, p TaskHeartbeatParams) (*vigiltype.Task, error)
	// TaskComplete finishes a held task with its result; completed_by is
	// the lease owner. Same errors as TaskHeartbeat, except for a repeat
	// (DESIGN T8, RepeatedComplete): when the lease already ended with a
	// complete by this instance at this epoch, the same result (as a JSON
	// value) answers with the task as stored and writes nothing, another
	// result is ErrOutcomeConflict naming "result".
	TaskComplete(ctx context.Context, p TaskCompleteParams) (*vigiltype.Task, error)
	// TaskCompleteBatch completes every item in one transaction, each checked and written exactly as TaskComplete; each item gets its own outcome (one stale item does not fail the others), in request order; an error only when the transaction itself fails (then nothing was written).
	TaskCompleteBatch(ctx context.Context, items []TaskCompleteParams) ([]TaskCompleteResult, error)
	// TaskFail counts a handler failure: attempts + 1, then back to
	// scheduled at RetryAt, or dead_letter when attempts reaches
	// max_attempts. failed_by = the lease owner, until the next claim.
	// Same errors as TaskHeartbeat, except for a repeat (DESIGN T8,
	// RepeatedFail): when the lease already ended with a fail by this
	// instance at this epoch, the same Error text answers with the task as
	// stored and writes (counts) nothing, another text is
	// ErrOutcomeConflict naming "error".
	TaskFail(ctx context.Context, p TaskFailParams) (*vigiltype.Task, error)
	// TaskRelease gives a held task back (scheduled, run_after = Now)
	// without counting an attempt. Same errors as TaskHeartbeat.
	TaskRelease(ctx context.Context, p TaskReleaseParams) (*vigiltype.Task, error)
	// TaskReclaim takes back leases whose holder is gone: every running task
	// whose lease_expires_at < Now, or whose owner instance has exited or is
	// past its alive window at Now. Each goes back to scheduled with
	// reclaims + 1 and the reason in last_error, or to dead_letter when
	// reclaims passes max_reclaims. The write repeats the predicate. It
	// returns the tasks as written, at most Limit. With Pulse set, the pass
	// first runs StorePulse's step in the same transaction, so no lease is
	// reclaimed for liveness that a store outage kept from being written.
	TaskReclaim(ctx context.Context, p TaskReclaimParams) ([]*vigiltype.Task, error)

	// StorePulse records that the store is writable at Now (DESIGN L8, L9).
	// When the previous pulse is more than Gap before Now, the store could
	// not be written (or no server ran) in between, so heartbeats could not
	// be: every instance not exited that was still alive at the previous
	// pulse gets alive_until = Now + its alive window, and every running
	// lease that had not expired at the previous pulse gets lease_expires_at
	// = Now + its lease window (lease_expires_at - last_heartbeat_at), both
	// never moved backwards; the outage is reported. Every pulse also judges
	// rows (when asked, see CheckFuture) dated more than FutureTolerance
	// ahead of Now as not heard from:
	// such an instance's alive_until and such a lease's lease_expires_at
	// become Now - 1ms (reported, so it is logged once). The first pulse of
	// a store only records Now. All in one transaction; several servers
	// pulsing one store act on a gap once.
	StorePulse(ctx context.Context, p StorePulseParams) (*StorePulseResult, error)

	// TaskListStalled returns the running tasks held by instances of Kind
	// whose started_at is before StartedBefore, oldest first (DESIGN S4:
	// candidates for a stall kill of that agent).
	TaskListStalled(ctx context.Context, p TaskListStalledParams) ([]*vigiltype.Task, error)
	// TaskReclaimStalled takes back one stalled task by compare-and-swap on
	// its epoch (DESIGN S4): if it is still running at Epoch it goes back to
	// scheduled (run_after = Now, started_at and lease cleared, reclaims + 1,
	// last_error = Reason), or to dead_letter past max_reclaims like any
	// reclaim, and the holder's current_task is cleared. A lost race
	// (ErrStaleEpoch) leaves the task as it is; ErrNotFound.
	TaskReclaimStalled(ctx context.Context, p TaskReclaimStalledParams) (*vigiltype.Task, error)

	// HeartbeatVersionList returns, per hostname and schema version, the
	// lease heartbeats counted in heartbeat_versions whose last_sent_at is at
	// or after Since, ordered by hostname then schema version (DESIGN T4: the
	// "all hosts emit v2" check).
	HeartbeatVersionList(ctx context.Context, since time.Time) ([]*vigiltype.HeartbeatVersion, error)

	// AgentRegister writes an agent record unconditionally (DESIGN R1): a
	// record of that name is replaced — created_at = updated_at = Now,
	// status active, stopped_at cleared, config as given — and the version
	// moves on (old version + 1, or 1), so a concurrent update's CAS fails.
	AgentRegister(ctx context.Context, p AgentRegisterParams) (*vigiltype.Agent, error)
	// AgentGet returns one record, ErrNotFound when there is none.
	AgentGet(ctx context.Context, name string) (*vigiltype.Agent, error)
	// AgentList returns every record, stopped ones included, oldest first
	// (created_at, then name).
	AgentList(ctx context.Context) ([]*vigiltype.Agent, error)
	// AgentUpdate changes the non-nil fields of a record whose version is
	// still Version (compare-and-swap), bumping the version and updated_at.
	// ErrNotFound, or ErrConflict when the version moved; nothing written.
	AgentUpdate(ctx context.Context, p AgentUpdateParams) (*vigiltype.Agent, error)
	// AgentSetStatus marks a record stopped (stopped_at = Now) or active
	// (stopped_at cleared), bumping the version. ErrNotFound.
	AgentSetStatus(ctx context.Context, name string, status vigiltype.AgentStatus, now time.Time) (*vigiltype.Agent, error)

	// EventRecord appends a process event at p.At. If an unexpired planned
	// stop of that agent covers p.At (created_at <= At <= expires_at) and
	// the event's process was running when it was written (LaunchedAt nil,
	// or LaunchedAt <= created_at, at millisecond precision), the event is
	// written already delivered: delivered_at = At, delivery_kind
	// "suppressed" (DESIGN E2). Suppressed events are still recorded.
	EventRecord(ctx context.Context, p EventRecordParams) (*vigiltype.ProcessEvent, error)
	// EventList returns events newest first (event_id desc), filtered.
	EventList(ctx context.Context, p EventListParams) ([]*vigiltype.ProcessEvent, error)
	// EventAck marks an event delivered (delivered_at = Now, delivery_kind
	// = Kind) unless it already is, and returns it as stored. ErrNotFound.
	EventAck(ctx context.Context, eventID int64, kind string, now time.Time) (*vigiltype.ProcessEvent, error)
	// PlannedStopWrite records (replacing any earlier one) a planned stop
	// of an agent: created_at = Now, expires_at = Now + TTL.
	PlannedStopWrite(ctx context.Context, p PlannedStopParams) (*vigiltype.PlannedStop, error)
	// PlannedStopGet returns an agent's planned stop marker if it covers
	// now, ErrNotFound otherwise.
	PlannedStopGet(ctx context.Context, agent string, now time.Time) (*vigiltype.PlannedStop, error)

	// SweeperRecord upserts one sweeper's status by name.
	SweeperRecord(ctx context.Context, s *vigiltype.Sweeper) error
	// SweeperList returns every sweeper's status ordered by name.
	SweeperList(ctx context.Context) ([]*vigiltype.Sweeper, error)

	// Close releases the store's connections.
	Close() error
}

// ProcessRegisterParams: a new instance. LivenessIntervalS > 0.
type ProcessRegisterParams struct {
	InstanceID        string
	TokenHash         string // hex sha256 of the instance token; the token itself is never stored
	ProcessKind       string
	Hostname          string
	PID               int
	LivenessIntervalS float64
	Now               time.Time
}

// ProcessHeartbeatParams renews one instance's liveness.
type ProcessHeartbeatParams struct {
	InstanceID string
	TokenHash  string
	Now        time.Time
}

// ProcessHeartbeatResult answers one item of ProcessHeartbeatBatch: the
// instance as written, or why the heartbeat was refused (wrapped as
// ProcessHeartbeat wraps it).
type ProcessHeartbeatResult struct {
	Process *vigiltype.Process
	Err     error
}

// ProcessMarkExitedParams records a clean exit.
type ProcessMarkExitedParams struct {
	InstanceID string
	TokenHash  string
	Now        time.Time
}

// ProcessCursor is the position after which a newest-first listing resumes.
type ProcessCursor struct {
	StartedAt  time.Time
	InstanceID string
}

// ProcessListParams filters a listing; empty fields do not filter.
// Limit <= 0 means no limit.
type ProcessListParams struct {
	Kind   string
	Host   string
	Status vigiltype.ProcessStatus // "" for both
	After  *ProcessCursor
	Limit  int
	Now    time.Time
}

// ProcessPruneParams: delete stopped history older than Before, and any
// stopped instance whose last heartbeat is dated more than
// vigiltype.FutureTolerance after Now (DESIGN L9: not heard from).
type ProcessPruneParams struct {
	Before time.Time
	Now    time.Time
}

// TaskEnqueueParams: a new task. MaxAttempts and MaxReclaims >= 1;
// LeaseTimeout 0 means the server default applies at claim time.
type TaskEnqueueParams struct {
	TaskType     string
	Payload      json.RawMessage
	MaxAttempts  int
	MaxReclaims  int
	LeaseTimeout time.Duration
	RunAfter     time.Time
	Now          time.Time
}

// TaskListParams filters a task listing; empty fields do not filter.
// Limit <= 0 means no limit.
type TaskListParams struct {
	Status   vigiltype.TaskStatus
	TaskType string
	BeforeID int64
	Limit    int
}

// TaskClaimParams: claim one task of Types for InstanceID. LeaseTimeout is
// the window used when the task has none of its own.
type TaskClaimParams struct {
	InstanceID   string
	Types        []string // claim the oldest of these types; or
	TaskID       int64    // claim this task (Types is then ignored)
	LeaseTimeout time.Duration
	Now          time.Time
}

// TaskLease identifies a held lease; every call on a claimed task carries it.
type TaskLease struct {
	TaskID     int64
	Epoch      int64
	InstanceID string
}

// TaskHeartbeatParams renews a lease; LeaseTimeout as in TaskClaimParams.
type TaskHeartbeatParams struct {
	TaskLease
	LeaseTimeout time.Duration
	// SchemaVersion is 1 (heartbeat only) or 2 (with ActivityAt).
	SchemaVersion int
	// ActivityAt is the holder's last evidence of progress (v2 only), at or
	// before Now and at or after the claim; nil for v1.
	ActivityAt *time.Time
	// ExpireOnActivity makes the lease expire ActivityAt + window rather
	// than Now + window (the `activity` expiry policy on a v2 heartbeat).
	ExpireOnActivity bool
	// KeepExpiry, for a v1 heartbeat only (the `activity-only` cutover,
	// DESIGN T6), records and counts the heartbeat but leaves
	// lease_expires_at as it is: without activity it does not extend the
	// lease. ErrInvalid with a v2 heartbeat.
	KeepExpiry bool
	Now        time.Time
}

// TaskCompleteParams finishes a task. Result is stored as given (JSON).
type TaskCompleteParams struct {
	TaskLease
	Result json.RawMessage
	Now    time.Time
}

// TaskFailParams records a handler failure.
type TaskFailParams struct {
	TaskLease
	Error   string
	RetryAt time.Time
	Now     time.Time
}

// TaskReleaseParams gives a lease back.
type TaskReleaseParams struct {
	TaskLease
	Now time.Time
}

// TaskReclaimParams bounds one reclaim pass. Limit <= 0 means no limit.
type TaskReclaimParams struct {
	Now   time.Time
	Limit int
	// Pulse, when set, is a StorePulse run first in the pass's transaction
	// (its Now is the pass's Now).
	Pulse *StorePulseParams
}

// StorePulseParams: a pulse at Now. Gap > 0 is how long the store may go
// without a pulse before the interval counts as an outage (the daemon's
// pulse interval times a margin). FutureTolerance > 0 is
// vigiltype.FutureTolerance unless a test says otherwise.
type StorePulseParams struct {
	Now             time.Time
	Gap             time.Duration
	FutureTolerance time.Duration
	// Force counts the interval since the previous pulse as an outage
	// however short it is: the server saw the store unavailable in it
	// (OutageWitness), so a heartbeat it answered with 503 may have been
	// lost.
	Force bool
	// CheckFuture asks for the future-dated rows check, which reads every
	// instance not exited: the daemon asks on its first pulse and once a
	// minute. A pulse that finds the clock stepped back (the previous
	// pulse more than FutureTolerance after Now) or a gap checks anyway.
	CheckFuture bool
}

// StorePulseResult is what one pulse found.
type StorePulseResult struct {
	// OutageFrom and OutageTo bound the gap this pulse found (the previous
	// pulse and Now); both zero when it found none.
	OutageFrom, OutageTo time.Time
	// GraceProcesses and GraceLeases count the instances and leases given
	// a fresh window for the gap.
	GraceProcesses, GraceLeases int64
	// FutureProcesses and FutureLeases count the rows dated in the future
	// that this pulse judged not heard from.
	FutureProcesses, FutureLeases int64
}

// Clocked is implemented by a backend that several servers may share: Now
// reads the database's clock, which the daemon follows (clock.Synced) so
// that every server decides liveness and lease expiry by one clock
// (DESIGN L3). A backend for one host (SQLite) does not implement it.
type Clocked interface {
	Now(ctx context.Context) (time.Time, error)
}

// AgentRegisterParams is a whole agent record. Config nil is stored as null.
type AgentRegisterParams struct {
	Name     string
	Function string
	TickCron string
	Config   json.RawMessage
	// ConfigWrittenBy is the role of the writer ("" unknown, stored NULL).
	ConfigWrittenBy string
	Now             time.Time
}

// AgentUpdateParams changes the non-nil fields of one record, if its
// version is still Version.
type AgentUpdateParams struct {
	Name     string
	Version  int64
	Function *string
	TickCron *string
	Config   json.RawMessage // nil: unchanged
	// ConfigWrittenBy is the role of the writer, stored with a non-nil
	// Config only ("" unknown, stored NULL).
	ConfigWrittenBy string
	Now             time.Time
}

// EventRecordParams is one process event.
type EventRecordParams struct {
	Agent         string
	Kind          vigiltype.EventKind
	At            time.Time
	ExitCode      *int
	Signal        string
	RunDurationMS int64
	StderrTail    string
	Detail        json.RawMessage // nil: null
	// LaunchedAt is when the process the event is about was launched, on
	// the store's clock (the server derives it from an age the reporter
	// measured on its own clock). A planned stop written before it does
	// not cover the event (DESIGN E2). nil: not known; the marker covers
	// the event for its whole TTL.
	LaunchedAt *time.Time
}

// EventListParams filters a listing; zero fields do not filter.
type EventListParams struct {
	Agent       string
	Undelivered bool // only events with delivered_at NULL
	BeforeID    int64
	Limit       int // <= 0: no limit
}

// PlannedStopParams is one planned stop marker.
type PlannedStopParams struct {
	Agent  string
	Reason string
	TTL    time.Duration
	Now    time.Time
}

// TaskListStalledParams selects stall-kill candidates.
type TaskListStalledParams struct {
	Kind          string
	StartedBefore time.Time
	Limit         int // <= 0: no limit
}

// TaskReclaimStalledParams takes back one stalled task.
type TaskReclaimStalledParams struct {
	TaskID int64
	Epoch  int64
	Reason string
	Now    time.Time
}

// ProcessCount is the number of instances of one kind in one status.
type ProcessCount struct {
	Kind   string
	Status vigiltype.ProcessStatus
	Count  int64
}
