package heartbeat

import (
	"errors"
	"os"
	"strconv"
	"syscall"
)

// procRoot is where /proc is mounted.
const procRoot = "/proc"

// readProcStat reads the state and start time of pid from /proc/PID/stat.
func readProcStat(pid int) (state byte, start uint64, err error) {
	b, err := os.ReadFile(procRoot + "/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return 0, 0, errNoProcess
	}
	if err != nil {
		return 0, 0, err
	}
	return parseStat(b)
}

// ProcStartTime returns field 22 of /proc/PID/stat: the process start time
// in clock ticks since boot.
func ProcStartTime(pid int) (uint64, error) {
	_, start, err := readProcStat(pid)
	return start, err
}

// Observe reads /proc/PID/stat; when /proc cannot tell (hidepid, no /proc)
// it falls back to kill(pid, 0), where EPERM means the process exists.
func Observe(pid int) Observation {
	state, start, err := readProcStat(pid)
	switch {
	case err == nil:
		return Observation{Exists: true, Zombie: state == 'Z' || state == 'X', StartTime: start}
	case errors.Is(err, errNoProcess):
		return Observation{}
	}
	return observeKill(pid)
}

func observeKill(pid int) Observation {
	err := syscall.Kill(pid, 0)
	if err == nil || errors.Is(err, syscall.EPERM) {
		return Observation{Exists: true}
	}
	return Observation{}
}
