package heartbeat

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// File names under a workdir's state directory (see the package doc).
const (
	StateDirName  = ".vigil"
	PIDFile       = "heartbeat.pid"
	ParentPIDFile = "heartbeat.parent.pid"
	InstanceFile  = "instance.json"
	TaskFile      = "task.json"
	ActivityFile  = "last-activity"
	LogFile       = "heartbeat.log"
)

// ErrNoState is returned when a state file does not exist.
var ErrNoState = errors.New("no such state file")

// State is the state directory <workdir>/.vigil/ of one session.
type State struct {
	Workdir string // absolute
}

// Open returns the State of workdir, which must exist and be a directory.
// It does not create .vigil/ (Init does).
func Open(workdir string) (State, error) {
	if workdir == "" {
		return State{}, errors.New("workdir is empty")
	}
	abs, err := filepath.Abs(workdir)
	if err != nil {
		return State{}, err
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return State{}, err
	}
	if !fi.IsDir() {
		return State{}, fmt.Errorf("%s is not a directory", abs)
	}
	return State{Workdir: abs}, nil
}

// Dir is <workdir>/.vigil.
func (s State) Dir() string { return filepath.Join(s.Workdir, StateDirName) }

// Path is the path of the state file name.
func (s State) Path(name string) string { return filepath.Join(s.Dir(), name) }

// Init creates the state directory (0700) if it is missing.
func (s State) Init() error {
	if err := os.MkdirAll(s.Dir(), 0o700); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	return nil
}

// writeFile writes data to name atomically (temp file + rename).
func (s State) writeFile(name string, data []byte, perm os.FileMode) error {
	if err := s.Init(); err != nil {
		return err
	}
	f, err := os.CreateTemp(s.Dir(), "."+name+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	cerr := f.Close()
	if err := errors.Join(werr, cerr, os.Chmod(tmp, perm)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := os.Rename(tmp, s.Path(name)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

func (s State) readFile(name string) ([]byte, error) {
	b, err := os.ReadFile(s.Path(name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", s.Path(name), ErrNoState)
	}
	if err != nil {
		return nil, err
	}
	return b, nil
}

// WriteProcRef writes ref to the pid file name ("PID STARTTIME").
func (s State) WriteProcRef(name string, ref ProcRef) error {
	return s.writeFile(name, []byte(ref.String()+"\n"), 0o644)
}

// ReadProcRef reads the pid file name. Errors: ErrNoState.
func (s State) ReadProcRef(name string) (ProcRef, error) {
	b, err := s.readFile(name)
	if err != nil {
		return ProcRef{}, err
	}
	ref, err := parseProcRef(string(b))
	if err != nil {
		return ProcRef{}, fmt.Errorf("%s: %w", s.Path(name), err)
	}
	return ref, nil
}

// Remove removes the state file name; a missing file is not an error.
func (s State) Remove(name string) error {
	if err := os.Remove(s.Path(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// InstanceState is instance.json: the session's process instance.
type InstanceState struct {
	InstanceID    string `json:"instance_id"`
	InstanceToken string `json:"instance_token"`
	ProcessKind   string `json:"process_kind"`
	Hostname      string `json:"hostname"`
	// Owner is the process the instance was registered for (its pid is
	// the instance's pid).
	OwnerPID       int    `json:"owner_pid"`
	OwnerStartTime uint64 `json:"owner_start_time"`
	// LivenessIntervalS is the liveness interval it registered with.
	LivenessIntervalS float64 `json:"liveness_interval_s"`
}

// Owner is the ProcRef of the process the instance stands for.
func (i InstanceState) Owner() ProcRef {
	return ProcRef{PID: i.OwnerPID, StartTime: i.OwnerStartTime}
}

// WriteInstance writes instance.json with mode 0600: it holds the token.
func (s State) WriteInstance(i InstanceState) error {
	b, err := json.MarshalIndent(i, "", "  ")
	if err != nil {
		return err
	}
	return s.writeFile(InstanceFile, append(b, '\n'), 0o600)
}

// ReadInstance reads instance.json. Errors: ErrNoState.
func (s State) ReadInstance() (InstanceState, error) {
	var i InstanceState
	b, err := s.readFile(InstanceFile)
	if err != nil {
		return i, err
	}
	if err := json.Unmarshal(b, &i); err != nil {
		return i, fmt.Errorf("%s: %w", s.Path(InstanceFile), err)
	}
	if i.InstanceID == "" || i.InstanceToken == "" {
		return i, fmt.Errorf("%s: lacks instance_id or instance_token", s.Path(InstanceFile))
	}
	return i, nil
}

// TaskState is task.json: the task the session holds.
type TaskState struct {
	TaskID     int64     `json:"task_id"`
	TaskType   string    `json:"task_type,omitempty"`
	LeaseEpoch int64     `json:"lease_epoch"`
	InstanceID string    `json:"instance_id"`
	ClaimedAt  time.Time `json:"claimed_at"`
}

// WriteTask writes task.json.
func (s State) WriteTask(t TaskState) error {
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	return s.writeFile(TaskFile, append(b, '\n'), 0o644)
}

// ReadTask reads task.json. Errors: ErrNoState.
func (s State) ReadTask() (TaskState, error) {
	var t TaskState
	b, err := s.readFile(TaskFile)
	if err != nil {
		return t, err
	}
	if err := json.Unmarshal(b, &t); err != nil {
		return t, fmt.Errorf("%s: %w", s.Path(TaskFile), err)
	}
	if t.TaskID <= 0 || t.LeaseEpoch <= 0 {
		return t, fmt.Errorf("%s: lacks task_id or lease_epoch", s.Path(TaskFile))
	}
	return t, nil
}

// TouchActivity sets the mtime of last-activity to now, creating the file
// (and the state dir) if needed. It makes no server call.
func (s State) TouchActivity(now time.Time) error {
	p := s.Path(ActivityFile)
	if err := os.Chtimes(p, now, now); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("touch %s: %w", p, err)
	}
	if err := s.Init(); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("touch %s: %w", p, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("touch %s: %w", p, err)
	}
	if err := os.Chtimes(p, now, now); err != nil {
		return fmt.Errorf("touch %s: %w", p, err)
	}
	return nil
}

// Activity returns the mtime of last-activity; ok is false when the file
// does not exist.
func (s State) Activity() (mtime time.Time, ok bool, err error) {
	fi, err := os.Stat(s.Path(ActivityFile))
	if errors.Is(err, os.ErrNotExist) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, err
	}
	return fi.ModTime(), true, nil
}

// LoopStatus is what the state dir says about the heartbeat loop.
type LoopStatus struct {
	Loop        *ProcRef // nil: no pid file
	Running     bool     // the pid file names the same live process
	Parent      *ProcRef // nil: no parent pid file
	ParentAlive bool
}

// Status reads the pid files and checks both processes.
func (s State) Status() (LoopStatus, error) {
	var st LoopStatus
	ref, err := s.ReadProcRef(PIDFile)
	switch {
	case err == nil:
		st.Loop = &ref
		st.Running = Alive(ref)
	case !errors.Is(err, ErrNoState):
		return st, err
	}
	pref, err := s.ReadProcRef(ParentPIDFile)
	switch {
	case err == nil:
		st.Parent = &pref
		st.ParentAlive = Alive(pref)
	case !errors.Is(err, ErrNoState):
		return st, err
	}
	return st, nil
}
