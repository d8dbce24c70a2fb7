package store

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// WithUnavailable wraps s so that every error that isUnavailable
// recognises (the backend's own judgement: pgstore.IsUnavailable,
// sqlitestore.IsUnavailable) also matches vigiltype.ErrUnavailable, and
// the layers above (the HTTP API's 503, the SDKs' retries) need not know
// the driver. The error keeps its text and chain for the log; a store that
// implements Clocked still does. The daemon wraps the store it opens.
func WithUnavailable(s Store, isUnavailable func(error) bool) Store {
	u := &unavailableStore{s: s, is: isUnavailable}
	if c, ok := s.(Clocked); ok {
		return &unavailableClocked{unavailableStore: u, c: c}
	}
	return u
}

// unavailableError marks a store error as vigiltype.ErrUnavailable.
type unavailableError struct{ err error }

func (e *unavailableError) Error() string {
	return fmt.Sprintf("%s: %s", vigiltype.ErrUnavailable, e.err)
}
func (e *unavailableError) Unwrap() []error { return []error{vigiltype.ErrUnavailable, e.err} }

// unavailableStore is WithUnavailable's wrapper; every method is the
// wrapped store's, its error passed through check.
type unavailableStore struct {
	s    Store
	is   func(error) bool
	seen atomic.Uint64 // errors marked unavailable so far
}

// OutageWitness is implemented by a store that counts the errors it marked
// vigiltype.ErrUnavailable (WithUnavailable's wrapper): a change of the
// count tells the pulse that this server saw the store away, however short
// the gap in the pulse (DESIGN L8).
type OutageWitness interface {
	UnavailableSeen() uint64
}

// UnavailableSeen implements OutageWitness.
func (u *unavailableStore) UnavailableSeen() uint64 { return u.seen.Load() }

var _ Store = (*unavailableStore)(nil)

// check marks err when the backend says the store is unavailable.
func (u *unavailableStore) check(err error) error {
	if err == nil || errors.Is(err, vigiltype.ErrUnavailable) || !u.is(err) {
		return err
	}
	u.seen.Add(1)
	return &unavailableError{err: err}
}

// unavailableClocked is an unavailableStore over a Clocked store.
type unavailableClocked struct {
	*unavailableStore
	c Clocked
}

// Now implements Clocked.
func (u *unavailableClocked) Now(ctx context.Context) (time.Time, error) {
	t, err := u.c.Now(ctx)
	return t, u.check(err)
}

// ProcessRegister implements Store.
func (u *unavailableStore) ProcessRegister(ctx context.Context, p ProcessRegisterParams) (*vigiltype.Process, error) {
	v, err := u.s.ProcessRegister(ctx, p)
	return v, u.check(err)
}

// ProcessCheckToken implements Store.
func (u *unavailableStore) ProcessCheckToken(ctx context.Context, instanceID, tokenHash string) error {
	return u.check(u.s.ProcessCheckToken(ctx, instanceID, tokenHash))
}

// ProcessHeartbeat implements Store.
func (u *unavailableStore) ProcessHeartbeat(ctx context.Context, p ProcessHeartbeatParams) (*vigiltype.Process, error) {
	v, err := u.s.ProcessHeartbeat(ctx, p)
	return v, u.check(err)
}

// ProcessHeartbeatBatch implements Store.
func (u *unavailableStore) ProcessHeartbeatBatch(ctx context.Context, items []ProcessHeartbeatParams) ([]ProcessHeartbeatResult, error) {
	v, err := u.s.ProcessHeartbeatBatch(ctx, items)
	return v, u.check(err)
}

// ProcessMarkExited implements Store.
func (u *unavailableStore) ProcessMarkExited(ctx context.Context, p ProcessMarkExitedParams) (*vigiltype.Process, error) {
	v, err := u.s.ProcessMarkExited(ctx, p)
	return v, u.check(err)
}

// ProcessGet implements Store.
func (u *unavailableStore) ProcessGet(ctx context.Context, instanceID string, now time.Time) (*vigiltype.Process, error) {
	v, err := u.s.ProcessGet(ctx, instanceID, now)
	return v, u.check(err)
}

// ProcessLatest implements Store.
func (u *unavailableStore) ProcessLatest(ctx context.Context, kind string, now time.Time) (*vigiltype.Process, error) {
	v, err := u.s.ProcessLatest(ctx, kind, now)
	return v, u.check(err)
}

// ProcessList implements Store.
func (u *unavailableStore) ProcessList(ctx context.Context, p ProcessListParams) ([]*vigiltype.Process, error) {
	v, err := u.s.ProcessList(ctx, p)
	return v, u.check(err)
}

// ProcessCounts implements Store.
func (u *unavailableStore) ProcessCounts(ctx context.Context, now time.Time) ([]ProcessCount, error) {
	v, err := u.s.ProcessCounts(ctx, now)
	return v, u.check(err)
}

// ProcessPrune implements Store.
func (u *unavailableStore) ProcessPrune(ctx context.Context, p ProcessPruneParams) (int64, error) {
	v, err := u.s.ProcessPrune(ctx, p)
	return v, u.check(err)
}

// TaskEnqueue implements Store.
func (u *unavailableStore) TaskEnqueue(ctx context.Context, p TaskEnqueueParams) (*vigiltype.Task, error) {
	v, err := u.s.TaskEnqueue(ctx, p)
	return v, u.check(err)
}

// TaskGet implements Store.
func (u *unavailableStore) TaskGet(ctx context.Context, taskID int64) (*vigiltype.Task, error) {
	v, err := u.s.TaskGet(ctx, taskID)
	return v, u.check(err)
}

// TaskList implements Store.
func (u *unavailableStore) TaskList(ctx context.Context, p TaskListParams) ([]*vigiltype.Task, error) {
	v, err := u.s.TaskList(ctx, p)
	return v, u.check(err)
}

// TaskClaim implements Store.
func (u *unavailableStore) TaskClaim(ctx context.Context, p TaskClaimParams) (*vigiltype.Task, error) {
	v, err := u.s.TaskClaim(ctx, p)
	return v, u.check(err)
}

// TaskClaimBatch implements Store.
func (u *unavailableStore) TaskClaimBatch(ctx context.Context, p TaskClaimBatchParams) ([]*vigiltype.Task, error) {
	v, err := u.s.TaskClaimBatch(ctx, p)
	return v, u.check(err)
}

// TaskHeartbeat implements Store.
func (u *unavailableStore) TaskHeartbeat(ctx context.Context, p TaskHeartbeatParams) (*vigiltype.Task, error) {
	v, err := u.s.TaskHeartbeat(ctx, p)
	return v, u.check(err)
}

// TaskComplete implements Store.
func (u *unavailableStore) TaskComplete(ctx context.Context, p TaskCompleteParams) (*vigiltype.Task, error) {
	v, err := u.s.TaskComplete(ctx, p)
	return v, u.check(err)
}

// TaskCompleteBatch implements Store.
func (u *unavailableStore) TaskCompleteBatch(ctx context.Context, items []TaskCompleteParams) ([]TaskCompleteResult, error) {
	v, err := u.s.TaskCompleteBatch(ctx, items)
	return v, u.check(err)
}

// TaskFail implements Store.
func (u *unavailableStore) TaskFail(ctx context.Context, p TaskFailParams) (*vigiltype.Task, error) {
	v, err := u.s.TaskFail(ctx, p)
	return v, u.check(err)
}

// TaskRelease implements Store.
func (u *unavailableStore) TaskRelease(ctx context.Context, p TaskReleaseParams) (*vigiltype.Task, error) {
	v, err := u.s.TaskRelease(ctx, p)
	return v, u.check(err)
}

// TaskReclaim implements Store.
func (u *unavailableStore) TaskReclaim(ctx context.Context, p TaskReclaimParams) ([]*vigiltype.Task, error) {
	v, err := u.s.TaskReclaim(ctx, p)
	return v, u.check(err)
}

// StorePulse implements Store.
func (u *unavailableStore) StorePulse(ctx context.Context, p StorePulseParams) (*StorePulseResult, error) {
	v, err := u.s.StorePulse(ctx, p)
	return v, u.check(err)
}

// TaskListStalled implements Store.
func (u *unavailableStore) TaskListStalled(ctx context.Context, p TaskListStalledParams) ([]*vigiltype.Task, error) {
	v, err := u.s.TaskListStalled(ctx, p)
	return v, u.check(err)
}

// TaskReclaimStalled implements Store.
func (u *unavailableStore) TaskReclaimStalled(ctx context.Context, p TaskReclaimStalledParams) (*vigiltype.Task, error) {
	v, err := u.s.TaskReclaimStalled(ctx, p)
	return v, u.check(err)
}

// HeartbeatVersionList implements Store.
func (u *unavailableStore) HeartbeatVersionList(ctx context.Context, since time.Time) ([]*vigiltype.HeartbeatVersion, error) {
	v, err := u.s.HeartbeatVersionList(ctx, since)
	return v, u.check(err)
}

// AgentRegister implements Store.
func (u *unavailableStore) AgentRegister(ctx context.Context, p AgentRegisterParams) (*vigiltype.Agent, error) {
	v, err := u.s.AgentRegister(ctx, p)
	return v, u.check(err)
}

// AgentGet implements Store.
func (u *unavailableStore) AgentGet(ctx context.Context, name string) (*vigiltype.Agent, error) {
	v, err := u.s.AgentGet(ctx, name)
	return v, u.check(err)
}

// AgentList implements Store.
func (u *unavailableStore) AgentList(ctx context.Context) ([]*vigiltype.Agent, error) {
	v, err := u.s.AgentList(ctx)
	return v, u.check(err)
}

// AgentUpdate implements Store.
func (u *unavailableStore) AgentUpdate(ctx context.Context, p AgentUpdateParams) (*vigiltype.Agent, error) {
	v, err := u.s.AgentUpdate(ctx, p)
	return v, u.check(err)
}

// AgentSetStatus implements Store.
func (u *unavailableStore) AgentSetStatus(ctx context.Context, name string, status vigiltype.AgentStatus, now time.Time) (*vigiltype.Agent, error) {
	v, err := u.s.AgentSetStatus(ctx, name, status, now)
	return v, u.check(err)
}

// EventRecord implements Store.
func (u *unavailableStore) EventRecord(ctx context.Context, p EventRecordParams) (*vigiltype.ProcessEvent, error) {
	v, err := u.s.EventRecord(ctx, p)
	return v, u.check(err)
}

// EventList implements Store.
func (u *unavailableStore) EventList(ctx context.Context, p EventListParams) ([]*vigiltype.ProcessEvent, error) {
	v, err := u.s.EventList(ctx, p)
	return v, u.check(err)
}

// EventAck implements Store.
func (u *unavailableStore) EventAck(ctx context.Context, eventID int64, kind string, now time.Time) (*vigiltype.ProcessEvent, error) {
	v, err := u.s.EventAck(ctx, eventID, kind, now)
	return v, u.check(err)
}

// PlannedStopWrite implements Store.
func (u *unavailableStore) PlannedStopWrite(ctx context.Context, p PlannedStopParams) (*vigiltype.PlannedStop, error) {
	v, err := u.s.PlannedStopWrite(ctx, p)
	return v, u.check(err)
}

// PlannedStopGet implements Store.
func (u *unavailableStore) PlannedStopGet(ctx context.Context, agent string, now time.Time) (*vigiltype.PlannedStop, error) {
	v, err := u.s.PlannedStopGet(ctx, agent, now)
	return v, u.check(err)
}

// SweeperRecord implements Store.
func (u *unavailableStore) SweeperRecord(ctx context.Context, s *vigiltype.Sweeper) error {
	return u.check(u.s.SweeperRecord(ctx, s))
}

// SweeperList implements Store.
func (u *unavailableStore) SweeperList(ctx context.Context) ([]*vigiltype.Sweeper, error) {
	v, err := u.s.SweeperList(ctx)
	return v, u.check(err)
}

// Close implements Store.
func (u *unavailableStore) Close() error {
	return u.check(u.s.Close())
}
