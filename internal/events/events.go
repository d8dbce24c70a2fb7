// Package events records process events — unexpected exits, stall kills,
// launch failures — and planned stops (DESIGN E1, E2).
//
// An event is durable and starts undelivered. A consumer (an alerter)
// lists the undelivered events, deals with each, and acknowledges it. An
// exit covered by an unexpired planned stop is written already delivered,
// delivery_kind "suppressed": the operator meant it, nobody is paged, and
// it is still on record. A planned stop covers the processes that were
// running when it was written: a reporter says how long ago the event's
// process was launched (launch_age_ms, on its own clock), and the exit of a
// process launched after the stop — the crash right after a restart — is
// an ordinary event. An event that does not say is covered for the stop's
// whole TTL.
//
// Visibility rule. With several servers on one PostgreSQL database, event
// ids commit out of order, so "every id after the last one I saw" can miss
// an event whose lower id commits late. Consumers therefore never walk ids:
// they read the undelivered set (delivered_at IS NULL) and acknowledge what
// they handled, which sees every event however its id committed. The
// newest-first listing is for people and may page by id.
package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/vigil-fleet/vigil/internal/clock"
	"github.com/vigil-fleet/vigil/internal/liveness"
	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

const (
	// PlannedStopTTLDefault is how long a planned stop covers exits (DESIGN E2: 120s).
	PlannedStopTTLDefault = 120 * time.Second
	// PlannedStopTTLMax bounds a planned stop's TTL (one day).
	PlannedStopTTLMax = 24 * time.Hour
	// StderrTailMaxBytes bounds the stderr tail kept with an exit event.
	StderrTailMaxBytes = 8192
	// DetailMaxBytes bounds an event's opaque detail.
	DetailMaxBytes = 64 << 10
	// ReasonMaxLen bounds a planned stop's reason.
	ReasonMaxLen = 1024
	// AckKindDefault is the delivery_kind of an acknowledgement that names none.
	AckKindDefault = "acknowledged"
	// LaunchAgeMaxMS bounds an event's launch_age_ms (a hundred years).
	LaunchAgeMaxMS = 100 * 365 * 24 * 3600 * 1000
)

// Service records and reads process events.
type Service struct {
	store store.Store
	clock clock.Clock
	// Recorded, when set, is told the kind of every event recorded (for
	// metrics). Set it before use.
	Recorded func(vigiltype.EventKind)
}

// New returns a Service over st; clk stamps events (clock.Real when nil).
func New(st store.Store, clk clock.Clock) *Service {
	if clk == nil {
		clk = clock.Real{}
	}
	return &Service{store: st, clock: clk}
}

// RecordParams is one event as reported by a supervisor. Its time is the
// server's now (one clock, DESIGN L3).
type RecordParams struct {
	Agent         string              `json:"agent"`
	Kind          vigiltype.EventKind `json:"kind"`
	ExitCode      *int                `json:"exit_code"`
	Signal        string              `json:"signal"`
	RunDurationMS int64               `json:"run_duration_ms"`
	StderrTail    string              `json:"stderr_tail"`
	Detail        json.RawMessage     `json:"detail"`
	// LaunchAgeMS is how long before the report the process the event is
	// about was launched, measured on the reporter's own (monotonic) clock.
	// The server places the launch at its now minus that age, so no clock
	// is compared with another (DESIGN L10), and a planned stop covers the
	// event only if the process was already running when the stop was
	// written (E2). Omitted: not known; the stop covers the event for its
	// whole TTL.
	LaunchAgeMS *int64 `json:"launch_age_ms"`
}

// Record validates and appends an event; a planned stop covering now,
// written while the event's process was already running, makes it
// suppressed (DESIGN E2).
func (s *Service) Record(ctx context.Context, p RecordParams) (*vigiltype.ProcessEvent, error) {
	if err := vigiltype.CheckName("agent", p.Agent); err != nil {
		return nil, err
	}
	if !p.Kind.Valid() {
		return nil, vigiltype.Invalid("kind", "must be one of exit, stall_kill, launch_failure, flapping, startup_timeout")
	}
	if p.RunDurationMS < 0 {
		return nil, vigiltype.Invalid("run_duration_ms", "must not be negative")
	}
	if p.LaunchAgeMS != nil && (*p.LaunchAgeMS < 0 || *p.LaunchAgeMS > LaunchAgeMaxMS) {
		return nil, vigiltype.Invalid("launch_age_ms", fmt.Sprintf("must be between 0 and %d", int64(LaunchAgeMaxMS)))
	}
	if p.ExitCode != nil && (*p.ExitCode < 0 || *p.ExitCode > 255) {
		return nil, vigiltype.Invalid("exit_code", "must be between 0 and 255")
	}
	if len(p.Signal) > 32 {
		return nil, vigiltype.Invalid("signal", "must be at most 32 characters")
	}
	if err := vigiltype.CheckText("signal", p.Signal); err != nil {
		return nil, err
	}
	if p.Detail != nil {
		if err := vigiltype.CheckJSON("detail", p.Detail, DetailMaxBytes); err != nil {
			return nil, err
		}
	}
	tail := vigiltype.CleanText(p.StderrTail) // a program's output: cleaned, not refused
	if len(tail) > StderrTailMaxBytes {
		tail = strings.ToValidUTF8(tail[len(tail)-StderrTailMaxBytes:], "") // keep the end
	}
	now := s.clock.Now()
	var launched *time.Time
	if p.LaunchAgeMS != nil {
		l := now.Add(-time.Duration(*p.LaunchAgeMS) * time.Millisecond)
		launched = &l
	}
	e, err := s.store.EventRecord(ctx, store.EventRecordParams{
		Agent: p.Agent, Kind: p.Kind, At: now, ExitCode: p.ExitCode, Signal: p.Signal,
		RunDurationMS: p.RunDurationMS, StderrTail: tail, Detail: p.Detail, LaunchedAt: launched,
	})
	if err != nil {
		return nil, fmt.Errorf("record %s event of agent %q: %w", p.Kind, p.Agent, err)
	}
	if s.Recorded != nil {
		s.Recorded(p.Kind)
	}
	return e, nil
}

// ListParams filters a listing.
type ListParams struct {
	Agent       string
	Undelivered bool
	Limit       int   // 0: liveness.ListLimitDefault
	BeforeID    int64 // the previous page's next cursor
}

// List returns one page newest first and the cursor of the next (0 on the last).
func (s *Service) List(ctx context.Context, p ListParams) ([]*vigiltype.ProcessEvent, int64, error) {
	if p.Agent != "" {
		if err := vigiltype.CheckName("agent", p.Agent); err != nil {
			return nil, 0, err
		}
	}
	limit, err := liveness.CheckIDPage(p.BeforeID, p.Limit)
	if err != nil {
		return nil, 0, err
	}
	list, err := s.store.EventList(ctx, store.EventListParams{
		Agent: p.Agent, Undelivered: p.Undelivered, BeforeID: p.BeforeID, Limit: limit + 1,
	})
	if err != nil {
		return nil, 0, fmt.Errorf("list events: %w", err)
	}
	list, next := liveness.TrimPage(list, limit, func(e *vigiltype.ProcessEvent) int64 { return e.EventID })
	return list, next, nil
}

// Ack marks an event delivered with kind (AckKindDefault when empty). It is
// idempotent: a second ack leaves the first one's time and kind.
func (s *Service) Ack(ctx context.Context, eventID int64, kind string) (*vigiltype.ProcessEvent, error) {
	if eventID <= 0 {
		return nil, vigiltype.Invalid("event_id", "must be a positive integer")
	}
	if kind == "" {
		kind = AckKindDefault
	}
	if err := vigiltype.CheckName("delivery_kind", kind); err != nil {
		return nil, err
	}
	e, err := s.store.EventAck(ctx, eventID, kind, s.clock.Now())
	if err != nil {
		return nil, err // the store's error names the event
	}
	return e, nil
}

// ActivePlannedStop returns the agent's planned stop marker if it covers
// now, with its age at now (AgeMS). Errors: ErrNotFound when there is none.
func (s *Service) ActivePlannedStop(ctx context.Context, agent string) (*vigiltype.PlannedStop, error) {
	if err := vigiltype.CheckName("agent", agent); err != nil {
		return nil, err
	}
	now := s.clock.Now()
	m, err := s.store.PlannedStopGet(ctx, agent, now)
	if err != nil {
		return nil, fmt.Errorf("planned stop of agent %q: %w", agent, err)
	}
	m.AgeMS = max(0, now.Sub(m.CreatedAt).Milliseconds())
	return m, nil
}

// PlannedStopParams is an operator's planned stop of an agent.
type PlannedStopParams struct {
	Reason string  `json:"reason"`
	TTLS   float64 `json:"ttl_s"` // seconds; 0: PlannedStopTTLDefault
}

// PlannedStop records that agent is being stopped on purpose: its exits for
// the TTL are suppressed (DESIGN E2). A new marker replaces the old one.
// Errors: ErrNotFound when the registry holds no such agent.
func (s *Service) PlannedStop(ctx context.Context, agent string, p PlannedStopParams) (*vigiltype.PlannedStop, error) {
	if err := vigiltype.CheckName("agent", agent); err != nil {
		return nil, err
	}
	if err := vigiltype.CheckText("reason", p.Reason); err != nil {
		return nil, err
	}
	reason := strings.TrimSpace(p.Reason)
	if reason == "" {
		return nil, vigiltype.Invalid("reason", "is required: say why the agent is stopped")
	}
	if len(reason) > ReasonMaxLen {
		return nil, vigiltype.Invalid("reason", fmt.Sprintf("must be at most %d bytes", ReasonMaxLen))
	}
	ttl := PlannedStopTTLDefault
	if p.TTLS != 0 {
		if err := liveness.CheckInterval("ttl_s", p.TTLS, 1, PlannedStopTTLMax.Seconds()); err != nil {
			return nil, err
		}
		ttl = time.Duration(p.TTLS * float64(time.Second))
	}
	// A marker for an agent the registry does not hold would suppress the
	// exits of whatever registers under that name later: refused.
	if _, err := s.store.AgentGet(ctx, agent); err != nil {
		if errors.Is(err, vigiltype.ErrNotFound) {
			return nil, err // names the agent
		}
		return nil, fmt.Errorf("planned stop of agent %q: %w", agent, err)
	}
	m, err := s.store.PlannedStopWrite(ctx, store.PlannedStopParams{Agent: agent, Reason: reason, TTL: ttl, Now: s.clock.Now()})
	if err != nil {
		return nil, fmt.Errorf("planned stop of agent %q: %w", agent, err)
	}
	return m, nil
}
