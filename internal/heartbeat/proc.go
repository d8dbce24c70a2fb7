package heartbeat

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ProcRef names one process across time: its pid and its start time, so a
// pid later reused by an unrelated process is not mistaken for it.
// StartTime 0 means unknown (not compared).
type ProcRef struct {
	PID       int
	StartTime uint64
}

func (r ProcRef) String() string {
	return strconv.Itoa(r.PID) + " " + strconv.FormatUint(r.StartTime, 10)
}

// parseProcRef reads "PID STARTTIME" (STARTTIME optional).
func parseProcRef(s string) (ProcRef, error) {
	f := strings.Fields(s)
	if len(f) == 0 || len(f) > 2 {
		return ProcRef{}, fmt.Errorf("want \"PID STARTTIME\", got %q", strings.TrimSpace(s))
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil || pid <= 0 {
		return ProcRef{}, fmt.Errorf("pid %q: must be a positive integer", f[0])
	}
	r := ProcRef{PID: pid}
	if len(f) == 2 {
		if r.StartTime, err = strconv.ParseUint(f[1], 10, 64); err != nil {
			return ProcRef{}, fmt.Errorf("start time %q: %w", f[1], err)
		}
	}
	return r, nil
}

// Observation is what the host says about a pid at one moment.
type Observation struct {
	Exists    bool   // the pid names a process (kill(pid, 0) EPERM included)
	Zombie    bool   // it exited and awaits its parent's wait
	StartTime uint64 // 0: unknown
}

// SameProcessAlive decides whether ref still names the process it named
// when captured: gone if the pid is free, a zombie, or now held by another
// process (start times differ). Unknown start times are not compared.
func SameProcessAlive(ref ProcRef, obs Observation) bool {
	if !obs.Exists || obs.Zombie {
		return false
	}
	if ref.StartTime != 0 && obs.StartTime != 0 && ref.StartTime != obs.StartTime {
		return false
	}
	return true
}

// Alive observes ref.PID now and decides with SameProcessAlive.
func Alive(ref ProcRef) bool {
	if ref.PID <= 0 {
		return false
	}
	return SameProcessAlive(ref, Observe(ref.PID))
}

// Capture returns a ProcRef for pid with its current start time; an error
// when no such process exists.
func Capture(pid int) (ProcRef, error) {
	if pid <= 0 {
		return ProcRef{}, fmt.Errorf("pid %d: must be positive", pid)
	}
	obs := Observe(pid)
	if !obs.Exists || obs.Zombie {
		return ProcRef{}, fmt.Errorf("pid %d: no such live process", pid)
	}
	return ProcRef{PID: pid, StartTime: obs.StartTime}, nil
}

// errNoProcess is returned by readProcStat for a pid that does not exist.
var errNoProcess = errors.New("no such process")

// parseStat parses the text of /proc/PID/stat: the state (field 3) and the
// start time (field 22). comm (field 2) may hold spaces and parentheses, so
// fields are counted after its last ')'.
func parseStat(b []byte) (state byte, start uint64, err error) {
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, errors.New("stat: no ')' after comm")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state), so field 22 is f[19].
	if len(f) < 20 {
		return 0, 0, fmt.Errorf("stat: %d fields after comm, want at least 20", len(f))
	}
	if len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("stat: state %q", f[0])
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("stat: start time %q: %w", f[19], err)
	}
	return f[0][0], start, nil
}

// removeIfOwned removes the pid file at path if it names pid.
func removeIfOwned(path string, pid int) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	ref, err := parseProcRef(string(b))
	if err != nil || ref.PID != pid {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
