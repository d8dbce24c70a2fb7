package dashboard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/vigil-fleet/vigil/internal/events"
	"github.com/vigil-fleet/vigil/internal/liveness"
	"github.com/vigil-fleet/vigil/internal/registry"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// Timeline window bounds: the strip shows the last WindowDefault unless the
// caller asks for another window of at most WindowMax.
const (
	WindowDefault = 6 * time.Hour
	WindowMax     = 72 * time.Hour
)

// timelinePageMax bounds the pages of instances and of events read per
// agent (liveness.ListLimitMax rows each); an agent with more in the window
// is marked Truncated and its oldest part is left out.
const timelinePageMax = 2

// Span is a stretch of time [From, To].
type Span struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
}

// Mark is one process event on the strip.
type Mark struct {
	At         time.Time           `json:"at"`
	Kind       vigiltype.EventKind `json:"kind"`
	Suppressed bool                `json:"suppressed"` // written under a planned stop (DESIGN E2)
	ExitCode   *int                `json:"exit_code"`
	Signal     string              `json:"signal,omitempty"`
}

// AgentTimeline is one agent's strip: when an instance of its kind was up,
// its process events, and planned stops.
type AgentTimeline struct {
	Agent string `json:"agent"`
	// RegisteredAt is the registry record's created_at: before it the
	// agent was not expected to run, so the strip draws no down time there.
	RegisteredAt time.Time `json:"registered_at"`
	// Up holds the merged lifetimes of the agent's instances inside the
	// window, oldest first: from started_at to exited_at, to the last
	// heartbeat of an instance that went silent, or to the window's end for
	// one still alive. The gaps between spans are down time.
	Up    []Span `json:"up"`
	Marks []Mark `json:"marks"` // oldest first
	// PlannedStops is the active planned stop marker (DESIGN E2): the
	// stretch in which exits of the process running when it was written
	// are written suppressed (not those of a process started after it). It
	// says nothing about whether the agent runs; DeclaredStopped does.
	PlannedStops []Span `json:"planned_stops"`
	// StoppedOnPurpose holds the down gaps whose first exit was suppressed
	// (a planned stop or restart, DESIGN E2): kept down on purpose, not an
	// outage. Read from the events, so it outlives the planned stop marker.
	StoppedOnPurpose []Span `json:"stopped_on_purpose"`
	// DeclaredStopped is the stretch since the registry record was marked
	// stopped (stopped_at to the window's end) while it still is: the
	// operator keeps the agent down on purpose. Empty for an active agent.
	DeclaredStopped []Span `json:"declared_stopped"`
	// Truncated: the agent had more instances or events in the window than
	// were read; the oldest are missing from the strip.
	Truncated bool `json:"truncated"`
}

// Timeline is the document served at GET /v1/timeline.
type Timeline struct {
	From   time.Time       `json:"from"`
	To     time.Time       `json:"to"`
	Agents []AgentTimeline `json:"agents"` // registry order (oldest first)
}

// BuildAgentTimeline computes one agent's strip over [from, to] from its
// instances (any order), its events (any order) and its planned stop (nil
// when none). It reads nothing and is the unit the tests pin down.
func BuildAgentTimeline(agent string, from, to time.Time, procs []*vigiltype.Process, evs []*vigiltype.ProcessEvent, stop *vigiltype.PlannedStop) AgentTimeline {
	tl := AgentTimeline{Agent: agent, Up: []Span{}, Marks: []Mark{}, PlannedStops: []Span{}, DeclaredStopped: []Span{}, StoppedOnPurpose: []Span{}}
	var spans []Span
	for _, p := range procs {
		end := to
		switch {
		case p.ExitedAt != nil:
			end = *p.ExitedAt
		case p.ComputeStatus(to) == vigiltype.ProcessStopped:
			end = p.LastHeartbeatAt // went silent: its last sign of life
		}
		if s, ok := clip(Span{From: p.StartedAt, To: end}, from, to); ok {
			spans = append(spans, s)
		}
	}
	tl.Up = merge(spans)
	for _, e := range evs {
		if e.At.Before(from) || e.At.After(to) {
			continue
		}
		tl.Marks = append(tl.Marks, Mark{
			At: e.At, Kind: e.Kind, ExitCode: e.ExitCode, Signal: e.Signal,
			Suppressed: e.DeliveryKind != nil && *e.DeliveryKind == vigiltype.DeliverySuppressed,
		})
	}
	slices.SortStableFunc(tl.Marks, func(a, b Mark) int { return a.At.Compare(b.At) })
	tl.StoppedOnPurpose = stoppedOnPurpose(tl.Up, tl.Marks, from, to)
	if stop != nil {
		if s, ok := clip(Span{From: stop.CreatedAt, To: stop.ExpiresAt}, from, to); ok {
			tl.PlannedStops = append(tl.PlannedStops, s)
		}
	}
	return tl
}

// exitSlack is how long before a gap may begin the exit event that opened
// it: an SDK agent marks its instance exited a moment before the
// supervisor records the exit, so the event lands just inside the gap or
// just before it.
const exitSlack = 5 * time.Second

// stoppedOnPurpose returns the down gaps (between up spans, and after the
// last one) whose first exit was suppressed: the stretch opened by a
// planned stop or restart (DESIGN E2), which the strip draws apart from
// down time. A gap whose first exit was not suppressed stays down, even if
// a planned stop came later in it. An exit from before the span that the
// gap ends began belongs to an earlier gap, however close: the restart's
// exit does not open the gap of a crash seconds after it.
func stoppedOnPurpose(up []Span, marks []Mark, from, to time.Time) []Span {
	out := []Span{}
	for i, u := range up {
		gap := Span{From: u.To, To: to}
		if i+1 < len(up) {
			gap.To = up[i+1].From
		}
		if !gap.To.After(gap.From) {
			continue
		}
		for _, m := range marks {
			if m.Kind != vigiltype.EventExit && m.Kind != vigiltype.EventStallKill {
				continue
			}
			if m.At.Before(gap.From.Add(-exitSlack)) || m.At.Before(u.From) || m.At.After(gap.To) {
				continue
			}
			if m.Suppressed {
				out = append(out, gap)
			}
			break // the first exit of the gap decides
		}
	}
	return out
}

// clip cuts s to [from, to]; false when nothing is left.
func clip(s Span, from, to time.Time) (Span, bool) {
	if s.From.Before(from) {
		s.From = from
	}
	if s.To.After(to) {
		s.To = to
	}
	return s, !s.To.Before(s.From)
}

// merge sorts spans and joins those that overlap or touch.
func merge(spans []Span) []Span {
	slices.SortFunc(spans, func(a, b Span) int {
		return cmp.Or(a.From.Compare(b.From), a.To.Compare(b.To))
	})
	out := []Span{}
	for _, s := range spans {
		if n := len(out); n > 0 && !s.From.After(out[n-1].To) {
			if s.To.After(out[n-1].To) {
				out[n-1].To = s.To
			}
			continue
		}
		out = append(out, s)
	}
	return out
}

// Service reads what the timelines need through the same services as the
// HTTP API.
type Service struct {
	Registry *registry.Service
	Liveness *liveness.Service
	Events   *events.Service
	Now      func() time.Time // the server's clock (the one liveness uses)
}

// Timeline returns every registered agent's strip over the last window
// (WindowDefault when 0; at most WindowMax). Errors: vigiltype.ErrInvalid
// naming window_s for a window out of range; store errors wrapped.
func (s *Service) Timeline(ctx context.Context, window time.Duration) (*Timeline, error) {
	if window == 0 {
		window = WindowDefault
	}
	if window < 0 || window > WindowMax {
		return nil, vigiltype.Invalid("window_s", fmt.Sprintf("must be a number of seconds, more than 0 and at most %d", int64(WindowMax.Seconds())))
	}
	to := s.Now().Truncate(time.Millisecond) // the precision the stores keep
	from := to.Add(-window).Truncate(time.Millisecond)
	agents, err := s.Registry.List(ctx)
	if err != nil {
		return nil, err
	}
	tl := &Timeline{From: from, To: to, Agents: make([]AgentTimeline, 0, len(agents))}
	for _, a := range agents {
		procs, moreProcs, err := s.instancesSince(ctx, a.Name, from)
		if err != nil {
			return nil, err
		}
		evs, moreEvents, err := s.eventsSince(ctx, a.Name, from)
		if err != nil {
			return nil, err
		}
		stop, err := s.Events.ActivePlannedStop(ctx, a.Name)
		if err != nil && !errors.Is(err, vigiltype.ErrNotFound) {
			return nil, err
		}
		at := BuildAgentTimeline(a.Name, from, to, procs, evs, stop)
		at.Truncated = moreProcs || moreEvents
		at.RegisteredAt = a.CreatedAt
		if a.Status == vigiltype.AgentStopped && a.StoppedAt != nil {
			if s, ok := clip(Span{From: *a.StoppedAt, To: to}, from, to); ok {
				at.DeclaredStopped = append(at.DeclaredStopped, s)
			}
		}
		tl.Agents = append(tl.Agents, at)
	}
	return tl, nil
}

// instancesSince reads the agent's instances newest first until one started
// before from (older ones can still be up inside the window, so that one is
// kept and the reading stops after its page).
func (s *Service) instancesSince(ctx context.Context, kind string, from time.Time) ([]*vigiltype.Process, bool, error) {
	var out []*vigiltype.Process
	cursor := ""
	for range timelinePageMax {
		page, next, err := s.Liveness.List(ctx, liveness.ListParams{Kind: kind, Limit: liveness.ListLimitMax, Cursor: cursor})
		if err != nil {
			return nil, false, err
		}
		out = append(out, page...)
		if next == "" || (len(page) > 0 && page[len(page)-1].StartedAt.Before(from)) {
			return out, false, nil
		}
		cursor = next
	}
	return out, true, nil
}

// eventsSince reads the agent's events newest first back to from.
func (s *Service) eventsSince(ctx context.Context, agent string, from time.Time) ([]*vigiltype.ProcessEvent, bool, error) {
	var out []*vigiltype.ProcessEvent
	var before int64
	for range timelinePageMax {
		page, next, err := s.Events.List(ctx, events.ListParams{Agent: agent, Limit: liveness.ListLimitMax, BeforeID: before})
		if err != nil {
			return nil, false, err
		}
		out = append(out, page...)
		if next == 0 || (len(page) > 0 && page[len(page)-1].At.Before(from)) {
			return out, false, nil
		}
		before = next
	}
	return out, true, nil
}
