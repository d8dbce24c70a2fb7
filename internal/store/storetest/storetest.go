// Package storetest is the conformance suite for store.Store: the behaviour
// every storage backend must show, checked only through the interface. Each
// backend runs it unchanged from its own tests:
//
//	func TestStore(t *testing.T) {
//		storetest.Exercise(t.Context(), t, func(t *testing.T) store.Store {
//			return openFreshStore(t) // closed by t.Cleanup
//		})
//	}
//
// The suite is the storage spec: every change to the store interface or its
// rules extends it first. Tests pass "now" explicitly everywhere, so nothing
// depends on a clock, and compare times at the store's millisecond precision.
package storetest

import (
	"cmp"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// Exercise runs the whole suite against the backend newStore builds.
// newStore must return a fresh, empty store for the test it is given and
// close it when that test ends (t.Cleanup); subtests call it in parallel.
func Exercise(ctx context.Context, t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("Process", func(t *testing.T) { exerciseProcess(ctx, t, newStore) })
	t.Run("HeartbeatBatch", func(t *testing.T) { exerciseHeartbeatBatch(ctx, t, newStore) })
	t.Run("Task", func(t *testing.T) { exerciseTask(ctx, t, newStore) })
	t.Run("ClaimPick", func(t *testing.T) { exerciseClaimPick(ctx, t, newStore) })
	t.Run("ClaimBatch", func(t *testing.T) { exerciseClaimBatch(ctx, t, newStore) })
	t.Run("CompleteBatch", func(t *testing.T) { exerciseCompleteBatch(ctx, t, newStore) })
	t.Run("RepeatedOutcome", func(t *testing.T) { exerciseRepeatedOutcome(ctx, t, newStore) })
	t.Run("HeartbeatVersion", func(t *testing.T) { exerciseHeartbeatVersion(ctx, t, newStore) })
	t.Run("Sweeper", func(t *testing.T) { exerciseSweeper(ctx, t, newStore) })
	t.Run("Agent", func(t *testing.T) { exerciseAgent(ctx, t, newStore) })
	t.Run("Event", func(t *testing.T) { exerciseEvent(ctx, t, newStore) })
	t.Run("Pulse", func(t *testing.T) { exercisePulse(ctx, t, newStore) })
}

// t0 is the suite's reference instant; tests express every time as t0 plus
// an offset.
var t0 = time.Date(2026, time.March, 14, 9, 26, 53, 0, time.UTC)

// at returns t0 + d.
func at(d time.Duration) time.Time { return t0.Add(d) }

// storedTimeLayout is the text form a stored time takes inside reasons such
// as last_error (UTC, millisecond precision).
const storedTimeLayout = "2006-01-02T15:04:05.000Z"

// defaultLease is the server-wide lease window the tests claim with.
const defaultLease = 5 * time.Minute

// testBundle is what one test works with: its own empty store.
type testBundle struct {
	ctx context.Context
	s   store.Store
}

func setup(ctx context.Context, t *testing.T, newStore func(t *testing.T) store.Store) *testBundle {
	t.Helper()
	return &testBundle{ctx: ctx, s: newStore(t)}
}

// tokenHash is the token hash the builders register an instance with.
func tokenHash(instanceID string) string { return "token-hash-of-" + instanceID }

// register inserts a process instance, filling unset fields: a random
// instance id, tokenHash(id), kind "worker", host "host-a", pid 4242, a 30s
// liveness interval and Now = t0.
func (b *testBundle) register(t *testing.T, p store.ProcessRegisterParams) *vigiltype.Process {
	t.Helper()
	p.InstanceID = cmp.Or(p.InstanceID, uuid.NewString())
	p.TokenHash = cmp.Or(p.TokenHash, tokenHash(p.InstanceID))
	p.ProcessKind = cmp.Or(p.ProcessKind, "worker")
	p.Hostname = cmp.Or(p.Hostname, "host-a")
	p.PID = cmp.Or(p.PID, 4242)
	p.LivenessIntervalS = cmp.Or(p.LivenessIntervalS, 30)
	p.Now = cmp.Or(p.Now, t0)
	proc, err := b.s.ProcessRegister(b.ctx, p)
	require.NoError(t, err)
	return proc
}

// exit marks an instance registered by register as exited at now.
func (b *testBundle) exit(t *testing.T, instanceID string, now time.Time) *vigiltype.Process {
	t.Helper()
	proc, err := b.s.ProcessMarkExited(b.ctx, store.ProcessMarkExitedParams{
		InstanceID: instanceID, TokenHash: tokenHash(instanceID), Now: now,
	})
	require.NoError(t, err)
	return proc
}

// get returns an instance with its status at now.
func (b *testBundle) get(t *testing.T, instanceID string, now time.Time) *vigiltype.Process {
	t.Helper()
	proc, err := b.s.ProcessGet(b.ctx, instanceID, now)
	require.NoError(t, err)
	return proc
}

// enqueue inserts a task, filling unset fields: type "email", 3 attempts,
// 3 reclaims, RunAfter = Now = t0. (MaxReclaims 0 needs a direct call.)
func (b *testBundle) enqueue(t *testing.T, p store.TaskEnqueueParams) *vigiltype.Task {
	t.Helper()
	p.TaskType = cmp.Or(p.TaskType, "email")
	p.MaxAttempts = cmp.Or(p.MaxAttempts, 3)
	p.MaxReclaims = cmp.Or(p.MaxReclaims, 3)
	p.RunAfter = cmp.Or(p.RunAfter, t0)
	p.Now = cmp.Or(p.Now, t0)
	task, err := b.s.TaskEnqueue(b.ctx, p)
	require.NoError(t, err)
	return task
}

// claim claims a task of types (default "email") for instanceID at now
// with the default lease and requires that one was claimable.
func (b *testBundle) claim(t *testing.T, instanceID string, now time.Time, types ...string) *vigiltype.Task {
	t.Helper()
	task := b.tryClaim(t, instanceID, now, types...)
	require.NotNil(t, task, "nothing claimable")
	return task
}

// tryClaim is claim that allows nothing claimable (nil).
func (b *testBundle) tryClaim(t *testing.T, instanceID string, now time.Time, types ...string) *vigiltype.Task {
	t.Helper()
	if len(types) == 0 {
		types = []string{"email"}
	}
	task, err := b.s.TaskClaim(b.ctx, store.TaskClaimParams{
		InstanceID: instanceID, Types: types, LeaseTimeout: defaultLease, Now: now,
	})
	require.NoError(t, err)
	return task
}

// claimByID claims task taskID for instanceID at now with the default
// lease (store.TaskClaimParams.TaskID).
func (b *testBundle) claimByID(instanceID string, taskID int64, now time.Time) (*vigiltype.Task, error) {
	return b.s.TaskClaim(b.ctx, store.TaskClaimParams{
		InstanceID: instanceID, TaskID: taskID, LeaseTimeout: defaultLease, Now: now,
	})
}

// heartbeat sends a lease heartbeat and requires that it was accepted.
func (b *testBundle) heartbeat(t *testing.T, p store.TaskHeartbeatParams) *vigiltype.Task {
	t.Helper()
	task, err := b.s.TaskHeartbeat(b.ctx, p)
	require.NoError(t, err)
	return task
}

// getTask returns a task.
func (b *testBundle) getTask(t *testing.T, taskID int64) *vigiltype.Task {
	t.Helper()
	task, err := b.s.TaskGet(b.ctx, taskID)
	require.NoError(t, err)
	return task
}

// reclaim runs one unbounded reclaim pass at now.
func (b *testBundle) reclaim(t *testing.T, now time.Time) []*vigiltype.Task {
	t.Helper()
	tasks, err := b.s.TaskReclaim(b.ctx, store.TaskReclaimParams{Now: now})
	require.NoError(t, err)
	return tasks
}

// requireCurrentTask checks an instance's current task fields: taskID 0
// means none.
func (b *testBundle) requireCurrentTask(t *testing.T, instanceID string, taskID int64, taskType string) {
	t.Helper()
	proc := b.get(t, instanceID, t0)
	if taskID == 0 {
		require.Nil(t, proc.CurrentTaskID, "current_task_id")
		require.Nil(t, proc.CurrentTaskType, "current_task_type")
		return
	}
	require.Equal(t, &taskID, proc.CurrentTaskID, "current_task_id")
	require.Equal(t, &taskType, proc.CurrentTaskType, "current_task_type")
}

// leaseOf is the lease a claimed task is held under.
func leaseOf(task *vigiltype.Task) store.TaskLease {
	return store.TaskLease{TaskID: task.TaskID, Epoch: task.LeaseEpoch, InstanceID: *task.LeaseOwner}
}

// ptr returns a pointer to v.
func ptr[T any](v T) *T { return &v }

// requireTaskEqual compares two tasks, the JSON fields by meaning (a
// backend may store JSON normalised) and the rest exactly.
func requireTaskEqual(t *testing.T, want, got *vigiltype.Task) {
	t.Helper()
	require.NotNil(t, got)
	requireJSONEq(t, want.Payload, got.Payload, "payload")
	requireJSONEq(t, want.Result, got.Result, "result")
	w, g := *want, *got
	w.Payload, w.Result, g.Payload, g.Result = nil, nil, nil, nil
	require.Equal(t, w, g)
}

// requireJSONEq compares JSON documents by meaning; nil means SQL NULL.
func requireJSONEq(t *testing.T, want, got json.RawMessage, field string) {
	t.Helper()
	if want == nil {
		require.Nil(t, got, field)
		return
	}
	require.JSONEq(t, string(want), string(got), field)
}
