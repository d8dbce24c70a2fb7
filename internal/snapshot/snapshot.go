// Package snapshot reads the fleet snapshot (DESIGN F1–F5): one correlated,
// read-only view of the agent registry, the process instances, the tasks
// they hold and their latest process events, for a dashboard or an operator.
//
// # Rows (F1)
//
// The first row is the self-reported process: the vigil server taking the
// snapshot. Its declared_status is "self-supervising" and its process_state
// is running by construction (it is answering). Then comes one row per
// registry record, oldest first, stopped ones included. Rows are never
// deduplicated: an agent named like the server still gets its own row.
//
// # Three separate fields (F2)
//
// declared_status is the registry's durable intent (active, stopped) and is
// never inferred. process_state is what the process signal says now:
//
//   - no instance of the agent's kind ever registered: not_running.
//   - the newest instance (liveness Latest, kind = agent name) registered
//     from this host: the OS is asked about its pid (gopsutil; Linux, macOS
//     and Windows). The pid counts only if the process holding it was created
//     no later than the instance's started_at + StartTolerance: started_at
//     is the server's time of registration, so a process created after it
//     holds a reused pid and is not the instance. A zombie counts as gone.
//     Lookups, hits and misses alike, are cached for 7.5s (F4) on the
//     injected clock. When the OS cannot be asked: unknown, with the reason
//     in process_error.
//   - the instance registered from another host: its liveness rows decide
//     (F4): alive → running, stopped → not_running.
//
// A failed read of the instance itself (the store) makes process_state
// unknown and is listed in telemetry_errors.
//
// # Telemetry and operational state (F3, F5)
//
// For each registry row the snapshot reads the running tasks held by the
// newest instance (lease_owner = instance_id) and the agent's latest process
// event (latest_process_event, F5). Any failed read is listed in
// telemetry_errors — never swallowed — and makes the row telemetry_missing.
// operational_state then follows Operational, in this precedence:
//
//	telemetry read failed                → telemetry_missing
//	else declared stopped                → stopped
//	else process running, a task running → working
//	else process running                 → idle
//	else                                 → down (unknown included)
//
// So an agent declared active whose process is not running shows down: the
// mismatch stays visible. Check process_state to tell "confirmed not
// running" from "could not check".
//
// The reads are sequential point-in-time reads, not one transaction: the
// snapshot is a correlated view, not an atomic one.
package snapshot

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/vigil-fleet/vigil/internal/clock"
	"github.com/vigil-fleet/vigil/internal/events"
	"github.com/vigil-fleet/vigil/internal/lease"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// The snapshot's types are vigiltype's, shared with the Go client.
type (
	ProcessState     = vigiltype.ProcessState
	OperationalState = vigiltype.OperationalState
	Agent            = vigiltype.AgentSnapshot
	TaskRef          = vigiltype.SnapshotTask
	Snapshot         = vigiltype.FleetSnapshot
)

const (
	ProcessRunning        = vigiltype.ProcessRunning
	ProcessNotRunning     = vigiltype.ProcessNotRunning
	ProcessUnknown        = vigiltype.ProcessUnknown
	StateWorking          = vigiltype.StateWorking
	StateIdle             = vigiltype.StateIdle
	StateDown             = vigiltype.StateDown
	StateStopped          = vigiltype.StateStopped
	StateTelemetryMissing = vigiltype.StateTelemetryMissing
)

// DeclaredSelfSupervising is the declared_status of the self-reported row,
// which has no registry record.
const DeclaredSelfSupervising = "self-supervising"

// Row sources.
const (
	SourceSelf     = "self"
	SourceRegistry = "registry"
)

// Process signals: what decided process_state.
const (
	SignalSelf     = "self"     // the process taking the snapshot
	SignalOS       = "os"       // OS lookup by pid and start time on this host
	SignalLiveness = "liveness" // liveness heartbeats of an instance on another host
	SignalNone     = "none"     // no instance registered
)

// SelfNameDefault is the agent name of the self-reported row.
const SelfNameDefault = "vigil"

// Operational derives the operational state (DESIGN F3). It is the whole
// precedence, in one place:
//
//	telemetryFailed → telemetry_missing; else declared stopped → stopped;
//	else running → working (taskRunning) or idle; else down.
func Operational(telemetryFailed bool, declared string, ps ProcessState, taskRunning bool) OperationalState {
	switch {
	case telemetryFailed:
		return StateTelemetryMissing
	case declared == string(vigiltype.AgentStopped):
		return StateStopped
	case ps == ProcessRunning && taskRunning:
		return StateWorking
	case ps == ProcessRunning:
		return StateIdle
	default:
		return StateDown
	}
}

// AgentLister lists registry records (*registry.Service).
type AgentLister interface {
	List(ctx context.Context) ([]*vigiltype.Agent, error)
}

// InstanceReader returns the newest instance of a kind, an error wrapping
// vigiltype.ErrNotFound when none registered (*liveness.Service).
type InstanceReader interface {
	Latest(ctx context.Context, kind string) (*vigiltype.Process, error)
}

// TaskReader returns the running tasks held by one instance.
type TaskReader interface {
	RunningTasks(ctx context.Context, instanceID string) ([]*vigiltype.Task, error)
}

// EventReader returns an agent's newest process event, nil when none.
type EventReader interface {
	LatestEvent(ctx context.Context, agent string) (*vigiltype.ProcessEvent, error)
}

// LeaseTasks reads running tasks from the lease service.
func LeaseTasks(l *lease.Service) TaskReader { return leaseTasks{l} }

type leaseTasks struct{ l *lease.Service }

// leasePageSize is the page size of the running-task scan (the API maximum).
const leasePageSize = 1000

func (r leaseTasks) RunningTasks(ctx context.Context, instanceID string) ([]*vigiltype.Task, error) {
	var held []*vigiltype.Task
	var before int64
	for {
		page, next, err := r.l.List(ctx, lease.ListParams{
			Status: string(vigiltype.TaskRunning), Limit: leasePageSize, BeforeID: before,
		})
		if err != nil {
			return nil, err
		}
		for _, t := range page {
			if t.LeaseOwner != nil && *t.LeaseOwner == instanceID {
				held = append(held, t)
			}
		}
		if next == 0 {
			return held, nil
		}
		before = next
	}
}

// EventLog reads latest events from the events service.
func EventLog(e *events.Service) EventReader { return eventLog{e} }

type eventLog struct{ e *events.Service }

func (r eventLog) LatestEvent(ctx context.Context, agent string) (*vigiltype.ProcessEvent, error) {
	list, _, err := r.e.List(ctx, events.ListParams{Agent: agent, Limit: 1})
	if err != nil || len(list) == 0 {
		return nil, err
	}
	return list[0], nil
}

// Config wires a Service. Registry, Liveness, Tasks and Events are required.
type Config struct {
	Registry AgentLister
	Liveness InstanceReader
	Tasks    TaskReader
	Events   EventReader
	// Finder asks the OS about a pid; OSFinder{} when nil.
	Finder ProcessFinder
	// Clock stamps the snapshot and ages the discovery cache; clock.Real when nil.
	Clock clock.Clock
	// Hostname is this host, compared with an instance's hostname; os.Hostname() when "".
	Hostname string
	// SelfName is the self row's agent name (SelfNameDefault).
	SelfName string
	// SelfPID is the self row's pid; os.Getpid() when 0.
	SelfPID int
	// CacheTTL is the discovery cache's TTL (DiscoveryCacheTTLDefault).
	CacheTTL time.Duration
	// StartTolerance bounds how much later than started_at a process may
	// have been created and still be the instance (StartToleranceDefault).
	StartTolerance time.Duration
}

// Service takes fleet snapshots. Create it with New; it is safe for
// concurrent use.
type Service struct {
	cfg    Config
	finder *cachedFinder
}

// New fills cfg's defaults and validates it.
func New(cfg Config) (*Service, error) {
	if cfg.Registry == nil || cfg.Liveness == nil || cfg.Tasks == nil || cfg.Events == nil {
		return nil, errors.New("snapshot: Registry, Liveness, Tasks and Events are required")
	}
	if cfg.Finder == nil {
		cfg.Finder = OSFinder{}
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Hostname == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("snapshot: this host's name: %w", err)
		}
		cfg.Hostname = h
	}
	cfg.SelfName = cmp.Or(cfg.SelfName, SelfNameDefault)
	cfg.SelfPID = cmp.Or(cfg.SelfPID, os.Getpid())
	cfg.CacheTTL = cmp.Or(cfg.CacheTTL, DiscoveryCacheTTLDefault)
	cfg.StartTolerance = cmp.Or(cfg.StartTolerance, StartToleranceDefault)
	if cfg.CacheTTL < 0 {
		return nil, fmt.Errorf("snapshot: CacheTTL must be positive, got %s", cfg.CacheTTL)
	}
	if cfg.StartTolerance < 0 {
		return nil, fmt.Errorf("snapshot: StartTolerance must be positive, got %s", cfg.StartTolerance)
	}
	return &Service{cfg: cfg, finder: newCachedFinder(cfg.Finder, cfg.Clock, cfg.CacheTTL)}, nil
}

// Take reads a snapshot. Only a failed registry listing fails it; every
// other failed read is reported in its row.
func (s *Service) Take(ctx context.Context) (*Snapshot, error) {
	agents, err := s.cfg.Registry.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("snapshot: list agents: %w", err)
	}
	snap := &Snapshot{TakenAt: s.cfg.Clock.Now().Truncate(time.Millisecond), Hostname: s.cfg.Hostname, Agents: make([]*Agent, 0, len(agents)+1)}
	snap.Agents = append(snap.Agents, s.selfRow())
	for _, a := range agents {
		snap.Agents = append(snap.Agents, s.agentRow(ctx, a))
	}
	return snap, nil
}

func (s *Service) selfRow() *Agent {
	row := &Agent{
		Agent: s.cfg.SelfName, Source: SourceSelf, DeclaredStatus: DeclaredSelfSupervising,
		ProcessState: ProcessRunning, ProcessSignal: SignalSelf,
		Hostname: s.cfg.Hostname, PID: s.cfg.SelfPID,
		RunningTasks: []TaskRef{}, TelemetryErrors: []string{},
	}
	row.OperationalState = Operational(false, row.DeclaredStatus, row.ProcessState, false)
	return row
}

func (s *Service) agentRow(ctx context.Context, a *vigiltype.Agent) *Agent {
	row := &Agent{
		Agent: a.Name, Source: SourceRegistry, DeclaredStatus: string(a.Status),
		ProcessState: ProcessNotRunning, ProcessSignal: SignalNone,
		RunningTasks: []TaskRef{}, TelemetryErrors: []string{},
	}
	inst, err := s.cfg.Liveness.Latest(ctx, a.Name)
	switch {
	case errors.Is(err, vigiltype.ErrNotFound):
		// Never registered: not running.
	case err != nil:
		row.ProcessState = ProcessUnknown
		row.TelemetryErrors = append(row.TelemetryErrors, fmt.Sprintf("read newest instance: %v", err))
	default:
		row.InstanceID, row.Hostname, row.PID = &inst.InstanceID, inst.Hostname, inst.PID
		s.processState(ctx, row, inst)
		tasks, err := s.cfg.Tasks.RunningTasks(ctx, inst.InstanceID)
		if err != nil {
			row.TelemetryErrors = append(row.TelemetryErrors, fmt.Sprintf("read running tasks: %v", err))
		}
		for _, t := range tasks {
			row.RunningTasks = append(row.RunningTasks, TaskRef{TaskID: t.TaskID, TaskType: t.TaskType})
		}
	}
	ev, err := s.cfg.Events.LatestEvent(ctx, a.Name)
	if err != nil {
		row.TelemetryErrors = append(row.TelemetryErrors, fmt.Sprintf("read latest process event: %v", err))
	}
	row.LatestProcessEvent = ev
	row.OperationalState = Operational(len(row.TelemetryErrors) > 0, row.DeclaredStatus, row.ProcessState, len(row.RunningTasks) > 0)
	return row
}

// processState sets the row's process state from inst: the OS on this
// host, the liveness rows on another (DESIGN F4).
func (s *Service) processState(ctx context.Context, row *Agent, inst *vigiltype.Process) {
	if inst.Hostname != s.cfg.Hostname {
		row.ProcessSignal = SignalLiveness
		row.ProcessState = ProcessNotRunning
		if inst.Status == vigiltype.ProcessAlive {
			row.ProcessState = ProcessRunning
		}
		return
	}
	row.ProcessSignal = SignalOS
	l, err := s.finder.Find(ctx, inst.PID)
	if err != nil {
		row.ProcessState = ProcessUnknown
		row.ProcessError = err.Error()
		return
	}
	row.ProcessState = MatchInstance(l, inst.StartedAt, s.cfg.StartTolerance)
}
