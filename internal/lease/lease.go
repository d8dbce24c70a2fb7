// Package lease runs the task outbox: enqueue, atomic claims under a lease,
// lease heartbeats, outcomes, and the reclaim of leases whose holder is gone
// (DESIGN T1–T3).
//
// Task states:
//
//	enqueue ──► scheduled ──claim (epoch+1)──► running ──complete──► completed
//	                ▲                             │
//	                ├──── release ────────────────┤
//	                ├──── fail (attempts+1) ──────┤──► dead_letter at max_attempts
//	                └──── reclaim (reclaims+1) ───┘──► dead_letter past max_reclaims
//
// The lease_epoch is the fencing token: every call on a claimed task carries
// it, and a call with an older epoch than the task's is refused with
// ErrStaleEpoch and changes nothing, so a holder that was reclaimed (frozen,
// partitioned) can never overwrite its successor's work.
//
// A lease is reclaimed when its holder stops renewing it (lease_expires_at
// passed: the server's --lease-timeout, 5 min by default, or the task's own
// window) or at once when the holder's instance shows stopped (liveness TTL
// passed, or a clean exit): a dead process's work does not wait out the lease.
package lease

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/vigil-fleet/vigil/internal/clock"
	"github.com/vigil-fleet/vigil/internal/liveness"
	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// ExpiryPolicy decides what a lease's expiry is measured from (DESIGN T4).
type ExpiryPolicy string

const (
	// ExpiryMax (the default, for the transition): a lease expires its
	// window after MAX(last_activity_at, last_heartbeat_at), so any
	// heartbeat keeps it.
	ExpiryMax ExpiryPolicy = "max"
	// ExpiryActivity: a v2 lease expires its window after last_activity_at
	// alone, so heartbeats without progress do not keep it; v1 leases keep
	// the heartbeat fallback until every host sends v2.
	ExpiryActivity ExpiryPolicy = "activity"
	// ExpiryActivityOnly (seed 002, phase 3: the cutover, DESIGN T6): as
	// ExpiryActivity, and a v1 heartbeat no longer extends a lease — it is
	// recorded and counted per host (heartbeat versions), and the lease
	// runs out on its activity (the claim, for a holder that never sends
	// v2). Cut over once `vigil heartbeat versions` says every host sends v2.
	ExpiryActivityOnly ExpiryPolicy = "activity-only"
)

// Valid reports whether p is a known policy.
func (p ExpiryPolicy) Valid() bool {
	return p == ExpiryMax || p == ExpiryActivity || p == ExpiryActivityOnly
}

// Defaults, each overridable in Config.
const (
	// ActivityGatedLeaseTimeoutDefault is the lease window of a task
	// enqueued activity_gated without its own (DESIGN T4, seed 002: 30 min).
	ActivityGatedLeaseTimeoutDefault = 30 * time.Minute
	// ActivityClockTolerance is how far in the future an activity_at may
	// be (the holder's clock, e.g. a file mtime) before it is refused; a
	// value within it counts as now.
	ActivityClockTolerance = 5 * time.Second
	// LeaseTimeoutDefault is the reclaim window of a lease with no heartbeat (DESIGN T3, seed 000: 5 min).
	LeaseTimeoutDefault = 5 * time.Minute
	// MaxAttemptsDefault is the number of handler failures before dead_letter.
	MaxAttemptsDefault = 5
	// MaxReclaimsDefault is the number of reclaims after which the next one dead-letters the task.
	MaxReclaimsDefault = 3
	// RetryBackoffBaseDefault is the delay after the first failure; it doubles per failure.
	RetryBackoffBaseDefault = 2 * time.Second
	// RetryBackoffMaxDefault caps the failure backoff.
	RetryBackoffMaxDefault = 10 * time.Minute
	// ReclaimBatch bounds the tasks one reclaim pass writes.
	ReclaimBatch = 1000
	// PayloadMaxBytes bounds a task payload or result.
	PayloadMaxBytes = 256 << 10
	// LeaseTimeoutMinS and LeaseTimeoutMaxS bound a per-task lease window, in seconds.
	LeaseTimeoutMinS = 1
	LeaseTimeoutMaxS = 86400
	// ErrorMaxBytes bounds the error text a fail call stores; longer text is cut.
	ErrorMaxBytes = 8192
)

// Config configures a Service; zero fields take the defaults above.
type Config struct {
	Store            store.Store
	Liveness         *liveness.Service // authenticates instance tokens
	Clock            clock.Clock
	LeaseTimeout     time.Duration
	RetryBackoffBase time.Duration
	RetryBackoffMax  time.Duration
	// ExpiryPolicy is ExpiryMax when empty (DESIGN T4).
	ExpiryPolicy ExpiryPolicy
	// ActivityStaleness is how old a running task's activity may be before
	// reads show it stalled (vigiltype.ActivityStalenessDefault when 0).
	ActivityStaleness time.Duration
	// Pulser, when set, writes the store's pulse before every reclaim
	// pass, and the pass repeats it in its own transaction: no lease is
	// reclaimed for liveness or renewals a store outage kept from being
	// written (DESIGN L8). nil: reclaims judge the rows as they are.
	Pulser *liveness.Pulser
}

// Service is the task outbox.
type Service struct {
	store    store.Store
	liveness *liveness.Service
	clock    clock.Clock
	cfg      Config
	// Reclaimed, when set, is told how many leases each reclaim took back
	// (for metrics). Set it before use.
	Reclaimed func(n int)
}

// New fills defaults and returns a Service.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil || cfg.Liveness == nil {
		return nil, fmt.Errorf("lease: Store and Liveness are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.LeaseTimeout < 0 || cfg.RetryBackoffBase < 0 || cfg.RetryBackoffMax < 0 {
		return nil, fmt.Errorf("lease: durations must not be negative")
	}
	if cfg.LeaseTimeout == 0 {
		cfg.LeaseTimeout = LeaseTimeoutDefault
	}
	if cfg.RetryBackoffBase == 0 {
		cfg.RetryBackoffBase = RetryBackoffBaseDefault
	}
	if cfg.RetryBackoffMax == 0 {
		cfg.RetryBackoffMax = RetryBackoffMaxDefault
	}
	if cfg.ExpiryPolicy == "" {
		cfg.ExpiryPolicy = ExpiryMax
	}
	if cfg.ActivityStaleness < 0 {
		return nil, fmt.Errorf("lease: activity staleness must not be negative")
	}
	if cfg.ActivityStaleness == 0 {
		cfg.ActivityStaleness = vigiltype.ActivityStalenessDefault
	}
	if !cfg.ExpiryPolicy.Valid() {
		return nil, fmt.Errorf("lease expiry policy %q: must be max, activity or activity-only", cfg.ExpiryPolicy)
	}
	return &Service{store: cfg.Store, liveness: cfg.Liveness, clock: cfg.Clock, cfg: cfg}, nil
}

// LeaseTimeout is the server-wide lease window.
func (s *Service) LeaseTimeout() time.Duration { return s.cfg.LeaseTimeout }

// ExpiryPolicy is the server-wide lease expiry policy.
func (s *Service) ExpiryPolicy() ExpiryPolicy { return s.cfg.ExpiryPolicy }

// EnqueueParams is a new task. Pointer fields are optional.
type EnqueueParams struct {
	TaskType      string          `json:"task_type"`
	Payload       json.RawMessage `json:"payload"`
	MaxAttempts   *int            `json:"max_attempts"`    // default MaxAttemptsDefault; 1–1000
	MaxReclaims   *int            `json:"max_reclaims"`    // default MaxReclaimsDefault; 0–1000
	LeaseTimeoutS float64         `json:"lease_timeout_s"` // seconds; 0 = the server's window
	DelayS        float64         `json:"delay_s"`         // seconds before the task is claimable
	// ActivityGated marks work whose holder reports activity (v2
	// heartbeats): without LeaseTimeoutS its window is
	// ActivityGatedLeaseTimeoutDefault instead of the server's.
	ActivityGated bool `json:"activity_gated"`
}

// Enqueue validates p and inserts a scheduled task.
func (s *Service) Enqueue(ctx context.Context, p EnqueueParams) (*vigiltype.Task, error) {
	if err := vigiltype.CheckName("task_type", p.TaskType); err != nil {
		return nil, err
	}
	payload, err := checkJSON("payload", p.Payload, "{}")
	if err != nil {
		return nil, err
	}
	maxAttempts, err := intInRange("max_attempts", p.MaxAttempts, MaxAttemptsDefault, 1, 1000)
	if err != nil {
		return nil, err
	}
	maxReclaims, err := intInRange("max_reclaims", p.MaxReclaims, MaxReclaimsDefault, 0, 1000)
	if err != nil {
		return nil, err
	}
	if p.LeaseTimeoutS != 0 {
		if err := liveness.CheckInterval("lease_timeout_s", p.LeaseTimeoutS, LeaseTimeoutMinS, LeaseTimeoutMaxS); err != nil {
			return nil, vigiltype.Invalid("lease_timeout_s", "must be 0 (the server's window) or between 1 and 86400 seconds")
		}
	}
	if math.IsNaN(p.DelayS) || p.DelayS < 0 || p.DelayS > 365*86400 {
		return nil, vigiltype.Invalid("delay_s", "must be between 0 and 31536000 seconds")
	}
	leaseTimeout := seconds(p.LeaseTimeoutS)
	if leaseTimeout == 0 && p.ActivityGated {
		leaseTimeout = ActivityGatedLeaseTimeoutDefault
	}
	now := s.clock.Now()
	t, err := s.store.TaskEnqueue(ctx, store.TaskEnqueueParams{
		TaskType:     p.TaskType,
		Payload:      payload,
		MaxAttempts:  maxAttempts,
		MaxReclaims:  maxReclaims,
		LeaseTimeout: leaseTimeout,
		RunAfter:     now.Add(seconds(p.DelayS)),
		Now:          now,
	})
	if err != nil {
		return nil, fmt.Errorf("enqueue %s task: %w", p.TaskType, err)
	}
	return t, nil
}

// Get returns one task, with Stalled computed at now.
func (s *Service) Get(ctx context.Context, taskID int64) (*vigiltype.Task, error) {
	t, err := s.store.TaskGet(ctx, taskID)
	if err != nil {
		return nil, err // the store's error names the task
	}
	s.markStalled(t)
	return t, nil
}

// markStalled computes Stalled for tasks read now (DESIGN T6).
func (s *Service) markStalled(tasks ...*vigiltype.Task) {
	now := s.clock.Now()
	for _, t := range tasks {
		t.Stalled = t.ComputeStalled(now, s.cfg.ActivityStaleness)
	}
}

// ActivityStaleness is the bound past which a running task's activity
// shows it stalled.
func (s *Service) ActivityStaleness() time.Duration { return s.cfg.ActivityStaleness }

// ListParams filters a task listing; empty fields do not filter.
type ListParams struct {
	Status   string
	TaskType string
	Limit    int   // 0 means liveness.ListLimitDefault
	BeforeID int64 // the previous page's next cursor
}

// List returns one page of tasks, highest id first, and the id to pass as
// BeforeID for the next page (0 on the last page).
func (s *Service) List(ctx context.Context, p ListParams) ([]*vigiltype.Task, int64, error) {
	params := store.TaskListParams{TaskType: p.TaskType, BeforeID: p.BeforeID}
	if p.Status != "" {
		st := vigiltype.TaskStatus(p.Status)
		if !st.Valid() {
			return nil, 0, vigiltype.Invalid("status", "must be one of scheduled, running, completed, dead_letter")
		}
		params.Status = st
	}
	if p.TaskType != "" {
		if err := vigiltype.CheckName("type", p.TaskType); err != nil {
			return nil, 0, err
		}
	}
	limit, err := liveness.CheckIDPage(p.BeforeID, p.Limit)
	if err != nil {
		return nil, 0, err
	}
	params.Limit = limit + 1
	tasks, err := s.store.TaskList(ctx, params)
	if err != nil {
		return nil, 0, fmt.Errorf("list tasks: %w", err)
	}
	tasks, next := liveness.TrimPage(tasks, limit, func(t *vigiltype.Task) int64 { return t.TaskID })
	s.markStalled(tasks...)
	return tasks, next, nil
}

// Claim authenticates the instance and atomically takes the oldest claimable
// task of one of types. It returns nil, nil when there is none.
func (s *Service) Claim(ctx context.Context, instanceID, token string, types []string) (*vigiltype.Task, error) {
	if len(types) == 0 {
		return nil, vigiltype.Invalid("task_types", "must name at least one task type")
	}
	for i, typ := range types {
		if err := vigiltype.CheckName(fmt.Sprintf("task_types[%d]", i), typ); err != nil {
			return nil, err
		}
	}
	if err := s.liveness.Authenticate(ctx, instanceID, token); err != nil {
		return nil, fmt.Errorf("instance %s: %w", instanceID, err)
	}
	t, err := s.store.TaskClaim(ctx, store.TaskClaimParams{
		InstanceID: instanceID, Types: types, LeaseTimeout: s.cfg.LeaseTimeout, Now: s.clock.Now(),
	})
	if err != nil {
		return nil, fmt.Errorf("claim for instance %s: %w", instanceID, err)
	}
	return t, nil
}

// ClaimByID authenticates the instance and claims one specific task if it
// is waiting to be claimed. Errors: ErrNotFound, ErrNotClaimable.
func (s *Service) ClaimByID(ctx context.Context, instanceID, token string, taskID int64) (*vigiltype.Task, error) {
	if taskID <= 0 {
		return nil, vigiltype.Invalid("task_id", "must be a positive integer")
	}
	if err := s.liveness.Authenticate(ctx, instanceID, token); err != nil {
		return nil, fmt.Errorf("instance %s: %w", instanceID, err)
	}
	t, err := s.store.TaskClaim(ctx, store.TaskClaimParams{
		InstanceID: instanceID, TaskID: taskID, LeaseTimeout: s.cfg.LeaseTimeout, Now: s.clock.Now(),
	})
	if err != nil {
		return nil, fmt.Errorf("claim task %d for instance %s: %w", taskID, instanceID, err)
	}
	return t, nil
}

// Lease is what every call on a claimed task carries.
type Lease struct {
	TaskID     int64
	InstanceID string
	Token      string
	Epoch      int64
}

func (s *Service) authenticate(ctx context.Context, l Lease) (store.TaskLease, error) {
	if l.InstanceID == "" {
		return store.TaskLease{}, vigiltype.Invalid("instance_id", "is required")
	}
	if l.Epoch <= 0 {
		return store.TaskLease{}, vigiltype.Invalid("lease_epoch", "must be the positive epoch returned by claim")
	}
	if err := s.liveness.Authenticate(ctx, l.InstanceID, l.Token); err != nil {
		return store.TaskLease{}, fmt.Errorf("instance %s: %w", l.InstanceID, err)
	}
	return store.TaskLease{TaskID: l.TaskID, Epoch: l.Epoch, InstanceID: l.InstanceID}, nil
}

// Beat is the body of a lease heartbeat (DESIGN T4).
type Beat struct {
	// SchemaVersion is 1 (heartbeat only; the default when 0) or 2.
	SchemaVersion int
	// ActivityAt is required with version 2: the holder's last evidence
	// of progress. It may not be in the future (beyond
	// ActivityClockTolerance) nor before the claim.
	ActivityAt *time.Time
	// ActivityAgeMS, with version 2, stands for ActivityAt (one of the two,
	// not both): the activity's age in milliseconds, measured on the
	// holder's own clock (DESIGN T7), so the server places it at its now −
	// age and a skewed holder clock neither refuses nor shortens the lease.
	// 0 to ActivityAgeMaxMS.
	ActivityAgeMS *float64
}

// ActivityAgeMaxMS bounds activity_age_ms: 30 days.
const ActivityAgeMaxMS = 30 * 24 * 3600 * 1000

// Heartbeat renews a held lease (DESIGN T3, T4). Under the activity policy a
// v2 heartbeat's expiry counts from its activity_at, so heartbeats without
// progress let the lease lapse. Errors: ErrStaleEpoch when the lease is no
// longer held at that epoch, ErrNotFound, ErrInvalidToken, ErrInvalid.
func (s *Service) Heartbeat(ctx context.Context, l Lease, b Beat) (*vigiltype.Task, error) {
	version := b.SchemaVersion
	if version == 0 {
		version = 1
	}
	now := s.clock.Now()
	if b.ActivityAgeMS != nil {
		age := *b.ActivityAgeMS
		switch {
		case b.ActivityAt != nil:
			return nil, vigiltype.Invalid("activity_age_ms", "send activity_at or activity_age_ms, not both")
		case age != age || age < 0 || age > ActivityAgeMaxMS:
			return nil, vigiltype.Invalid("activity_age_ms", "must be a number of milliseconds from 0 to "+strconv.Itoa(ActivityAgeMaxMS))
		case version == 1:
			return nil, vigiltype.Invalid("activity_age_ms", "is only accepted with schema_version 2")
		}
		at := now.Add(-time.Duration(age * float64(time.Millisecond)))
		b.ActivityAt = &at
	}
	switch {
	case version != 1 && version != 2:
		return nil, vigiltype.Invalid("schema_version", "must be 1 or 2")
	case version == 1 && b.ActivityAt != nil:
		return nil, vigiltype.Invalid("activity_at", "is only accepted with schema_version 2")
	case version == 2 && b.ActivityAt == nil:
		return nil, vigiltype.Invalid("activity_at", "is required with schema_version 2")
	}
	var activityAt *time.Time
	if b.ActivityAt != nil {
		at := b.ActivityAt.UTC()
		if at.After(now.Add(ActivityClockTolerance)) {
			return nil, vigiltype.Invalid("activity_at", "must not be in the future (server time "+now.Format(time.RFC3339)+")")
		}
		if at.After(now) {
			at = now // within the tolerance: the holder's clock runs a little ahead
		}
		activityAt = &at
	}
	tl, err := s.authenticate(ctx, l)
	if err != nil {
		return nil, err
	}
	if activityAt != nil {
		// started_at only changes with a claim, which also changes the
		// epoch, so the guarded write below refuses a stale read.
		t, err := s.store.TaskGet(ctx, l.TaskID)
		if err != nil {
			return nil, fmt.Errorf("task %d: %w", l.TaskID, err)
		}
		if t.StartedAt != nil && activityAt.Before(t.StartedAt.Truncate(time.Millisecond)) && t.LeaseEpoch == l.Epoch {
			if b.ActivityAgeMS == nil {
				return nil, vigiltype.Invalid("activity_at", "must not be before the claim ("+t.StartedAt.Format(time.RFC3339Nano)+")")
			}
			// An age is the holder's own measure, not a clock to refuse:
			// activity older than the claim counts from the claim.
			claimed := t.StartedAt.Truncate(time.Millisecond)
			activityAt = &claimed
		}
	}
	return s.store.TaskHeartbeat(ctx, store.TaskHeartbeatParams{
		TaskLease:        tl,
		LeaseTimeout:     s.cfg.LeaseTimeout,
		SchemaVersion:    version,
		ActivityAt:       activityAt,
		ExpireOnActivity: version == 2 && (s.cfg.ExpiryPolicy == ExpiryActivity || s.cfg.ExpiryPolicy == ExpiryActivityOnly),
		KeepExpiry:       version == 1 && s.cfg.ExpiryPolicy == ExpiryActivityOnly,
		Now:              now,
	})
}

// StallAfterDefault is how long a task may run before it counts as stalled
// (DESIGN S4, seed 003: 30 min).
const StallAfterDefault = 30 * time.Minute

// Stalled lists the running tasks of agent kind that started more than
// stallAfter ago, oldest first (DESIGN S4).
func (s *Service) Stalled(ctx context.Context, kind string, stallAfter time.Duration) ([]*vigiltype.Task, error) {
	if err := vigiltype.CheckName("kind", kind); err != nil {
		return nil, err
	}
	if stallAfter <= 0 {
		return nil, vigiltype.Invalid("after_s", "must be a positive number of seconds")
	}
	tasks, err := s.store.TaskListStalled(ctx, store.TaskListStalledParams{
		Kind: kind, StartedBefore: s.clock.Now().Add(-stallAfter), Limit: liveness.ListLimitMax,
	})
	if err != nil {
		return nil, fmt.Errorf("list stalled tasks of %s: %w", kind, err)
	}
	return tasks, nil
}

// ReclaimStalled takes back a stalled task if it is still running at epoch
// (compare-and-swap: a lost race, ErrStaleEpoch, leaves it as it is).
func (s *Service) ReclaimStalled(ctx context.Context, taskID, epoch int64, reason string) (*vigiltype.Task, error) {
	if epoch <= 0 {
		return nil, vigiltype.Invalid("lease_epoch", "must be the positive epoch of the stalled lease")
	}
	if err := vigiltype.CheckText("reason", reason); err != nil {
		return nil, err
	}
	reason = strings.TrimSpace(reason)
	if reason == "" {
		return nil, vigiltype.Invalid("reason", "is required: say why the task is taken back")
	}
	if len(reason) > ErrorMaxBytes {
		reason = strings.ToValidUTF8(reason[:ErrorMaxBytes], "")
	}
	t, err := s.store.TaskReclaimStalled(ctx, store.TaskReclaimStalledParams{
		TaskID: taskID, Epoch: epoch, Reason: reason, Now: s.clock.Now(),
	})
	if err != nil {
		return nil, err // the store's error names the task
	}
	if s.Reclaimed != nil {
		s.Reclaimed(1)
	}
	return t, nil
}

// ReclaimByHolder is ReclaimStalled asked by the task's holder itself
// (an agent that gives its own task up for another to take): token must
// be the instance token of the instance that holds the task at epoch,
// which it returns too ("" when the task is not running at epoch).
// Errors: ErrInvalidToken when it is not, ErrStaleEpoch when the task is
// not running at epoch, and those of ReclaimStalled.
func (s *Service) ReclaimByHolder(ctx context.Context, taskID, epoch int64, token, reason string) (*vigiltype.Task, string, error) {
	t, err := s.store.TaskGet(ctx, taskID)
	if err != nil {
		return nil, "", fmt.Errorf("task %d: %w", taskID, err)
	}
	// Not running at epoch: refused before the token is judged, and never
	// handed on to the compare-and-swap, which a claim moving the task to
	// exactly epoch in between would let through for another holder.
	if t.Status != vigiltype.TaskRunning || t.LeaseEpoch != epoch || t.LeaseOwner == nil {
		return nil, "", fmt.Errorf("reclaim task %d at epoch %d: it is not running at that epoch: %w", taskID, epoch, vigiltype.ErrStaleEpoch)
	}
	holder := *t.LeaseOwner
	if err := s.liveness.Authenticate(ctx, holder, token); err != nil {
		return nil, holder, fmt.Errorf("reclaim task %d: only its holder (instance %s) or an operator may: %w", taskID, holder, err)
	}
	// The epoch names this holder's lease: the compare-and-swap below
	// takes the task only while that lease still stands.
	t, err = s.ReclaimStalled(ctx, taskID, epoch, reason)
	return t, holder, err
}

// HeartbeatVersionsWindowDefault is the adoption view's window when none is given.
const HeartbeatVersionsWindowDefault = time.Hour

// HeartbeatVersions lists, per host and schema version, the lease
// heartbeats last sent within window (DESIGN T4: before the activity
// policy drops the v1 fallback, every host should show version 2 only).
func (s *Service) HeartbeatVersions(ctx context.Context, window time.Duration) ([]*vigiltype.HeartbeatVersion, error) {
	if window <= 0 {
		return nil, vigiltype.Invalid("window_s", "must be a positive number of seconds")
	}
	list, err := s.store.HeartbeatVersionList(ctx, s.clock.Now().Add(-window))
	if err != nil {
		return nil, fmt.Errorf("list heartbeat versions: %w", err)
	}
	return list, nil
}

// Complete finishes a held task with result (JSON; empty means null). The
// same complete repeated by the holder at the same epoch (its first answer
// was lost) answers with the stored task; another result for the task that
// lease completed is ErrOutcomeConflict naming result (DESIGN T8).
func (s *Service) Complete(ctx context.Context, l Lease, result json.RawMessage) (*vigiltype.Task, error) {
	res, err := checkJSON("result", result, "null")
	if err != nil {
		return nil, err
	}
	tl, err := s.authenticate(ctx, l)
	if err != nil {
		return nil, err
	}
	return s.store.TaskComplete(ctx, store.TaskCompleteParams{TaskLease: tl, Result: res, Now: s.clock.Now()})
}

// Fail records a handler failure. retryAfter > 0 overrides the backoff
// (RetryBackoffBase doubling per attempt, capped at RetryBackoffMax). The
// same fail repeated by the holder at the same epoch answers with the
// stored task and counts nothing twice; another error text is
// ErrOutcomeConflict naming error (DESIGN T8).
func (s *Service) Fail(ctx context.Context, l Lease, msg string, retryAfter time.Duration) (*vigiltype.Task, error) {
	if msg == "" {
		return nil, vigiltype.Invalid("error", "is required: say why the task failed")
	}
	msg = vigiltype.CleanText(msg) // a program's output: cleaned, not refused
	if len(msg) > ErrorMaxBytes {
		msg = strings.ToValidUTF8(msg[:ErrorMaxBytes], "")
	}
	if retryAfter < 0 {
		return nil, vigiltype.Invalid("retry_after_s", "must not be negative")
	}
	tl, err := s.authenticate(ctx, l)
	if err != nil {
		return nil, err
	}
	if retryAfter == 0 {
		// Attempts only change under this lease, so the value read here is
		// still current when the guarded write below runs.
		t, err := s.store.TaskGet(ctx, l.TaskID)
		if err != nil {
			return nil, fmt.Errorf("task %d: %w", l.TaskID, err)
		}
		retryAfter = RetryBackoff(t.Attempts+1, s.cfg.RetryBackoffBase, s.cfg.RetryBackoffMax)
	}
	now := s.clock.Now()
	return s.store.TaskFail(ctx, store.TaskFailParams{TaskLease: tl, Error: msg, RetryAt: now.Add(retryAfter), Now: now})
}

// Release gives a held task back without counting an attempt.
func (s *Service) Release(ctx context.Context, l Lease) (*vigiltype.Task, error) {
	tl, err := s.authenticate(ctx, l)
	if err != nil {
		return nil, err
	}
	return s.store.TaskRelease(ctx, store.TaskReleaseParams{TaskLease: tl, Now: s.clock.Now()})
}

// Reclaim is one pass of the lease reclaimer: it takes back every lease
// whose holder is gone (expired, or holder stopped) and returns how many.
func (s *Service) Reclaim(ctx context.Context) (int, error) {
	var pulse *store.StorePulseParams
	if s.cfg.Pulser != nil {
		if _, err := s.cfg.Pulser.Pass(ctx); err != nil {
			return 0, fmt.Errorf("reclaim leases: %w", err)
		}
		pulse = &store.StorePulseParams{Gap: s.cfg.Pulser.Gap(), FutureTolerance: vigiltype.FutureTolerance}
	}
	total := 0
	for {
		tasks, err := s.store.TaskReclaim(ctx, store.TaskReclaimParams{Now: s.clock.Now(), Limit: ReclaimBatch, Pulse: pulse})
		total += len(tasks)
		if s.Reclaimed != nil && len(tasks) > 0 {
			s.Reclaimed(len(tasks))
		}
		if err != nil {
			return total, fmt.Errorf("reclaim leases: %w", err)
		}
		if len(tasks) < ReclaimBatch {
			return total, nil
		}
	}
}

// RetryBackoff is the delay before the attempt-th retry: base × 2^(attempt-1),
// capped at maxDelay.
func RetryBackoff(attempt int, base, maxDelay time.Duration) time.Duration {
	d := base
	for i := 1; i < attempt; i++ {
		d *= 2
		if d >= maxDelay {
			return maxDelay
		}
	}
	return min(d, maxDelay)
}

// checkJSON validates an optional JSON field; absent or an explicit null
// gives empty (the field's documented default).
func checkJSON(field string, raw json.RawMessage, empty string) (json.RawMessage, error) {
	if len(raw) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return json.RawMessage(empty), nil
	}
	if err := vigiltype.CheckJSON(field, raw, PayloadMaxBytes); err != nil {
		return nil, err
	}
	return raw, nil
}

func intInRange(field string, v *int, def, lo, hi int) (int, error) {
	if v == nil {
		return def, nil
	}
	if *v < lo || *v > hi {
		return 0, vigiltype.Invalid(field, fmt.Sprintf("must be between %d and %d", lo, hi))
	}
	return *v, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
