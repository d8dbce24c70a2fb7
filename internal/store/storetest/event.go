package storetest

import (
	"cmp"
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// exerciseEvent covers the process_events and planned_stops tables: events
// listed newest first and acknowledged once, and planned stop markers that
// make an agent's exits within their TTL be written already delivered,
// kind "suppressed" (DESIGN E1, E2).
func exerciseEvent(ctx context.Context, t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("RecordAndList", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		events, err := b.s.EventList(ctx, store.EventListParams{})
		require.NoError(t, err)
		require.Empty(t, events)

		// Times are kept to the millisecond.
		exit, err := b.s.EventRecord(ctx, store.EventRecordParams{
			Agent: "research", Kind: vigiltype.EventExit, At: t0.Add(1500 * time.Microsecond),
			ExitCode: ptr(137), Signal: "SIGKILL", RunDurationMS: 4200, StderrTail: "panic: boom\ngoroutine 1",
			Detail: json.RawMessage(`{"restart_in_ms": 5000, "pids": [1, 2]}`),
		})
		require.NoError(t, err)
		require.NotZero(t, exit.EventID)
		want := &vigiltype.ProcessEvent{
			EventID: exit.EventID, Agent: "research", Kind: vigiltype.EventExit, At: at(time.Millisecond),
			ExitCode: ptr(137), Signal: "SIGKILL", RunDurationMS: 4200, StderrTail: "panic: boom\ngoroutine 1",
			Detail: json.RawMessage(`{"restart_in_ms": 5000, "pids": [1, 2]}`),
		}
		requireEventEqual(t, want, exit)
		events, err = b.s.EventList(ctx, store.EventListParams{})
		require.NoError(t, err)
		require.Len(t, events, 1)
		requireEventEqual(t, want, events[0])

		// Exit code 0 is a code; no exit code (a stall kill) is nil; no
		// detail is nil, a JSON null detail is null.
		clean := b.recordEvent(t, store.EventRecordParams{Agent: "research", ExitCode: ptr(0)})
		require.Equal(t, ptr(0), clean.ExitCode)
		require.Nil(t, clean.Detail)
		stall := b.recordEvent(t, store.EventRecordParams{Agent: "research", Kind: vigiltype.EventStallKill, Detail: json.RawMessage(`null`)})
		require.Nil(t, stall.ExitCode)
		requireJSONEq(t, json.RawMessage(`null`), stall.Detail, "detail")
		require.NotNil(t, stall.Detail)
		require.Greater(t, clean.EventID, exit.EventID)
		require.Greater(t, stall.EventID, clean.EventID)
	})

	t.Run("EveryKind", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		kinds := []vigiltype.EventKind{
			vigiltype.EventExit, vigiltype.EventStallKill, vigiltype.EventLaunchFailure,
			vigiltype.EventFlapping, vigiltype.EventStartupTimeout,
		}
		for _, kind := range kinds {
			require.Equal(t, kind, b.recordEvent(t, store.EventRecordParams{Kind: kind}).Kind)
		}
		events, err := b.s.EventList(ctx, store.EventListParams{})
		require.NoError(t, err)
		require.Len(t, events, len(kinds))
		for i, e := range events {
			require.Equal(t, kinds[len(kinds)-1-i], e.Kind)
		}
	})

	t.Run("InvalidWritesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		for _, p := range []store.EventRecordParams{
			{Agent: "research", Kind: "crash", At: t0},
			{Agent: "research", Kind: "", At: t0},
			{Agent: "research", Kind: vigiltype.EventExit, At: t0, Detail: json.RawMessage(`{"a":`)},
			{Agent: "research", Kind: vigiltype.EventExit, At: t0, Detail: json.RawMessage(``)},
		} {
			_, err := b.s.EventRecord(ctx, p)
			require.ErrorIs(t, err, vigiltype.ErrInvalid, "%+v", p)
		}
		events, err := b.s.EventList(ctx, store.EventListParams{})
		require.NoError(t, err)
		require.Empty(t, events)
	})

	t.Run("ListFilters", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		var ids []int64
		for i, agent := range []string{"a", "b", "a", "b", "a", "c"} {
			ids = append(ids, b.recordEvent(t, store.EventRecordParams{Agent: agent, At: at(time.Duration(i) * time.Second)}).EventID)
		}
		b.ack(t, ids[2], "slack", at(time.Minute))
		b.ack(t, ids[3], "email", at(time.Minute))

		for _, tt := range []struct {
			name   string
			params store.EventListParams
			want   []int64
		}{
			{"All", store.EventListParams{}, []int64{ids[5], ids[4], ids[3], ids[2], ids[1], ids[0]}},
			{"Agent", store.EventListParams{Agent: "a"}, []int64{ids[4], ids[2], ids[0]}},
			{"AgentByteEqual", store.EventListParams{Agent: "A"}, nil},
			{"Undelivered", store.EventListParams{Undelivered: true}, []int64{ids[5], ids[4], ids[1], ids[0]}},
			{"AgentUndelivered", store.EventListParams{Agent: "b", Undelivered: true}, []int64{ids[1]}},
			{"BeforeID", store.EventListParams{BeforeID: ids[3]}, []int64{ids[2], ids[1], ids[0]}},
			{"Limit", store.EventListParams{Limit: 2}, []int64{ids[5], ids[4]}},
			{"BeforeIDAndLimit", store.EventListParams{BeforeID: ids[4], Limit: 2}, []int64{ids[3], ids[2]}},
			{"AllFilters", store.EventListParams{Agent: "a", Undelivered: true, BeforeID: ids[4], Limit: 5}, []int64{ids[0]}},
			{"NoMatch", store.EventListParams{Agent: "nobody"}, nil},
		} {
			t.Run(tt.name, func(t *testing.T) {
				events, err := b.s.EventList(ctx, tt.params)
				require.NoError(t, err)
				require.Equal(t, tt.want, eventIDs(events))
			})
		}

		// Paging by BeforeID walks every event once, newest first.
		var walked []int64
		p := store.EventListParams{Limit: 4}
		for {
			page, err := b.s.EventList(ctx, p)
			require.NoError(t, err)
			if len(page) == 0 {
				break
			}
			walked = append(walked, eventIDs(page)...)
			p.BeforeID = page[len(page)-1].EventID
		}
		require.Equal(t, []int64{ids[5], ids[4], ids[3], ids[2], ids[1], ids[0]}, walked)
	})

	t.Run("Ack", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		e := b.recordEvent(t, store.EventRecordParams{Agent: "research", ExitCode: ptr(1)})
		acked, err := b.s.EventAck(ctx, e.EventID, "slack", at(time.Minute+1500*time.Microsecond))
		require.NoError(t, err)
		want := *e
		want.DeliveredAt = ptr(at(time.Minute + time.Millisecond))
		want.DeliveryKind = ptr("slack")
		requireEventEqual(t, &want, acked)

		// A second ack is no error and keeps the first one's values.
		again, err := b.s.EventAck(ctx, e.EventID, "email", at(time.Hour))
		require.NoError(t, err)
		requireEventEqual(t, &want, again)
		events, err := b.s.EventList(ctx, store.EventListParams{})
		require.NoError(t, err)
		require.Len(t, events, 1)
		requireEventEqual(t, &want, events[0])
		events, err = b.s.EventList(ctx, store.EventListParams{Undelivered: true})
		require.NoError(t, err)
		require.Empty(t, events)

		_, err = b.s.EventAck(ctx, 999999, "slack", t0)
		require.ErrorIs(t, err, vigiltype.ErrNotFound)
	})

	t.Run("AckConcurrent", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		e := b.recordEvent(t, store.EventRecordParams{Agent: "research"})
		const consumers = 8
		results := make([]*vigiltype.ProcessEvent, consumers)
		errs := make([]error, consumers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range consumers {
			wg.Go(func() {
				<-start
				results[i], errs[i] = b.s.EventAck(ctx, e.EventID, string(rune('a'+i)), at(time.Duration(i+1)*time.Second))
			})
		}
		close(start)
		wg.Wait()

		// One ack wins; every consumer sees the winner's values.
		stored, err := b.s.EventList(ctx, store.EventListParams{})
		require.NoError(t, err)
		require.Len(t, stored, 1)
		require.NotNil(t, stored[0].DeliveredAt)
		for i := range consumers {
			require.NoError(t, errs[i])
			requireEventEqual(t, stored[0], results[i])
		}
	})

	t.Run("PlannedStopCoversItsAgentsExits", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		const ttl = 120 * time.Second
		created := at(time.Minute)
		b.writePlannedStop(t, store.PlannedStopParams{Agent: "research", Reason: "operator redeploy", TTL: ttl, Now: created})

		for _, tt := range []struct {
			name    string
			agent   string
			at      time.Time
			covered bool
		}{
			{"BeforeTheMarker", "research", created.Add(-time.Millisecond), false},
			{"AtCreation", "research", created, true},
			{"Within", "research", created.Add(time.Second), true},
			{"WithinAgain", "research", created.Add(time.Minute), true}, // not one-shot
			{"AtExpiry", "research", created.Add(ttl), true},
			{"AfterExpiry", "research", created.Add(ttl + time.Millisecond), false},
			{"OtherAgent", "research-2", created.Add(time.Second), false},
			{"SubMillisecondAtExpiry", "research", created.Add(ttl + 999*time.Microsecond), true}, // compared at ms precision
		} {
			t.Run(tt.name, func(t *testing.T) {
				e, err := b.s.EventRecord(ctx, store.EventRecordParams{
					Agent: tt.agent, Kind: vigiltype.EventExit, At: tt.at, ExitCode: ptr(0), RunDurationMS: 10,
				})
				require.NoError(t, err)
				stored := b.eventByID(t, e.EventID)
				requireEventEqual(t, e, stored)
				if !tt.covered {
					require.Nil(t, e.DeliveredAt)
					require.Nil(t, e.DeliveryKind)
					return
				}
				// Written already delivered, at the exit's own time.
				require.Equal(t, ptr(e.At), e.DeliveredAt)
				require.Equal(t, ptr(vigiltype.DeliverySuppressed), e.DeliveryKind)
				require.Equal(t, tt.at.Truncate(time.Millisecond), e.At)
			})
		}

		// Every kind is covered, not only exits; suppressed events are still
		// listed, but not as undelivered.
		stall := b.recordEvent(t, store.EventRecordParams{Agent: "research", Kind: vigiltype.EventStallKill, At: created.Add(time.Second)})
		require.Equal(t, ptr(vigiltype.DeliverySuppressed), stall.DeliveryKind)
		all, err := b.s.EventList(ctx, store.EventListParams{Agent: "research"})
		require.NoError(t, err)
		require.Len(t, all, 8)
		undelivered, err := b.s.EventList(ctx, store.EventListParams{Agent: "research", Undelivered: true})
		require.NoError(t, err)
		require.Len(t, undelivered, 2)
		for _, e := range undelivered {
			require.Nil(t, e.DeliveredAt)
		}

		// Acknowledging a suppressed event keeps it suppressed.
		acked := b.ack(t, stall.EventID, "slack", at(time.Hour))
		require.Equal(t, stall.DeliveredAt, acked.DeliveredAt)
		require.Equal(t, ptr(vigiltype.DeliverySuppressed), acked.DeliveryKind)
	})

	t.Run("PlannedStopDatedAfterTheExit", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		// An exit recorded late, after a marker was written: the marker
		// was not there when the process exited, so it does not cover it.
		b.writePlannedStop(t, store.PlannedStopParams{Agent: "research", Reason: "r", TTL: time.Hour, Now: at(time.Minute)})
		e := b.recordEvent(t, store.EventRecordParams{Agent: "research", At: at(time.Minute - time.Millisecond)})
		require.Nil(t, e.DeliveredAt)
		require.Nil(t, e.DeliveryKind)
	})

	t.Run("PlannedStopCoversTheProcessesRunningWhenWritten", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		// DESIGN E2: a marker covers the exits of the processes that were
		// running when it was written. An event that says when its process
		// was launched (LaunchedAt, on the store's clock) is covered only
		// if that was not after the marker; one that does not say falls
		// under the TTL alone.
		created := at(time.Minute)
		b.writePlannedStop(t, store.PlannedStopParams{Agent: "research", Reason: "restart", TTL: 2 * time.Minute, Now: created})
		for _, tt := range []struct {
			name     string
			kind     vigiltype.EventKind
			launched *time.Time
			covered  bool
		}{
			{"LaunchedBefore", vigiltype.EventExit, ptr(created.Add(-time.Hour)), true},
			{"LaunchedAtTheMarker", vigiltype.EventExit, ptr(created), true},
			{"LaunchedAfter", vigiltype.EventExit, ptr(created.Add(time.Millisecond)), false},
			{"LaunchedAfterSubMillisecond", vigiltype.EventExit, ptr(created.Add(999 * time.Microsecond)), true}, // ms precision
			{"StallKillOfALaterProcess", vigiltype.EventStallKill, ptr(created.Add(time.Second)), false},
			{"LaunchFailureAfter", vigiltype.EventLaunchFailure, ptr(created.Add(30 * time.Second)), false},
			{"NotSaid", vigiltype.EventExit, nil, true},
		} {
			t.Run(tt.name, func(t *testing.T) {
				e := b.recordEvent(t, store.EventRecordParams{
					Agent: "research", Kind: tt.kind, At: created.Add(30 * time.Second), LaunchedAt: tt.launched,
				})
				if tt.covered {
					require.Equal(t, ptr(vigiltype.DeliverySuppressed), e.DeliveryKind)
					require.Equal(t, ptr(e.At), e.DeliveredAt)
				} else {
					require.Nil(t, e.DeliveredAt, "an ordinary event, waiting for a consumer")
					require.Nil(t, e.DeliveryKind)
				}
				requireEventEqual(t, e, b.eventByID(t, e.EventID))
			})
		}

		// The TTL still bounds the marker, for a process it covers too.
		late := b.recordEvent(t, store.EventRecordParams{
			Agent: "research", At: created.Add(2*time.Minute + time.Millisecond), LaunchedAt: ptr(created.Add(-time.Hour)),
		})
		require.Nil(t, late.DeliveredAt)
	})

	t.Run("PlannedStopWriteAndGet", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		_, err := b.s.PlannedStopGet(ctx, "research", t0)
		require.ErrorIs(t, err, vigiltype.ErrNotFound)

		// Times are kept to the millisecond.
		ps := b.writePlannedStop(t, store.PlannedStopParams{
			Agent: "research", Reason: "operator redeploy", TTL: 120*time.Second + 1500*time.Microsecond,
			Now: t0.Add(1500 * time.Microsecond),
		})
		want := &vigiltype.PlannedStop{
			Agent: "research", Reason: "operator redeploy",
			CreatedAt: at(time.Millisecond), ExpiresAt: at(120*time.Second + 2*time.Millisecond),
		}
		require.Equal(t, want, ps)
		for _, now := range []time.Time{want.CreatedAt, at(time.Minute), want.ExpiresAt} {
			got, err := b.s.PlannedStopGet(ctx, "research", now)
			require.NoError(t, err, now)
			require.Equal(t, want, got)
		}
		for _, now := range []time.Time{t0, want.ExpiresAt.Add(time.Millisecond)} {
			_, err := b.s.PlannedStopGet(ctx, "research", now)
			require.ErrorIs(t, err, vigiltype.ErrNotFound, now)
		}
		_, err = b.s.PlannedStopGet(ctx, "research-2", at(time.Minute))
		require.ErrorIs(t, err, vigiltype.ErrNotFound)

		// Writing again replaces the marker: the earlier window is gone.
		replaced := b.writePlannedStop(t, store.PlannedStopParams{Agent: "research", Reason: "second", TTL: time.Minute, Now: at(time.Hour)})
		require.Equal(t, &vigiltype.PlannedStop{
			Agent: "research", Reason: "second", CreatedAt: at(time.Hour), ExpiresAt: at(time.Hour + time.Minute),
		}, replaced)
		_, err = b.s.PlannedStopGet(ctx, "research", at(time.Minute))
		require.ErrorIs(t, err, vigiltype.ErrNotFound)
		got, err := b.s.PlannedStopGet(ctx, "research", at(time.Hour+time.Second))
		require.NoError(t, err)
		require.Equal(t, replaced, got)
		e := b.recordEvent(t, store.EventRecordParams{Agent: "research", At: at(time.Minute)})
		require.Nil(t, e.DeliveredAt)
		e = b.recordEvent(t, store.EventRecordParams{Agent: "research", At: at(time.Hour + time.Second)})
		require.Equal(t, ptr(vigiltype.DeliverySuppressed), e.DeliveryKind)

		// A marker that expired is gone for events too.
		e = b.recordEvent(t, store.EventRecordParams{Agent: "research", At: at(2 * time.Hour)})
		require.Nil(t, e.DeliveredAt)
	})
}

// recordEvent records a process event, filling unset fields: agent
// "research", kind exit and At = t0.
func (b *testBundle) recordEvent(t *testing.T, p store.EventRecordParams) *vigiltype.ProcessEvent {
	t.Helper()
	p.Agent = cmp.Or(p.Agent, "research")
	p.Kind = cmp.Or(p.Kind, vigiltype.EventExit)
	p.At = cmp.Or(p.At, t0)
	e, err := b.s.EventRecord(b.ctx, p)
	require.NoError(t, err)
	return e
}

// ack acknowledges an event as delivered by kind at now.
func (b *testBundle) ack(t *testing.T, eventID int64, kind string, now time.Time) *vigiltype.ProcessEvent {
	t.Helper()
	e, err := b.s.EventAck(b.ctx, eventID, kind, now)
	require.NoError(t, err)
	return e
}

// eventByID finds one event in the full listing.
func (b *testBundle) eventByID(t *testing.T, eventID int64) *vigiltype.ProcessEvent {
	t.Helper()
	events, err := b.s.EventList(b.ctx, store.EventListParams{BeforeID: eventID + 1, Limit: 1})
	require.NoError(t, err)
	require.Len(t, events, 1)
	require.Equal(t, eventID, events[0].EventID)
	return events[0]
}

// writePlannedStop writes a planned stop marker.
func (b *testBundle) writePlannedStop(t *testing.T, p store.PlannedStopParams) *vigiltype.PlannedStop {
	t.Helper()
	ps, err := b.s.PlannedStopWrite(b.ctx, p)
	require.NoError(t, err)
	return ps
}

// eventIDs returns the ids of events in order; nil for none.
func eventIDs(events []*vigiltype.ProcessEvent) []int64 {
	var ids []int64
	for _, e := range events {
		ids = append(ids, e.EventID)
	}
	return ids
}

// requireEventEqual compares two events, the detail by meaning (a backend
// may store JSON normalised) and the rest exactly.
func requireEventEqual(t *testing.T, want, got *vigiltype.ProcessEvent) {
	t.Helper()
	require.NotNil(t, got)
	requireJSONEq(t, want.Detail, got.Detail, "detail")
	w, g := *want, *got
	w.Detail, g.Detail = nil, nil
	require.Equal(t, w, g)
}
