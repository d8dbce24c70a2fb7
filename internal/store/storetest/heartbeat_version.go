package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// exerciseHeartbeatVersion covers the heartbeat_versions table: every
// accepted lease heartbeat counted under its holder's hostname and schema
// version, listed by last_sent_at (DESIGN T4: the "all hosts emit v2"
// check).
func exerciseHeartbeatVersion(ctx context.Context, t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("CountedPerHostAndVersion", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		versions, err := b.s.HeartbeatVersionList(ctx, time.Time{})
		require.NoError(t, err)
		require.Empty(t, versions)

		// Two instances on host-a, one on host-B; each holds a task.
		leases := make(map[string]store.TaskLease)
		for _, inst := range []struct{ id, host string }{{"a1", "host-a"}, {"a2", "host-a"}, {"b1", "host-B"}} {
			b.register(t, store.ProcessRegisterParams{InstanceID: inst.id, Hostname: inst.host, LivenessIntervalS: 3600})
			b.enqueue(t, store.TaskEnqueueParams{TaskType: inst.id})
			leases[inst.id] = leaseOf(b.claim(t, inst.id, t0, inst.id))
		}
		send := func(instanceID string, schemaVersion int, now time.Time) {
			t.Helper()
			p := store.TaskHeartbeatParams{
				TaskLease: leases[instanceID], LeaseTimeout: defaultLease, SchemaVersion: schemaVersion, Now: now,
			}
			if schemaVersion == 2 {
				p.ActivityAt = &now
			}
			b.heartbeat(t, p)
		}
		send("a1", 1, at(time.Minute))
		send("a1", 1, at(2*time.Minute))
		send("a2", 2, at(3*time.Minute))
		send("a2", 1, at(90*time.Second)) // a lagging clock: last_sent_at stays the latest
		send("b1", 2, at(time.Minute))
		send("b1", 2, at(4*time.Minute+1500*time.Microsecond))

		// Ordered by hostname byte by byte ("host-B" < "host-a"), then version.
		all := []*vigiltype.HeartbeatVersion{
			{Hostname: "host-B", SchemaVersion: 2, LastSentAt: at(4*time.Minute + time.Millisecond), Heartbeats: 2},
			{Hostname: "host-a", SchemaVersion: 1, LastSentAt: at(2 * time.Minute), Heartbeats: 3},
			{Hostname: "host-a", SchemaVersion: 2, LastSentAt: at(3 * time.Minute), Heartbeats: 1},
		}
		for _, tt := range []struct {
			name  string
			since time.Time
			want  []*vigiltype.HeartbeatVersion
		}{
			{"All", t0, all},
			{"SinceIsInclusive", at(2 * time.Minute), all},
			{"Since", at(2*time.Minute + time.Millisecond), []*vigiltype.HeartbeatVersion{all[0], all[2]}},
			{"SinceLatest", at(4*time.Minute + time.Millisecond), all[:1]},
			{"SinceSubMillisecond", at(4*time.Minute + 1999*time.Microsecond), all[:1]}, // compared at ms precision
			{"None", at(4*time.Minute + 2*time.Millisecond), nil},
		} {
			t.Run(tt.name, func(t *testing.T) {
				got, err := b.s.HeartbeatVersionList(ctx, tt.since)
				require.NoError(t, err)
				if tt.want == nil {
					require.Empty(t, got)
					return
				}
				require.Equal(t, tt.want, got)
			})
		}
	})

	t.Run("RefusedHeartbeatCountsNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.register(t, store.ProcessRegisterParams{InstanceID: "w", LivenessIntervalS: 3600})
		b.register(t, store.ProcessRegisterParams{InstanceID: "other", Hostname: "host-other", LivenessIntervalS: 3600})
		b.enqueue(t, store.TaskEnqueueParams{})
		claimed := b.claim(t, "w", t0)
		lease := leaseOf(claimed)
		now := at(time.Minute)
		for _, stale := range []store.TaskLease{
			{TaskID: lease.TaskID, Epoch: lease.Epoch + 1, InstanceID: "w"},
			{TaskID: lease.TaskID, Epoch: lease.Epoch, InstanceID: "other"},
			{TaskID: 999999, Epoch: 1, InstanceID: "w"},
		} {
			_, err := b.s.TaskHeartbeat(ctx, store.TaskHeartbeatParams{
				TaskLease: stale, LeaseTimeout: defaultLease, SchemaVersion: 2, ActivityAt: &now, Now: now,
			})
			require.Error(t, err, "%+v", stale)
		}

		// A reclaimed holder's late heartbeat is stale too.
		require.Len(t, b.reclaim(t, at(defaultLease+time.Millisecond)), 1)
		_, err := b.s.TaskHeartbeat(ctx, store.TaskHeartbeatParams{
			TaskLease: lease, LeaseTimeout: defaultLease, SchemaVersion: 1, Now: at(time.Hour),
		})
		require.ErrorIs(t, err, vigiltype.ErrStaleEpoch)

		versions, err := b.s.HeartbeatVersionList(ctx, time.Time{})
		require.NoError(t, err)
		require.Empty(t, versions)

		// The holder's next accepted heartbeat is the first one counted.
		again := b.claim(t, "w", at(time.Hour))
		b.heartbeat(t, store.TaskHeartbeatParams{
			TaskLease: leaseOf(again), LeaseTimeout: defaultLease, SchemaVersion: 1, Now: at(time.Hour),
		})
		versions, err = b.s.HeartbeatVersionList(ctx, time.Time{})
		require.NoError(t, err)
		require.Equal(t, []*vigiltype.HeartbeatVersion{
			{Hostname: "host-a", SchemaVersion: 1, LastSentAt: at(time.Hour), Heartbeats: 1},
		}, versions)
	})
}
