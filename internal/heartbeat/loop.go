package heartbeat

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/vigil-fleet/vigil/internal/clock"
	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// Defaults (DESIGN §9).
const (
	// IntervalDefault is how often the loop ticks.
	IntervalDefault = 240 * time.Second
	// StalenessDefault is how old last-activity may be for a tick to send
	// the lease heartbeat.
	StalenessDefault = 900 * time.Second
	// LeaseWindowDefault is how long writes may keep failing before the
	// loop gives up with an error: the activity-gated lease window.
	LeaseWindowDefault = 30 * time.Minute
	// FutureToleranceDefault is how far in the future an activity mtime
	// may be (filesystem timestamp granularity) and still count; it is
	// sent as now then.
	FutureToleranceDefault = time.Second
)

// ErrWriteFailures ends Run when the server writes kept failing for longer
// than the lease window.
var ErrWriteFailures = errors.New("heartbeat writes kept failing past the lease window")

// Client is the part of *vigilclient.Client the loop uses.
type Client interface {
	ProcessHeartbeat(ctx context.Context, inst vigilclient.Instance) (*vigiltype.Process, error)
	TaskHeartbeatAge(ctx context.Context, l vigilclient.Lease, age time.Duration) (*vigiltype.Task, error)
	TaskHeartbeatV2(ctx context.Context, l vigilclient.Lease, activityAt time.Time) (*vigiltype.Task, error)
}

// Config configures a Loop. Zero durations take the defaults.
type Config struct {
	State  State
	Client Client
	// Lease is the lease to keep; Lease.Instance is the session instance
	// whose liveness row is kept fresh too.
	Lease vigilclient.Lease
	// Liveness: send the instance's liveness heartbeat every tick (set
	// when the instance belongs to the session, not to another program).
	Liveness bool
	// NotBefore is when the server started the lease (the task's
	// started_at): a server that predates activity_age_ms refuses an
	// activity_at before it, so for such a server an older (but fresh)
	// mtime is sent as NotBefore. Zero: no clamp. The age form needs no
	// clamp (the server counts older activity from the claim).
	NotBefore time.Time
	// Parent is the process whose life bounds the loop.
	Parent          ProcRef
	Interval        time.Duration
	Staleness       time.Duration
	LeaseWindow     time.Duration
	FutureTolerance time.Duration
	Clock           clock.Clock
	// ParentAlive decides whether Parent lives; default Alive.
	ParentAlive func(ProcRef) bool
	Logger      *slog.Logger
}

// Action is what one tick did.
type Action string

// Tick actions.
const (
	ActionPosted          Action = "posted"           // lease heartbeat sent with activity_at
	ActionSkipNoActivity  Action = "skip_no_activity" // last-activity missing
	ActionSkipStale       Action = "skip_stale"       // last-activity older than the staleness bound
	ActionSkipFuture      Action = "skip_future"      // last-activity mtime in the future
	ActionWriteFailed     Action = "write_failed"     // a write failed; the loop goes on
	ActionStopParentGone  Action = "stop_parent_gone" // the parent is gone: exit cleanly
	ActionStopLeaseLost   Action = "stop_lease_lost"  // the server refused the lease: exit
	ActionStopWriteFailed Action = "stop_write_failures"
)

// Stops reports whether the loop ends after this action.
func (a Action) Stops() bool {
	return a == ActionStopParentGone || a == ActionStopLeaseLost || a == ActionStopWriteFailed
}

// TickResult is the outcome of one Tick.
type TickResult struct {
	Action     Action
	ActivityAt time.Time // the activity mtime read, when there was one
	Err        error     // the write error, if any
}

// Activity classifies the activity mtime at now (pure): "" when fresh
// (send it), else the skip action.
func Activity(now, mtime time.Time, exists bool, staleness, futureTolerance time.Duration) Action {
	switch {
	case !exists:
		return ActionSkipNoActivity
	case mtime.Sub(now) > futureTolerance:
		return ActionSkipFuture
	case now.Sub(mtime) > staleness:
		return ActionSkipStale
	}
	return ""
}

// leaseLost reports whether err means the lease (or the instance) is gone
// for good, so retrying is pointless.
func leaseLost(err error) bool {
	return errors.Is(err, vigiltype.ErrStaleEpoch) || errors.Is(err, vigiltype.ErrNotFound) ||
		errors.Is(err, vigiltype.ErrInvalidToken) || errors.Is(err, vigiltype.ErrInstanceExited)
}

// Loop is one heartbeat loop. Tick is its decision step; Run ticks every
// Interval. A Loop is used by one goroutine.
type Loop struct {
	cfg          Config
	failingSince time.Time // zero while the last write succeeded
}

// NewLoop fills defaults and validates cfg.
func NewLoop(cfg Config) (*Loop, error) {
	cfg.Interval = cmp.Or(cfg.Interval, IntervalDefault)
	cfg.Staleness = cmp.Or(cfg.Staleness, StalenessDefault)
	cfg.LeaseWindow = cmp.Or(cfg.LeaseWindow, LeaseWindowDefault)
	cfg.FutureTolerance = cmp.Or(cfg.FutureTolerance, FutureToleranceDefault)
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.ParentAlive == nil {
		cfg.ParentAlive = Alive
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	switch {
	case cfg.Client == nil:
		return nil, errors.New("heartbeat: Client is required")
	case cfg.State.Workdir == "":
		return nil, errors.New("heartbeat: State is required")
	case cfg.Lease.TaskID <= 0 || cfg.Lease.Epoch <= 0:
		return nil, errors.New("heartbeat: Lease needs a task id and an epoch")
	case cfg.Lease.Instance.ID == "":
		return nil, errors.New("heartbeat: Lease needs an instance")
	case cfg.Parent.PID <= 0:
		return nil, errors.New("heartbeat: Parent pid is required")
	case cfg.Interval < 0 || cfg.Staleness < 0 || cfg.LeaseWindow < 0:
		return nil, errors.New("heartbeat: Interval, Staleness and LeaseWindow must be positive")
	}
	return &Loop{cfg: cfg}, nil
}

// Tick makes one decision and the writes it calls for.
func (l *Loop) Tick(ctx context.Context) TickResult {
	c := l.cfg
	if !c.ParentAlive(c.Parent) {
		c.Logger.Info("parent is gone: exiting, the lease will lapse", "parent_pid", c.Parent.PID)
		return TickResult{Action: ActionStopParentGone}
	}
	var werr error
	if c.Liveness {
		if _, err := c.Client.ProcessHeartbeat(ctx, c.Lease.Instance); err != nil {
			if leaseLost(err) {
				c.Logger.Warn("liveness heartbeat refused: exiting", "err", err)
				return TickResult{Action: ActionStopLeaseLost, Err: err}
			}
			werr = err
		}
	}
	now := c.Clock.Now()
	mtime, exists, err := c.State.Activity()
	if err != nil {
		c.Logger.Warn("read activity file", "err", err)
	}
	res := TickResult{ActivityAt: mtime}
	if skip := Activity(now, mtime, exists, c.Staleness, c.FutureTolerance); skip != "" {
		res.Action = skip
		switch skip {
		case ActionSkipFuture:
			c.Logger.Warn("activity time is in the future (clock stepped back or a bad touch): not fresh, lease heartbeat skipped",
				"activity_at", mtime, "now", now)
		case ActionSkipStale:
			c.Logger.Info("activity is stale: lease heartbeat skipped", "activity_at", mtime, "age", now.Sub(mtime).Round(time.Second), "staleness", c.Staleness)
		default:
			c.Logger.Info("no activity file: lease heartbeat skipped", "path", c.State.Path(ActivityFile))
		}
	} else {
		at := mtime
		if at.After(now) {
			at = now
		}
		// The activity's age on this host's clock (the mtime and now are
		// both this host's), placed by the server on its own (DESIGN T7).
		_, err := c.Client.TaskHeartbeatAge(ctx, c.Lease, now.Sub(at))
		if errors.Is(err, vigiltype.ErrInvalid) {
			if at.Before(c.NotBefore) {
				at = c.NotBefore
			}
			_, err = c.Client.TaskHeartbeatV2(ctx, c.Lease, at) // a server that predates activity_age_ms
		}
		if err != nil {
			if leaseLost(err) {
				c.Logger.Warn("lease heartbeat refused: the lease is lost, exiting", "task_id", c.Lease.TaskID, "err", err)
				return TickResult{Action: ActionStopLeaseLost, ActivityAt: mtime, Err: err}
			}
			werr = errors.Join(werr, err)
		} else {
			res.Action = ActionPosted
			c.Logger.Info("lease heartbeat sent", "task_id", c.Lease.TaskID, "activity_at", at, "activity_age", now.Sub(at).Round(time.Millisecond))
		}
	}
	if werr == nil {
		l.failingSince = time.Time{}
		return res
	}
	if l.failingSince.IsZero() {
		l.failingSince = now
	}
	res.Err = werr
	if now.Sub(l.failingSince) >= c.LeaseWindow {
		c.Logger.Error("writes kept failing past the lease window: exiting", "since", l.failingSince, "err", werr)
		res.Action = ActionStopWriteFailed
		return res
	}
	c.Logger.Warn("heartbeat write failed", "since", l.failingSince, "err", werr)
	res.Action = ActionWriteFailed
	return res
}

// Run ticks at once and then every Interval until a tick stops the loop or
// ctx ends. On return it removes the loop's pid file if it names this
// process. It returns ErrWriteFailures (wrapped) when writes failed past
// the lease window, and nil otherwise.
func (l *Loop) Run(ctx context.Context) error {
	defer func() {
		if err := removeIfOwned(l.cfg.State.Path(PIDFile), os.Getpid()); err != nil {
			l.cfg.Logger.Warn("remove pid file", "err", err)
		}
	}()
	t := time.NewTicker(l.cfg.Interval)
	defer t.Stop()
	for {
		res := l.Tick(ctx)
		switch res.Action {
		case ActionStopWriteFailed:
			return fmt.Errorf("%w: %w", ErrWriteFailures, res.Err)
		case ActionStopParentGone, ActionStopLeaseLost:
			return nil
		}
		select {
		case <-ctx.Done():
			l.cfg.Logger.Info("stopped by signal")
			return nil
		case <-t.C:
		}
	}
}
