package vigiltype

import "time"

// ProcessState is what the process signal says about an agent in the fleet
// snapshot (DESIGN F2): whether its process runs, apart from what the
// registry declares and from what the agent is doing.
type ProcessState string

const (
	ProcessRunning    ProcessState = "running"
	ProcessNotRunning ProcessState = "not_running"
	ProcessUnknown    ProcessState = "unknown" // the signal could not be read
)

// OperationalState is an agent's state for an operator (DESIGN F2, F3).
type OperationalState string

const (
	StateWorking          OperationalState = "working"
	StateIdle             OperationalState = "idle"
	StateDown             OperationalState = "down"
	StateStopped          OperationalState = "stopped"
	StateTelemetryMissing OperationalState = "telemetry_missing"
)

// FleetSnapshot is the fleet snapshot (DESIGN F1–F5) served at
// GET /v1/snapshot: the server's own row (declared_status
// "self-supervising") first, then one row per registry record, not
// deduplicated.
type FleetSnapshot struct {
	TakenAt  time.Time        `json:"taken_at"`
	Hostname string           `json:"hostname"` // the server's host: "this host" for the OS check
	Agents   []*AgentSnapshot `json:"agents"`
}

// AgentSnapshot is one row of a FleetSnapshot. DeclaredStatus,
// ProcessState and OperationalState are separate facts on purpose: an
// agent declared active whose process is not running shows "down".
type AgentSnapshot struct {
	Agent          string       `json:"agent"`
	Source         string       `json:"source"`          // "self" or "registry"
	DeclaredStatus string       `json:"declared_status"` // "active", "stopped" or "self-supervising"
	ProcessState   ProcessState `json:"process_state"`
	// ProcessSignal says what decided ProcessState: "self", "os" (pid and
	// start time on the server's host), "liveness" (another host) or "none".
	ProcessSignal string `json:"process_signal"`
	// ProcessError is why ProcessState is unknown, when the OS could not be asked.
	ProcessError     string           `json:"process_error,omitempty"`
	OperationalState OperationalState `json:"operational_state"`
	// InstanceID, Hostname and PID are the newest instance's (the server's
	// own for the self row); empty when none registered.
	InstanceID *string `json:"instance_id"`
	Hostname   string  `json:"hostname"`
	PID        int     `json:"pid"`
	// RunningTasks are the tasks the instance holds under a running lease.
	RunningTasks       []SnapshotTask `json:"running_tasks"`
	TelemetryErrors    []string       `json:"telemetry_errors"`
	LatestProcessEvent *ProcessEvent  `json:"latest_process_event"`
}

// SnapshotTask names a running task in a snapshot row.
type SnapshotTask struct {
	TaskID   int64  `json:"task_id"`
	TaskType string `json:"task_type"`
}
