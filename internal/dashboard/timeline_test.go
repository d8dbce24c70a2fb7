package dashboard

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigiltype"
)

func TestBuildAgentTimeline(t *testing.T) {
	t.Parallel()
	to := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	from := to.Add(-6 * time.Hour)
	at := func(h float64) time.Time { return from.Add(time.Duration(h * float64(time.Hour))) }
	ptr := func(t time.Time) *time.Time { return &t }
	proc := func(start, lastBeat float64, exited *time.Time) *vigiltype.Process {
		return &vigiltype.Process{StartedAt: at(start), LastHeartbeatAt: at(lastBeat), ExitedAt: exited, LivenessIntervalS: 10}
	}
	suppressed := vigiltype.DeliverySuppressed
	code := 1

	tests := []struct {
		name    string
		procs   []*vigiltype.Process
		evs     []*vigiltype.ProcessEvent
		stop    *vigiltype.PlannedStop
		up      []Span
		marks   []Mark
		stops   []Span
		purpose []Span
	}{
		{name: "nothing: all down"},
		{
			name:  "alive instance runs to the window's end",
			procs: []*vigiltype.Process{proc(2, 6, nil)},
			up:    []Span{{at(2), to}},
		},
		{
			name:  "exited instance ends at its exit",
			procs: []*vigiltype.Process{proc(1, 3, ptr(at(3)))},
			up:    []Span{{at(1), at(3)}},
		},
		{
			name:  "silent instance ends at its last heartbeat, not at the alive window",
			procs: []*vigiltype.Process{proc(1, 2.5, nil)},
			up:    []Span{{at(1), at(2.5)}},
		},
		{
			name:  "started before the window: clipped to its start",
			procs: []*vigiltype.Process{proc(-10, 6, nil)},
			up:    []Span{{from, to}},
		},
		{
			name:  "over before the window: left out",
			procs: []*vigiltype.Process{proc(-10, -5, ptr(at(-5)))},
		},
		{
			name: "overlapping and touching instances merge; a gap stays down",
			procs: []*vigiltype.Process{
				proc(4, 6, nil), proc(1, 2, ptr(at(2))), proc(1.5, 3, ptr(at(3))), proc(3, 3.5, ptr(at(3.5))),
			},
			up: []Span{{at(1), at(3.5)}, {at(4), to}},
		},
		{
			name: "events in the window, oldest first, suppressed marked",
			evs: []*vigiltype.ProcessEvent{
				{Kind: vigiltype.EventStallKill, At: at(5)},
				{Kind: vigiltype.EventExit, At: at(2), ExitCode: &code},
				{Kind: vigiltype.EventExit, At: at(-1)},
				{Kind: vigiltype.EventExit, At: at(3), DeliveryKind: &suppressed, Signal: "SIGTERM"},
			},
			marks: []Mark{
				{At: at(2), Kind: vigiltype.EventExit, ExitCode: &code},
				{At: at(3), Kind: vigiltype.EventExit, Suppressed: true, Signal: "SIGTERM"},
				{At: at(5), Kind: vigiltype.EventStallKill},
			},
		},
		{
			name: "a gap opened by a suppressed exit is a stop on purpose; one opened by a crash is down",
			procs: []*vigiltype.Process{
				proc(0, 1, ptr(at(1))), proc(2, 3, ptr(at(3))), proc(4, 6, nil),
			},
			evs: []*vigiltype.ProcessEvent{
				{Kind: vigiltype.EventExit, At: at(1).Add(time.Second), DeliveryKind: &suppressed},
				{Kind: vigiltype.EventExit, At: at(3), ExitCode: &code},
				{Kind: vigiltype.EventExit, At: at(3.5), DeliveryKind: &suppressed}, // later in a crash gap: still down
			},
			up: []Span{{at(0), at(1)}, {at(2), at(3)}, {at(4), to}},
			marks: []Mark{
				{At: at(1).Add(time.Second), Kind: vigiltype.EventExit, Suppressed: true},
				{At: at(3), Kind: vigiltype.EventExit, ExitCode: &code},
				{At: at(3.5), Kind: vigiltype.EventExit, Suppressed: true},
			},
			purpose: []Span{{at(1), at(2)}},
		},
		{
			// The restart's suppressed exit lies within exitSlack of the
			// crash gap's start, but before the new process started: it
			// opened the gap before, not this one (issue 12 case 5).
			name: "a crash seconds after a restart is down, not the restart's stop on purpose",
			procs: []*vigiltype.Process{
				{StartedAt: at(0), LastHeartbeatAt: at(1), ExitedAt: ptr(at(1)), LivenessIntervalS: 1},
				{StartedAt: at(1).Add(time.Second), LastHeartbeatAt: at(1).Add(3 * time.Second), LivenessIntervalS: 1},
			},
			evs: []*vigiltype.ProcessEvent{
				{Kind: vigiltype.EventExit, At: at(1), DeliveryKind: &suppressed},
				{Kind: vigiltype.EventExit, At: at(1).Add(3 * time.Second), Signal: "killed"},
			},
			up: []Span{{at(0), at(1)}, {at(1).Add(time.Second), at(1).Add(3 * time.Second)}},
			marks: []Mark{
				{At: at(1), Kind: vigiltype.EventExit, Suppressed: true},
				{At: at(1).Add(3 * time.Second), Kind: vigiltype.EventExit, Signal: "killed"},
			},
			purpose: []Span{{at(1), at(1).Add(time.Second)}},
		},
		{
			name:    "stopped on purpose up to now: the gap after the last span",
			procs:   []*vigiltype.Process{proc(0, 5, ptr(at(5)))},
			evs:     []*vigiltype.ProcessEvent{{Kind: vigiltype.EventExit, At: at(5).Add(-time.Second), DeliveryKind: &suppressed}},
			up:      []Span{{at(0), at(5)}},
			marks:   []Mark{{At: at(5).Add(-time.Second), Kind: vigiltype.EventExit, Suppressed: true}},
			purpose: []Span{{at(5), to}},
		},
		{
			name:  "planned stop clipped to the window",
			stop:  &vigiltype.PlannedStop{CreatedAt: at(5.5), ExpiresAt: at(7)},
			stops: []Span{{at(5.5), to}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := BuildAgentTimeline("a", from, to, tt.procs, tt.evs, tt.stop)
			require.Equal(t, "a", got.Agent)
			require.Equal(t, nonNil(tt.up), got.Up)
			require.Equal(t, nonNil(tt.marks), got.Marks)
			require.Equal(t, nonNil(tt.stops), got.PlannedStops)
			require.Equal(t, nonNil(tt.purpose), got.StoppedOnPurpose)
		})
	}
}

// nonNil turns nil into an empty slice: the timeline always encodes [] not null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
