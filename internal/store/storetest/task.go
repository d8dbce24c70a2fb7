package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// exerciseTask covers the tasks table: the outbox, claims, the lease calls
// with their epoch fencing, reclaiming (DESIGN T1-T3, L6) and stall
// reclaims (DESIGN S4).
func exerciseTask(ctx context.Context, t *testing.T, newStore func(t *testing.T) store.Store) {
	exerciseTaskClaimByID(ctx, t, newStore)
	exerciseTaskActivity(ctx, t, newStore)
	exerciseTaskStall(ctx, t, newStore)

	t.Run("EnqueueAndGet", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		task, err := b.s.TaskEnqueue(ctx, store.TaskEnqueueParams{
			TaskType:     "email",
			Payload:      json.RawMessage(`{"to": "ops@example.com", "n": [1, 2]}`),
			MaxAttempts:  5,
			MaxReclaims:  2,
			LeaseTimeout: 1500 * time.Millisecond,
			RunAfter:     at(time.Minute),
			Now:          t0.Add(999 * time.Microsecond), // kept as t0
		})
		require.NoError(t, err)
		require.NotZero(t, task.TaskID)
		want := &vigiltype.Task{
			TaskID:        task.TaskID,
			TaskType:      "email",
			Payload:       json.RawMessage(`{"to": "ops@example.com", "n": [1, 2]}`),
			Status:        vigiltype.TaskScheduled,
			MaxAttempts:   5,
			MaxReclaims:   2,
			LeaseTimeoutS: 1.5,
			RunAfter:      at(time.Minute),
			CreatedAt:     t0,
			UpdatedAt:     t0,
		}
		requireTaskEqual(t, want, task)
		requireTaskEqual(t, want, b.getTask(t, task.TaskID))

		// No payload is an empty object.
		task = b.enqueue(t, store.TaskEnqueueParams{})
		require.JSONEq(t, `{}`, string(task.Payload))
		require.Zero(t, task.LeaseTimeoutS)

		_, err = b.s.TaskGet(ctx, 999999)
		require.ErrorIs(t, err, vigiltype.ErrNotFound)
	})

	t.Run("EnqueueInvalidPayload", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		_, err := b.s.TaskEnqueue(ctx, store.TaskEnqueueParams{
			TaskType: "email", Payload: json.RawMessage(`{"to":`), MaxAttempts: 1, MaxReclaims: 1, RunAfter: t0, Now: t0,
		})
		require.ErrorIs(t, err, vigiltype.ErrInvalid)
		tasks, err := b.s.TaskList(ctx, store.TaskListParams{})
		require.NoError(t, err)
		require.Empty(t, tasks)
	})

	t.Run("List", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w"})
		var ids []int64
		for _, typ := range []string{"a", "b", "a", "b", "a"} {
			ids = append(ids, b.enqueue(t, store.TaskEnqueueParams{TaskType: typ}).TaskID)
		}
		running := b.claim(t, "w", t0, "b") // ids[1]
		require.Equal(t, ids[1], running.TaskID)

		for _, tt := range []struct {
			name   string
			params store.TaskListParams
			want   []int64
		}{
			{"All", store.TaskListParams{}, []int64{ids[4], ids[3], ids[2], ids[1], ids[0]}},
			{"Type", store.TaskListParams{TaskType: "a"}, []int64{ids[4], ids[2], ids[0]}},
			{"Status", store.TaskListParams{Status: vigiltype.TaskRunning}, []int64{ids[1]}},
			{"StatusAndType", store.TaskListParams{Status: vigiltype.TaskScheduled, TaskType: "b"}, []int64{ids[3]}},
			{"BeforeID", store.TaskListParams{BeforeID: ids[3]}, []int64{ids[2], ids[1], ids[0]}},
			{"Limit", store.TaskListParams{Limit: 2}, []int64{ids[4], ids[3]}},
			{"BeforeIDAndLimit", store.TaskListParams{BeforeID: ids[3], Limit: 2}, []int64{ids[2], ids[1]}},
			{"NoMatch", store.TaskListParams{Status: vigiltype.TaskCompleted}, nil},
		} {
			t.Run(tt.name, func(t *testing.T) {
				tasks, err := b.s.TaskList(ctx, tt.params)
				require.NoError(t, err)
				require.Equal(t, tt.want, taskIDs(tasks))
			})
		}
	})

	t.Run("ClaimOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		t1 := b.enqueue(t, store.TaskEnqueueParams{RunAfter: at(2 * time.Second)})
		t2 := b.enqueue(t, store.TaskEnqueueParams{RunAfter: t0})
		t3 := b.enqueue(t, store.TaskEnqueueParams{RunAfter: at(time.Second)})
		t4 := b.enqueue(t, store.TaskEnqueueParams{RunAfter: t0})
		future := b.enqueue(t, store.TaskEnqueueParams{RunAfter: at(time.Hour)})

		// Oldest run_after first, then lowest id; run_after is inclusive.
		require.Equal(t, t2.TaskID, b.claim(t, "w", at(time.Second)).TaskID)
		require.Equal(t, t4.TaskID, b.claim(t, "w", at(time.Second)).TaskID)
		require.Equal(t, t3.TaskID, b.claim(t, "w", at(time.Second)).TaskID)
		require.Nil(t, b.tryClaim(t, "w", at(2*time.Second-time.Millisecond)))
		require.Equal(t, t1.TaskID, b.claim(t, "w", at(2*time.Second)).TaskID)
		require.Nil(t, b.tryClaim(t, "w", at(time.Hour-time.Millisecond)))
		require.Equal(t, future.TaskID, b.claim(t, "w", at(time.Hour)).TaskID)
		require.Nil(t, b.tryClaim(t, "w", at(2*time.Hour)))
	})

	t.Run("ClaimTypes", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w"})
		a := b.enqueue(t, store.TaskEnqueueParams{TaskType: "a"})
		bb := b.enqueue(t, store.TaskEnqueueParams{TaskType: "b"})
		c := b.enqueue(t, store.TaskEnqueueParams{TaskType: "c"})

		require.Equal(t, c.TaskID, b.claim(t, "w", t0, "c").TaskID)
		require.Nil(t, b.tryClaim(t, "w", t0, "x", "c"))
		require.Equal(t, a.TaskID, b.claim(t, "w", t0, "b", "a").TaskID)
		require.Equal(t, bb.TaskID, b.claim(t, "w", t0, "b", "a").TaskID)

		_, err := b.s.TaskClaim(ctx, store.TaskClaimParams{InstanceID: "w", LeaseTimeout: defaultLease, Now: t0})
		require.ErrorIs(t, err, vigiltype.ErrInvalid)
	})

	t.Run("ClaimTakesLease", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w"})
		first := b.enqueue(t, store.TaskEnqueueParams{})
		own := b.enqueue(t, store.TaskEnqueueParams{TaskType: "report", LeaseTimeout: 1500 * time.Millisecond})

		now := at(time.Second)
		claimed := b.claim(t, "w", now)
		want := *first
		want.Status = vigiltype.TaskRunning
		want.LeaseOwner = ptr("w")
		want.LeaseEpoch = 1
		want.StartedAt = ptr(now)
		want.LastHeartbeatAt = ptr(now)
		want.LeaseExpiresAt = ptr(now.Add(defaultLease)) // the server's window
		want.LastActivityAt = ptr(now)                   // the claim is the first evidence of progress
		want.UpdatedAt = now
		requireTaskEqual(t, &want, claimed)
		requireTaskEqual(t, &want, b.getTask(t, first.TaskID))
		b.requireCurrentTask(t, "w", first.TaskID, "email")

		// A task with its own window uses it; the latest claim is the
		// instance's current task.
		claimed = b.claim(t, "w", now, "report")
		require.Equal(t, own.TaskID, claimed.TaskID)
		require.Equal(t, ptr(now.Add(1500*time.Millisecond)), claimed.LeaseExpiresAt)
		b.requireCurrentTask(t, "w", own.TaskID, "report")
	})

	t.Run("ClaimRefusedForMissingOrStoppedInstance", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		task := b.enqueue(t, store.TaskEnqueueParams{})
		claim := func(id string, now time.Time) error {
			_, err := b.s.TaskClaim(ctx, store.TaskClaimParams{
				InstanceID: id, Types: []string{"email"}, LeaseTimeout: defaultLease, Now: now,
			})
			return err
		}
		require.ErrorIs(t, claim("nobody", t0), vigiltype.ErrNotFound)

		b.register(t, store.ProcessRegisterParams{InstanceID: "exited"})
		b.exit(t, "exited", t0)
		require.ErrorIs(t, claim("exited", t0), vigiltype.ErrInstanceExited)

		// Interval 1s: alive through t0+3s, stopped after.
		b.register(t, store.ProcessRegisterParams{InstanceID: "silent", LivenessIntervalS: 1})
		require.ErrorIs(t, claim("silent", at(3*time.Second+time.Millisecond)), vigiltype.ErrInstanceStopped)

		// Nothing was half-claimed.
		requireTaskEqual(t, task, b.getTask(t, task.TaskID))
		b.requireCurrentTask(t, "silent", 0, "")

		require.Equal(t, task.TaskID, b.claim(t, "silent", at(3*time.Second)).TaskID)
	})

	t.Run("Heartbeat", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{})
		b.enqueue(t, store.TaskEnqueueParams{TaskType: "report", LeaseTimeout: 2 * time.Second})
		claimed := b.claim(t, "w", t0)

		now := at(time.Minute)
		task, err := b.s.TaskHeartbeat(ctx, store.TaskHeartbeatParams{
			TaskLease: leaseOf(claimed), LeaseTimeout: 10 * time.Minute, SchemaVersion: 1, Now: now,
		})
		require.NoError(t, err)
		want := *claimed
		want.LastHeartbeatAt = ptr(now)
		want.HeartbeatSchemaVersion = 1
		want.LeaseExpiresAt = ptr(now.Add(10 * time.Minute))
		want.UpdatedAt = now
		requireTaskEqual(t, &want, task)
		requireTaskEqual(t, &want, b.getTask(t, claimed.TaskID))

		// The task's own window wins over the server's.
		own := b.claim(t, "w", t0, "report")
		task, err = b.s.TaskHeartbeat(ctx, store.TaskHeartbeatParams{
			TaskLease: leaseOf(own), LeaseTimeout: 10 * time.Minute, SchemaVersion: 1, Now: now,
		})
		require.NoError(t, err)
		require.Equal(t, ptr(now.Add(2*time.Second)), task.LeaseExpiresAt)
	})

	t.Run("StaleEpochRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		b.register(t, store.ProcessRegisterParams{InstanceID: "other", LivenessIntervalS: 3600})
		now := at(time.Second)
		ops := map[string]func(l store.TaskLease) error{
			"Heartbeat": func(l store.TaskLease) error {
				_, err := b.s.TaskHeartbeat(ctx, store.TaskHeartbeatParams{
					TaskLease: l, LeaseTimeout: defaultLease, SchemaVersion: 2, ActivityAt: &now, Now: now,
				})
				return err
			},
			"Complete": func(l store.TaskLease) error {
				_, err := b.s.TaskComplete(ctx, store.TaskCompleteParams{TaskLease: l, Result: json.RawMessage(`1`), Now: now})
				return err
			},
			"Fail": func(l store.TaskLease) error {
				_, err := b.s.TaskFail(ctx, store.TaskFailParams{TaskLease: l, Error: "boom", RetryAt: now, Now: now})
				return err
			},
			"Release": func(l store.TaskLease) error {
				_, err := b.s.TaskRelease(ctx, store.TaskReleaseParams{TaskLease: l, Now: now})
				return err
			},
		}
		for name, op := range ops {
			t.Run(name, func(t *testing.T) {
				typ := "stale-" + name // a task per op
				b.enqueue(t, store.TaskEnqueueParams{TaskType: typ})
				held := b.claim(t, "w", t0, typ)
				lease := leaseOf(held)
				before := b.getTask(t, held.TaskID)

				for _, stale := range []store.TaskLease{
					{TaskID: lease.TaskID, Epoch: lease.Epoch + 1, InstanceID: "w"},
					{TaskID: lease.TaskID, Epoch: lease.Epoch - 1, InstanceID: "w"},
					{TaskID: lease.TaskID, Epoch: lease.Epoch, InstanceID: "other"},
				} {
					require.ErrorIs(t, op(stale), vigiltype.ErrStaleEpoch, "%+v", stale)
					requireTaskEqual(t, before, b.getTask(t, held.TaskID))
				}
				b.requireCurrentTask(t, "w", held.TaskID, typ)

				require.ErrorIs(t, op(store.TaskLease{TaskID: 999999, Epoch: 1, InstanceID: "w"}), vigiltype.ErrNotFound)

				// Once the lease has ended, the right epoch is stale too.
				_, err := b.s.TaskRelease(ctx, store.TaskReleaseParams{TaskLease: lease, Now: now})
				require.NoError(t, err)
				released := b.getTask(t, held.TaskID)
				require.ErrorIs(t, op(lease), vigiltype.ErrStaleEpoch)
				requireTaskEqual(t, released, b.getTask(t, held.TaskID))
			})
		}
	})

	t.Run("Complete", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{})
		b.enqueue(t, store.TaskEnqueueParams{})
		claimed := b.claim(t, "w", t0)

		// Invalid JSON is refused and changes nothing.
		_, err := b.s.TaskComplete(ctx, store.TaskCompleteParams{
			TaskLease: leaseOf(claimed), Result: json.RawMessage(`{`), Now: at(time.Second),
		})
		require.ErrorIs(t, err, vigiltype.ErrInvalid)
		requireTaskEqual(t, claimed, b.getTask(t, claimed.TaskID))

		now := at(2 * time.Second)
		task, err := b.s.TaskComplete(ctx, store.TaskCompleteParams{
			TaskLease: leaseOf(claimed), Result: json.RawMessage(`{"ok": true}`), Now: now,
		})
		require.NoError(t, err)
		want := *claimed
		want.Status = vigiltype.TaskCompleted
		want.Result = json.RawMessage(`{"ok": true}`)
		want.CompletedBy = ptr("w")
		want.CompletedAt = ptr(now)
		want.LeaseOwner = nil
		want.LeaseExpiresAt = nil
		want.UpdatedAt = now
		requireTaskEqual(t, &want, task)
		requireTaskEqual(t, &want, b.getTask(t, claimed.TaskID))
		b.requireCurrentTask(t, "w", 0, "")

		// No result is NULL. Completing a task that is not the instance's
		// current one leaves the current one alone.
		second := b.claim(t, "w", now)
		b.enqueue(t, store.TaskEnqueueParams{})
		third := b.claim(t, "w", now)
		task, err = b.s.TaskComplete(ctx, store.TaskCompleteParams{TaskLease: leaseOf(second), Now: now})
		require.NoError(t, err)
		require.Nil(t, task.Result)
		b.requireCurrentTask(t, "w", third.TaskID, "email")
	})

	t.Run("Fail", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{MaxAttempts: 2})
		claimed := b.claim(t, "w", t0)

		// First failure: back to scheduled at RetryAt, attempt counted.
		now := at(time.Second)
		task, err := b.s.TaskFail(ctx, store.TaskFailParams{
			TaskLease: leaseOf(claimed), Error: "boom", RetryAt: at(11 * time.Second), Now: now,
		})
		require.NoError(t, err)
		want := *claimed
		want.Status = vigiltype.TaskScheduled
		want.Attempts = 1
		want.RunAfter = at(11 * time.Second)
		want.LastError = ptr("boom")
		want.LeaseOwner = nil
		want.LeaseExpiresAt = nil
		want.StartedAt = nil
		want.UpdatedAt = now
		requireTaskEqual(t, &want, task)
		b.requireCurrentTask(t, "w", 0, "")

		require.Nil(t, b.tryClaim(t, "w", at(11*time.Second-time.Millisecond)))
		claimed = b.claim(t, "w", at(11*time.Second))
		require.EqualValues(t, 2, claimed.LeaseEpoch)

		// Second failure reaches max_attempts: dead letter, not claimable.
		now = at(12 * time.Second)
		task, err = b.s.TaskFail(ctx, store.TaskFailParams{
			TaskLease: leaseOf(claimed), Error: "boom again", RetryAt: at(20 * time.Second), Now: now,
		})
		require.NoError(t, err)
		require.Equal(t, vigiltype.TaskDeadLetter, task.Status)
		require.Equal(t, 2, task.Attempts)
		require.Equal(t, ptr("boom again"), task.LastError)
		require.Nil(t, task.LeaseOwner)
		require.EqualValues(t, 2, task.LeaseEpoch)
		b.requireCurrentTask(t, "w", 0, "")
		require.Nil(t, b.tryClaim(t, "w", at(time.Hour)))
	})

	t.Run("Release", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{RunAfter: t0})
		claimed := b.claim(t, "w", t0)

		now := at(time.Second)
		task, err := b.s.TaskRelease(ctx, store.TaskReleaseParams{TaskLease: leaseOf(claimed), Now: now})
		require.NoError(t, err)
		want := *claimed
		want.Status = vigiltype.TaskScheduled
		want.RunAfter = now
		want.LeaseOwner = nil
		want.LeaseExpiresAt = nil
		want.StartedAt = nil
		want.UpdatedAt = now
		requireTaskEqual(t, &want, task)
		require.Zero(t, task.Attempts)
		b.requireCurrentTask(t, "w", 0, "")

		again := b.claim(t, "w", now)
		require.Equal(t, claimed.TaskID, again.TaskID)
		require.EqualValues(t, 2, again.LeaseEpoch)
	})

	t.Run("ReclaimExpiredLease", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{})
		claimed := b.claim(t, "w", t0)
		expiry := t0.Add(defaultLease)

		require.Empty(t, b.reclaim(t, expiry)) // expires after, not at, lease_expires_at

		now := expiry.Add(time.Millisecond)
		tasks := b.reclaim(t, now)
		require.Len(t, tasks, 1)
		want := *claimed
		want.Status = vigiltype.TaskScheduled
		want.Reclaims = 1
		want.RunAfter = now
		want.LeaseOwner = nil
		want.LeaseExpiresAt = nil
		want.StartedAt = nil
		want.UpdatedAt = now
		want.LastError = ptr("lease expired at " + expiry.Format(storedTimeLayout) + ": holder w last renewed it at " + t0.Format(storedTimeLayout))
		requireTaskEqual(t, &want, tasks[0])
		requireTaskEqual(t, &want, b.getTask(t, claimed.TaskID))
		b.requireCurrentTask(t, "w", 0, "")

		// The old holder is fenced off; the task is claimable again at a
		// higher epoch.
		_, err := b.s.TaskHeartbeat(ctx, store.TaskHeartbeatParams{
			TaskLease: leaseOf(claimed), LeaseTimeout: defaultLease, SchemaVersion: 1, Now: now,
		})
		require.ErrorIs(t, err, vigiltype.ErrStaleEpoch)
		again := b.claim(t, "w", now)
		require.Equal(t, claimed.TaskID, again.TaskID)
		require.EqualValues(t, 2, again.LeaseEpoch)
		_, err = b.s.TaskComplete(ctx, store.TaskCompleteParams{TaskLease: leaseOf(claimed), Now: now})
		require.ErrorIs(t, err, vigiltype.ErrStaleEpoch)
		require.Empty(t, b.reclaim(t, now))
	})

	t.Run("ReclaimStoppedHolder", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		// Stopped by its alive window: interval 10s, alive through t0+30s.
		b.register(t, store.ProcessRegisterParams{InstanceID: "silent", LivenessIntervalS: 10})
		b.enqueue(t, store.TaskEnqueueParams{TaskType: "a"})
		silentTask := b.claim(t, "silent", t0, "a")
		require.Empty(t, b.reclaim(t, at(30*time.Second)))
		tasks := b.reclaim(t, at(30*time.Second+time.Millisecond))
		require.Equal(t, []int64{silentTask.TaskID}, taskIDs(tasks))
		require.Equal(t, vigiltype.TaskScheduled, tasks[0].Status)
		require.Equal(t, 1, tasks[0].Reclaims)
		require.Equal(t, ptr("holder silent stopped (exited or missed liveness heartbeats)"), tasks[0].LastError)
		b.requireCurrentTask(t, "silent", 0, "")

		// Exited: reclaimed at once, long before the lease expires.
		b.register(t, store.ProcessRegisterParams{InstanceID: "gone", LivenessIntervalS: 3600, Now: at(time.Minute)})
		b.enqueue(t, store.TaskEnqueueParams{TaskType: "b"})
		goneTask := b.claim(t, "gone", at(time.Minute), "b")
		b.exit(t, "gone", at(time.Minute+time.Second))
		tasks = b.reclaim(t, at(time.Minute+time.Second))
		require.Equal(t, []int64{goneTask.TaskID}, taskIDs(tasks))
		require.Equal(t, ptr("holder gone stopped (exited or missed liveness heartbeats)"), tasks[0].LastError)
	})

	t.Run("ReclaimDeadLetter", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{MaxReclaims: 1})

		// Reclaim 1 of max 1: back to scheduled.
		b.claim(t, "w", t0)
		tasks := b.reclaim(t, at(defaultLease+time.Millisecond))
		require.Len(t, tasks, 1)
		require.Equal(t, vigiltype.TaskScheduled, tasks[0].Status)
		require.Equal(t, 1, tasks[0].Reclaims)

		// Reclaim 2 of max 1: dead letter, reason kept.
		start := at(time.Hour)
		claimed := b.claim(t, "w", start)
		require.EqualValues(t, 2, claimed.LeaseEpoch)
		expiry := start.Add(defaultLease)
		now := expiry.Add(time.Millisecond)
		tasks = b.reclaim(t, now)
		require.Len(t, tasks, 1)
		want := *claimed
		want.Status = vigiltype.TaskDeadLetter
		want.Reclaims = 2
		want.LeaseOwner = nil
		want.LeaseExpiresAt = nil
		want.UpdatedAt = now
		want.LastError = ptr("dead-lettered: reclaimed 2 times (max_reclaims 1): lease expired at " +
			expiry.Format(storedTimeLayout) + ": holder w last renewed it at " + start.Format(storedTimeLayout))
		requireTaskEqual(t, &want, tasks[0])
		require.Nil(t, b.tryClaim(t, "w", at(2*time.Hour)))
		b.requireCurrentTask(t, "w", 0, "")

		// max_reclaims 0: the first reclaim dead-letters.
		zero, err := b.s.TaskEnqueue(ctx, store.TaskEnqueueParams{
			TaskType: "zero", MaxAttempts: 1, MaxReclaims: 0, RunAfter: t0, Now: t0,
		})
		require.NoError(t, err)
		b.register(t, store.ProcessRegisterParams{InstanceID: "gone"})
		b.claim(t, "gone", t0, "zero")
		b.exit(t, "gone", t0)
		tasks = b.reclaim(t, t0)
		require.Equal(t, []int64{zero.TaskID}, taskIDs(tasks))
		require.Equal(t, vigiltype.TaskDeadLetter, tasks[0].Status)
		require.Equal(t, ptr("dead-lettered: reclaimed 1 times (max_reclaims 0): holder gone stopped (exited or missed liveness heartbeats)"),
			tasks[0].LastError)
	})

	t.Run("ReclaimLeavesOthersAlone", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "a", LivenessIntervalS: 3600})
		b.register(t, store.ProcessRegisterParams{InstanceID: "b", LivenessIntervalS: 3600})
		now := at(time.Hour)

		// Completed long before now.
		b.enqueue(t, store.TaskEnqueueParams{TaskType: "done"})
		done := b.claim(t, "a", t0, "done")
		_, err := b.s.TaskComplete(ctx, store.TaskCompleteParams{TaskLease: leaseOf(done), Now: at(time.Second)})
		require.NoError(t, err)
		// Never claimed.
		scheduled := b.enqueue(t, store.TaskEnqueueParams{TaskType: "idle"})
		// Held under a live lease by a live holder.
		b.enqueue(t, store.TaskEnqueueParams{TaskType: "healthy"})
		b.claim(t, "a", now.Add(-time.Minute), "healthy")
		// Reclaimed from a, then claimed again by b: b's lease is fresh.
		b.enqueue(t, store.TaskEnqueueParams{TaskType: "moved"})
		b.claim(t, "a", t0, "moved")
		require.Len(t, b.reclaim(t, at(defaultLease+time.Millisecond)), 1)
		b.claim(t, "b", now.Add(-time.Minute), "moved")

		before, err := b.s.TaskList(ctx, store.TaskListParams{})
		require.NoError(t, err)
		require.Empty(t, b.reclaim(t, now))
		after, err := b.s.TaskList(ctx, store.TaskListParams{})
		require.NoError(t, err)
		require.Equal(t, before, after)
		requireTaskEqual(t, scheduled, b.getTask(t, scheduled.TaskID))
	})

	t.Run("ReclaimLimit", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		for range 3 {
			b.enqueue(t, store.TaskEnqueueParams{})
			b.claim(t, "w", t0)
		}
		now := at(time.Hour)
		first, err := b.s.TaskReclaim(ctx, store.TaskReclaimParams{Now: now, Limit: 2})
		require.NoError(t, err)
		require.Len(t, first, 2)
		rest, err := b.s.TaskReclaim(ctx, store.TaskReclaimParams{Now: now}) // Limit 0: no limit
		require.NoError(t, err)
		require.Len(t, rest, 1)
		require.NotContains(t, taskIDs(first), rest[0].TaskID)
		require.Empty(t, b.reclaim(t, now))
	})

	t.Run("ConcurrentClaims", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		const (
			workers = 8
			tasks   = 200
		)
		for range tasks {
			b.enqueue(t, store.TaskEnqueueParams{})
		}
		for i := range workers {
			b.register(t, store.ProcessRegisterParams{InstanceID: fmt.Sprintf("w%d", i), LivenessIntervalS: 3600})
		}

		// Every worker claims and completes until nothing is left, while a
		// reader lists alongside; no task may be claimed twice.
		now := at(time.Second)
		claimed := make([][]int64, workers)
		errs := make([]error, workers+1)
		stop := make(chan struct{})
		var readers, claimers sync.WaitGroup
		readers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := b.s.TaskList(ctx, store.TaskListParams{Status: vigiltype.TaskRunning}); err != nil {
					errs[workers] = err
					return
				}
			}
		})
		for i := range workers {
			claimers.Go(func() {
				for {
					task, err := b.s.TaskClaim(ctx, store.TaskClaimParams{
						InstanceID: fmt.Sprintf("w%d", i), Types: []string{"email"}, LeaseTimeout: defaultLease, Now: now,
					})
					if err != nil || task == nil {
						errs[i] = err
						return
					}
					claimed[i] = append(claimed[i], task.TaskID)
					if _, err := b.s.TaskComplete(ctx, store.TaskCompleteParams{TaskLease: leaseOf(task), Now: now}); err != nil {
						errs[i] = err
						return
					}
				}
			})
		}
		claimers.Wait()
		close(stop)
		readers.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}

		seen := make(map[int64]bool)
		for _, ids := range claimed {
			for _, id := range ids {
				require.False(t, seen[id], "task %d claimed twice", id)
				seen[id] = true
			}
		}
		require.Len(t, seen, tasks)
		all, err := b.s.TaskList(ctx, store.TaskListParams{})
		require.NoError(t, err)
		for _, task := range all {
			require.Equal(t, vigiltype.TaskCompleted, task.Status)
			require.EqualValues(t, 1, task.LeaseEpoch)
		}
	})

	t.Run("JSONKeptAsGiven", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		// Every document json.Valid accepts is stored and read back with
		// the same meaning, as payload and as result: a \u0000 escape (which
		// PostgreSQL's jsonb would refuse), non-ASCII text, big numbers,
		// a duplicate key, a bare null. A null result is JSON null, not the
		// SQL NULL of "no result".
		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		for i, doc := range []string{
			`{"s": "nul \u0000 here", "t": "tab\t"}`,
			`"π ✓ 😀 \ud83d\ude00"`,
			`[12345678901234567890, -0.0, 1.5e300]`,
			`{"a": 1, "a": 2}`,
			`null`,
		} {
			typ := fmt.Sprintf("json-%d", i)
			task := b.enqueue(t, store.TaskEnqueueParams{TaskType: typ, Payload: json.RawMessage(doc)})
			requireJSONEq(t, json.RawMessage(doc), task.Payload, "payload "+doc)
			requireJSONEq(t, json.RawMessage(doc), b.getTask(t, task.TaskID).Payload, "payload "+doc)

			claimed := b.claim(t, "w", t0, typ)
			done, err := b.s.TaskComplete(ctx, store.TaskCompleteParams{
				TaskLease: leaseOf(claimed), Result: json.RawMessage(doc), Now: t0,
			})
			require.NoError(t, err, doc)
			requireJSONEq(t, json.RawMessage(doc), done.Result, "result "+doc)
			requireJSONEq(t, json.RawMessage(doc), b.getTask(t, task.TaskID).Result, "result "+doc)
		}
	})

	t.Run("ConcurrentReclaims", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		// Several sweepers reclaiming at once, as several servers sharing
		// one database do: each expired lease is reclaimed exactly once.
		const (
			sweepers = 4
			tasks    = 200
		)
		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		for range tasks {
			b.enqueue(t, store.TaskEnqueueParams{})
			b.claim(t, "w", t0)
		}
		now := at(time.Hour)
		reclaimed := make([][]int64, sweepers)
		errs := make([]error, sweepers)
		var wg sync.WaitGroup
		for i := range sweepers {
			wg.Go(func() {
				for {
					got, err := b.s.TaskReclaim(ctx, store.TaskReclaimParams{Now: now, Limit: 10})
					if err != nil || len(got) == 0 {
						errs[i] = err
						return
					}
					reclaimed[i] = append(reclaimed[i], taskIDs(got)...)
				}
			})
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		seen := make(map[int64]bool)
		for _, ids := range reclaimed {
			for _, id := range ids {
				require.False(t, seen[id], "task %d reclaimed twice", id)
				seen[id] = true
			}
		}
		require.Len(t, seen, tasks)
		all, err := b.s.TaskList(ctx, store.TaskListParams{})
		require.NoError(t, err)
		for _, task := range all {
			require.Equal(t, vigiltype.TaskScheduled, task.Status)
			require.Equal(t, 1, task.Reclaims)
		}
		b.requireCurrentTask(t, "w", 0, "")
	})
}

// taskIDs returns the ids of tasks in order.
func taskIDs(tasks []*vigiltype.Task) []int64 {
	var ids []int64
	for _, task := range tasks {
		ids = append(ids, task.TaskID)
	}
	return ids
}

// exerciseTaskClaimByID covers claiming one named task
// (store.TaskClaimParams.TaskID): only while it is scheduled and due, with
// the same lease and instance rules as any claim.
func exerciseTaskClaimByID(ctx context.Context, t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("ClaimByID", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		older := b.enqueue(t, store.TaskEnqueueParams{})
		target := b.enqueue(t, store.TaskEnqueueParams{TaskType: "report", LeaseTimeout: 90 * time.Second})

		// Not the oldest claimable task, and not of a type in Types: the id
		// alone decides.
		now := at(time.Second)
		claimed, err := b.s.TaskClaim(ctx, store.TaskClaimParams{
			InstanceID: "w", TaskID: target.TaskID, Types: []string{"email"}, LeaseTimeout: defaultLease, Now: now,
		})
		require.NoError(t, err)
		want := *target
		want.Status = vigiltype.TaskRunning
		want.LeaseOwner = ptr("w")
		want.LeaseEpoch = 1
		want.StartedAt = ptr(now)
		want.LastHeartbeatAt = ptr(now)
		want.LastActivityAt = ptr(now)
		want.LeaseExpiresAt = ptr(now.Add(90 * time.Second)) // the task's own window
		want.UpdatedAt = now
		requireTaskEqual(t, &want, claimed)
		requireTaskEqual(t, &want, b.getTask(t, target.TaskID))
		b.requireCurrentTask(t, "w", target.TaskID, "report")
		requireTaskEqual(t, older, b.getTask(t, older.TaskID))

		// Without Types; a released task comes back at the next epoch.
		_, err = b.s.TaskRelease(ctx, store.TaskReleaseParams{TaskLease: leaseOf(claimed), Now: at(2 * time.Second)})
		require.NoError(t, err)
		again, err := b.claimByID("w", target.TaskID, at(3*time.Second))
		require.NoError(t, err)
		require.EqualValues(t, 2, again.LeaseEpoch)
		require.Equal(t, ptr(at(3*time.Second)), again.LastActivityAt)
		b.requireCurrentTask(t, "w", target.TaskID, "report")

		// The default window applies to a task without its own.
		claimed, err = b.claimByID("w", older.TaskID, now)
		require.NoError(t, err)
		require.Equal(t, ptr(now.Add(defaultLease)), claimed.LeaseExpiresAt)
	})

	t.Run("ClaimByIDNotClaimable", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		b.register(t, store.ProcessRegisterParams{InstanceID: "other", LivenessIntervalS: 3600})
		now := at(time.Minute)

		running := b.enqueue(t, store.TaskEnqueueParams{TaskType: "running"})
		b.claim(t, "other", t0, "running")
		done := b.enqueue(t, store.TaskEnqueueParams{TaskType: "done"})
		_, err := b.s.TaskComplete(ctx, store.TaskCompleteParams{TaskLease: leaseOf(b.claim(t, "other", t0, "done")), Now: t0})
		require.NoError(t, err)
		dead := b.enqueue(t, store.TaskEnqueueParams{TaskType: "dead", MaxAttempts: 1})
		_, err = b.s.TaskFail(ctx, store.TaskFailParams{
			TaskLease: leaseOf(b.claim(t, "other", t0, "dead")), Error: "boom", RetryAt: t0, Now: t0,
		})
		require.NoError(t, err)
		future := b.enqueue(t, store.TaskEnqueueParams{TaskType: "future", RunAfter: now.Add(time.Millisecond)})
		mine := b.enqueue(t, store.TaskEnqueueParams{TaskType: "mine"})
		b.claim(t, "w", t0, "mine")

		for name, id := range map[string]int64{
			"Running": running.TaskID, "Completed": done.TaskID, "DeadLetter": dead.TaskID,
			"RunAfterLater": future.TaskID, "AlreadyMine": mine.TaskID,
		} {
			t.Run(name, func(t *testing.T) {
				before := b.getTask(t, id)
				task, err := b.claimByID("w", id, now)
				require.ErrorIs(t, err, vigiltype.ErrNotClaimable)
				require.NotErrorIs(t, err, vigiltype.ErrNotFound)
				require.ErrorContains(t, err, fmt.Sprintf("task %d", id))
				require.Nil(t, task)
				requireTaskEqual(t, before, b.getTask(t, id))
			})
		}
		// A refused claim leaves the instance's current task alone.
		b.requireCurrentTask(t, "w", mine.TaskID, "mine")

		_, err = b.claimByID("w", 999999, now)
		require.ErrorIs(t, err, vigiltype.ErrNotFound)
		require.ErrorContains(t, err, "task 999999")
		b.requireCurrentTask(t, "w", mine.TaskID, "mine")

		// run_after is inclusive, as for any claim.
		task, err := b.claimByID("w", future.TaskID, now.Add(time.Millisecond))
		require.NoError(t, err)
		require.Equal(t, future.TaskID, task.TaskID)
	})

	t.Run("ClaimByIDInstanceChecks", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		// The instance is checked as for any claim, before the task: a
		// missing instance is ErrNotFound even for a missing task.
		task := b.enqueue(t, store.TaskEnqueueParams{})
		_, err := b.claimByID("nobody", task.TaskID, t0)
		require.ErrorIs(t, err, vigiltype.ErrNotFound)
		b.register(t, store.ProcessRegisterParams{InstanceID: "exited"})
		b.exit(t, "exited", t0)
		_, err = b.claimByID("exited", task.TaskID, t0)
		require.ErrorIs(t, err, vigiltype.ErrInstanceExited)
		_, err = b.claimByID("exited", 999999, t0)
		require.ErrorIs(t, err, vigiltype.ErrInstanceExited)
		b.register(t, store.ProcessRegisterParams{InstanceID: "silent", LivenessIntervalS: 1})
		_, err = b.claimByID("silent", task.TaskID, at(3*time.Second+time.Millisecond))
		require.ErrorIs(t, err, vigiltype.ErrInstanceStopped)
		requireTaskEqual(t, task, b.getTask(t, task.TaskID))
	})

	t.Run("ConcurrentClaimsByID", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		// Many instances claim the same task at once: exactly one gets it,
		// every other is told it is not claimable.
		const claimers = 8
		task := b.enqueue(t, store.TaskEnqueueParams{})
		for i := range claimers {
			b.register(t, store.ProcessRegisterParams{InstanceID: fmt.Sprintf("w%d", i), LivenessIntervalS: 3600})
		}
		got := make([]*vigiltype.Task, claimers)
		errs := make([]error, claimers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range claimers {
			wg.Go(func() {
				<-start
				got[i], errs[i] = b.claimByID(fmt.Sprintf("w%d", i), task.TaskID, t0)
			})
		}
		close(start)
		wg.Wait()
		var winner string
		for i := range claimers {
			if errs[i] == nil {
				require.Empty(t, winner, "claimed twice")
				winner = fmt.Sprintf("w%d", i)
				require.EqualValues(t, 1, got[i].LeaseEpoch)
				continue
			}
			require.ErrorIs(t, errs[i], vigiltype.ErrNotClaimable)
		}
		require.NotEmpty(t, winner)
		require.Equal(t, &winner, b.getTask(t, task.TaskID).LeaseOwner)
	})
}

// exerciseTaskActivity covers lease heartbeats by schema version and
// activity-gated expiry (DESIGN T4): last_activity_at apart from
// last_heartbeat_at, and leases that expire on activity.
func exerciseTaskActivity(ctx context.Context, t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("HeartbeatV1", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{})
		claimed := b.claim(t, "w", t0)
		require.Equal(t, ptr(t0), claimed.LastActivityAt)
		require.Zero(t, claimed.HeartbeatSchemaVersion) // no heartbeat yet

		// v1 renews the lease from Now and leaves last_activity_at at the
		// claim.
		now := at(time.Minute)
		task := b.heartbeat(t, store.TaskHeartbeatParams{
			TaskLease: leaseOf(claimed), LeaseTimeout: defaultLease, SchemaVersion: 1, Now: now,
		})
		want := *claimed
		want.LastHeartbeatAt = ptr(now)
		want.HeartbeatSchemaVersion = 1
		want.LeaseExpiresAt = ptr(now.Add(defaultLease))
		want.UpdatedAt = now
		requireTaskEqual(t, &want, task)
		requireTaskEqual(t, &want, b.getTask(t, claimed.TaskID))
	})

	t.Run("HeartbeatV2ActivityNeverMovesBack", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{})
		claimed := b.claim(t, "w", t0)
		v2 := func(now, activityAt time.Time) *vigiltype.Task {
			t.Helper()
			return b.heartbeat(t, store.TaskHeartbeatParams{
				TaskLease: leaseOf(claimed), LeaseTimeout: defaultLease, SchemaVersion: 2, ActivityAt: &activityAt, Now: now,
			})
		}

		// Activity moves last_activity_at forward, kept to the millisecond;
		// without ExpireOnActivity the lease still runs from Now.
		now := at(time.Minute)
		task := v2(now, at(50*time.Second+1500*time.Microsecond))
		want := *claimed
		want.LastHeartbeatAt = ptr(now)
		want.LastActivityAt = ptr(at(50*time.Second + time.Millisecond))
		want.HeartbeatSchemaVersion = 2
		want.LeaseExpiresAt = ptr(now.Add(defaultLease))
		want.UpdatedAt = now
		requireTaskEqual(t, &want, task)
		requireTaskEqual(t, &want, b.getTask(t, claimed.TaskID))

		// An older activity (a late or reordered heartbeat), or one before
		// the claim, keeps the newer value.
		for i, activityAt := range []time.Time{at(20 * time.Second), at(-time.Hour)} {
			now := at(time.Duration(2+i) * time.Minute)
			task = v2(now, activityAt)
			require.Equal(t, ptr(at(50*time.Second+time.Millisecond)), task.LastActivityAt, "activity %s", activityAt)
			require.Equal(t, ptr(now), task.LastHeartbeatAt)
		}

		// An activity later than Now (the holder's clock runs ahead) counts
		// as Now.
		now = at(5 * time.Minute)
		task = v2(now, now.Add(time.Minute))
		require.Equal(t, ptr(now), task.LastActivityAt)

		// A v1 heartbeat in between records its version and keeps the
		// activity.
		task = b.heartbeat(t, store.TaskHeartbeatParams{
			TaskLease: leaseOf(claimed), LeaseTimeout: defaultLease, SchemaVersion: 1, Now: at(6 * time.Minute),
		})
		require.Equal(t, 1, task.HeartbeatSchemaVersion)
		require.Equal(t, ptr(now), task.LastActivityAt)
		require.Equal(t, ptr(at(6*time.Minute)), task.LastHeartbeatAt)
	})

	// The activity-only cutover (DESIGN T6): a v1 heartbeat is recorded
	// and counted but does not extend the lease, which runs out on the
	// activity (the claim) plus the window.
	t.Run("HeartbeatV1KeepsExpiry", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)
		const window = 10 * time.Minute
		b.register(t, store.ProcessRegisterParams{InstanceID: "w", Hostname: "legacy-host", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{})
		claimed, err := b.s.TaskClaim(ctx, store.TaskClaimParams{
			InstanceID: "w", Types: []string{"email"}, LeaseTimeout: window, Now: t0,
		})
		require.NoError(t, err)
		for _, now := range []time.Time{at(time.Minute), at(9 * time.Minute)} {
			task := b.heartbeat(t, store.TaskHeartbeatParams{
				TaskLease: leaseOf(claimed), LeaseTimeout: window, SchemaVersion: 1, KeepExpiry: true, Now: now,
			})
			require.Equal(t, claimed.LeaseExpiresAt, task.LeaseExpiresAt, "not extended")
			require.Equal(t, ptr(now), task.LastHeartbeatAt, "recorded")
		}
		versions, err := b.s.HeartbeatVersionList(ctx, t0)
		require.NoError(t, err)
		require.Len(t, versions, 1)
		require.Equal(t, int64(2), versions[0].Heartbeats, "counted per host")
		require.Equal(t, []int64{claimed.TaskID}, taskIDs(b.reclaim(t, at(window+time.Millisecond))))
		_, err = b.s.TaskHeartbeat(ctx, store.TaskHeartbeatParams{
			TaskLease: leaseOf(claimed), LeaseTimeout: window, SchemaVersion: 2, ActivityAt: ptr(at(time.Minute)),
			KeepExpiry: true, Now: at(time.Minute),
		})
		require.ErrorIs(t, err, vigiltype.ErrInvalid, "KeepExpiry is for v1 heartbeats")
	})

	t.Run("HeartbeatExpireOnActivity", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		const window = 30 * time.Minute
		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{})
		claimed, err := b.s.TaskClaim(ctx, store.TaskClaimParams{
			InstanceID: "w", Types: []string{"email"}, LeaseTimeout: window, Now: t0,
		})
		require.NoError(t, err)
		activityAt := at(5 * time.Minute)
		expiry := activityAt.Add(window)

		// Heartbeats keep arriving with the same, stale activity: the lease
		// expires at activity + window however recent the heartbeat.
		for _, now := range []time.Time{at(10 * time.Minute), at(20 * time.Minute), expiry.Add(-time.Millisecond), expiry} {
			task := b.heartbeat(t, store.TaskHeartbeatParams{
				TaskLease: leaseOf(claimed), LeaseTimeout: window, SchemaVersion: 2, ActivityAt: &activityAt,
				ExpireOnActivity: true, Now: now,
			})
			require.Equal(t, ptr(expiry), task.LeaseExpiresAt, "heartbeat at %s", now)
			require.Equal(t, ptr(now), task.LastHeartbeatAt)
			require.Equal(t, ptr(activityAt), task.LastActivityAt)
			require.Empty(t, b.reclaim(t, now))
		}

		// An older activity does not pull the expiry back either: it runs
		// from last_activity_at.
		older := at(time.Minute)
		task := b.heartbeat(t, store.TaskHeartbeatParams{
			TaskLease: leaseOf(claimed), LeaseTimeout: window, SchemaVersion: 2, ActivityAt: &older,
			ExpireOnActivity: true, Now: expiry,
		})
		require.Equal(t, ptr(expiry), task.LeaseExpiresAt)

		// Once Now passes it, the lease is reclaimed although the holder is
		// alive and heartbeating; the activity stays as history.
		now := expiry.Add(time.Millisecond)
		tasks := b.reclaim(t, now)
		require.Equal(t, []int64{claimed.TaskID}, taskIDs(tasks))
		require.Equal(t, vigiltype.TaskScheduled, tasks[0].Status)
		require.Equal(t, 1, tasks[0].Reclaims)
		require.Contains(t, *tasks[0].LastError, "lease expired")
		require.Equal(t, ptr(activityAt), tasks[0].LastActivityAt)
		require.Equal(t, 2, tasks[0].HeartbeatSchemaVersion)
		b.requireCurrentTask(t, "w", 0, "")
		_, err = b.s.TaskHeartbeat(ctx, store.TaskHeartbeatParams{
			TaskLease: leaseOf(claimed), LeaseTimeout: window, SchemaVersion: 2, ActivityAt: &now,
			ExpireOnActivity: true, Now: now,
		})
		require.ErrorIs(t, err, vigiltype.ErrStaleEpoch)

		// The next claim starts the activity afresh.
		again := b.claim(t, "w", now)
		require.Equal(t, claimed.TaskID, again.TaskID)
		require.Equal(t, ptr(now), again.LastActivityAt)
		require.Equal(t, 2, again.HeartbeatSchemaVersion) // the last heartbeat's, until the next one

		// The task's own window applies as it does from Now.
		b.enqueue(t, store.TaskEnqueueParams{TaskType: "own", LeaseTimeout: 2 * time.Second})
		own := b.claim(t, "w", now, "own")
		activityAt = now.Add(time.Second)
		task = b.heartbeat(t, store.TaskHeartbeatParams{
			TaskLease: leaseOf(own), LeaseTimeout: window, SchemaVersion: 2, ActivityAt: &activityAt,
			ExpireOnActivity: true, Now: now.Add(2 * time.Second),
		})
		require.Equal(t, ptr(activityAt.Add(2*time.Second)), task.LeaseExpiresAt)
	})

	t.Run("HeartbeatFallsBackToNow", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		// Without ExpireOnActivity (the `max` policy) a v2 lease expires on
		// Now + window however stale its activity; a v1 lease does so under
		// either policy (DESIGN T4: v1 keeps falling back).
		const window = 30 * time.Minute
		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		for _, tt := range []struct {
			name             string
			schemaVersion    int
			expireOnActivity bool
		}{
			{"V2", 2, false},
			{"V1", 1, false},
			{"V1ExpireOnActivity", 1, true},
		} {
			t.Run(tt.name, func(t *testing.T) {
				typ := "fallback-" + tt.name
				b.enqueue(t, store.TaskEnqueueParams{TaskType: typ})
				claimed := b.claim(t, "w", t0, typ)
				var activityAt *time.Time
				if tt.schemaVersion == 2 {
					activityAt = ptr(at(time.Minute))
				}
				for _, now := range []time.Time{at(20 * time.Minute), at(40 * time.Minute), at(60 * time.Minute)} {
					task := b.heartbeat(t, store.TaskHeartbeatParams{
						TaskLease: leaseOf(claimed), LeaseTimeout: window, SchemaVersion: tt.schemaVersion,
						ActivityAt: activityAt, ExpireOnActivity: tt.expireOnActivity, Now: now,
					})
					require.Equal(t, ptr(now.Add(window)), task.LeaseExpiresAt)
					require.Equal(t, tt.schemaVersion, task.HeartbeatSchemaVersion)
				}
				got := b.getTask(t, claimed.TaskID)
				require.Equal(t, vigiltype.TaskRunning, got.Status)
				require.Equal(t, claimed.LeaseEpoch, got.LeaseEpoch)
				if activityAt != nil {
					require.Equal(t, activityAt, got.LastActivityAt)
				} else {
					require.Equal(t, ptr(t0), got.LastActivityAt)
				}
			})
		}
		// Long past every activity + window, but within Now + window.
		require.Empty(t, b.reclaim(t, at(60*time.Minute+window)))
	})

	t.Run("HeartbeatRefusesBadSchema", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{})
		claimed := b.claim(t, "w", t0)
		now := at(time.Minute)
		for _, tt := range []struct {
			name          string
			schemaVersion int
			activityAt    *time.Time
			field         string
		}{
			{"V3", 3, ptr(now), "schema_version"},
			{"V0", 0, nil, "schema_version"},
			{"Negative", -1, nil, "schema_version"},
			{"V1WithActivity", 1, ptr(now), "activity_at"},
			{"V2WithoutActivity", 2, nil, "activity_at"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				_, err := b.s.TaskHeartbeat(ctx, store.TaskHeartbeatParams{
					TaskLease: leaseOf(claimed), LeaseTimeout: defaultLease, SchemaVersion: tt.schemaVersion,
					ActivityAt: tt.activityAt, ExpireOnActivity: true, Now: now,
				})
				require.ErrorIs(t, err, vigiltype.ErrInvalid)
				var fe *vigiltype.FieldError
				require.ErrorAs(t, err, &fe)
				require.Equal(t, tt.field, fe.Field)
			})
		}
		// Nothing was written, nor counted.
		requireTaskEqual(t, claimed, b.getTask(t, claimed.TaskID))
		versions, err := b.s.HeartbeatVersionList(ctx, t0)
		require.NoError(t, err)
		require.Empty(t, versions)
	})
}
