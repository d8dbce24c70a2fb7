package heartbeat

import (
	"path/filepath"
	"strconv"
	"strings"
)

// LoopProcess is one heartbeat loop process found on the host.
type LoopProcess struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
	// Workdir is the --workdir the loop was started with.
	Workdir string `json:"workdir"`
	// Parent is the process bounding the loop, from its command line.
	Parent ProcRef `json:"-"`
	// WorkdirGone: the loop's cwd (its workdir) has link count 0, i.e. it
	// was deleted (decided from the link count, not from the path).
	WorkdirGone bool `json:"workdir_gone"`
}

// Verdict is the watchdog's decision on one loop.
type Verdict struct {
	Terminate bool
	Reason    string
}

// Judge decides whether the watchdog terminates lp (pure): yes when its
// workdir is gone or its parent is dead.
func Judge(lp LoopProcess, parentAlive bool) Verdict {
	switch {
	case lp.WorkdirGone:
		return Verdict{true, "workdir " + lp.Workdir + " is gone"}
	case !parentAlive:
		return Verdict{true, "parent " + strconv.Itoa(lp.Parent.PID) + " is dead"}
	}
	return Verdict{false, "workdir exists and parent " + strconv.Itoa(lp.Parent.PID) + " lives"}
}

// UnderRoots reports whether dir is one of roots or below one (all
// absolute and clean). No roots: everything is under.
func UnderRoots(dir string, roots []string) bool {
	if len(roots) == 0 {
		return true
	}
	for _, r := range roots {
		rel, err := filepath.Rel(r, dir)
		if err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return true
		}
	}
	return false
}

// ParseLoopArgs recognises a heartbeat loop command line (argv[1:3] ==
// "heartbeat loop") and returns its workdir and parent. ok is false for
// any other command.
func ParseLoopArgs(argv []string) (workdir string, parent ProcRef, ok bool) {
	if len(argv) < 3 || argv[1] != "heartbeat" || argv[2] != "loop" {
		return "", ProcRef{}, false
	}
	get := func(name string) string {
		for i := 3; i < len(argv); i++ {
			a := argv[i]
			if a == "--" {
				break
			}
			if v, found := strings.CutPrefix(a, "--"+name+"="); found {
				return v
			}
			if a == "--"+name && i+1 < len(argv) {
				return argv[i+1]
			}
		}
		return ""
	}
	workdir = get("workdir")
	pid, err := strconv.Atoi(get("parent-pid"))
	if workdir == "" || err != nil || pid <= 0 {
		return "", ProcRef{}, false
	}
	start, _ := strconv.ParseUint(get("parent-start"), 10, 64)
	return workdir, ProcRef{PID: pid, StartTime: start}, true
}

// SweepReport is what the watchdog did about one loop.
type SweepReport struct {
	LoopProcess
	ParentPID int    `json:"parent_pid"`
	Action    string `json:"action"` // terminated, would_terminate, left_alone, error
	Reason    string `json:"reason"`
}

// Sweep actions.
const (
	SweepTerminated     = "terminated"
	SweepWouldTerminate = "would_terminate"
	SweepLeftAlone      = "left_alone"
	SweepError          = "error"
)
