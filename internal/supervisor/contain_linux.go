//go:build linux

package supervisor

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER from <linux/prctl.h>.
const prSetChildSubreaper = 36

// becomeSubreaper makes this process the child subreaper of its descendants
// (prctl(2)): a process whose parent dies is reparented to the nearest living
// subreaper ancestor instead of PID 1. An agent's double-forked, setsid()'ed
// grandchild thus becomes our child, which the reaper can wait for. The
// setting is per process and stays for its lifetime.
func becomeSubreaper() error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		return fmt.Errorf("prctl(PR_SET_CHILD_SUBREAPER): %w", errno)
	}
	return nil
}

// listProcs reads every process's /proc/<pid>/stat. Processes that exit
// meanwhile are skipped.
func listProcs() ([]procInfo, error) {
	pids, err := procPIDs()
	if err != nil {
		return nil, err
	}
	buf := procBufs.Get().(*[]byte)
	defer procBufs.Put(buf)
	procs := make([]procInfo, 0, len(pids))
	for _, pid := range pids {
		stat, err := readProcFile(pid, "stat", buf)
		if err != nil {
			continue
		}
		p, ok := parseProcStatFull(stat)
		if !ok {
			continue
		}
		p.pid = pid
		procs = append(procs, p)
	}
	return procs, nil
}

// environHas reports whether process pid's initial environment (the one it
// was exec'd with) holds the entry kv ("NAME=value"), or, with prefix set,
// an entry starting with kv. A zombie's environment reads empty.
func environHas(pid int, kv string, prefix bool) bool {
	buf := procBufs.Get().(*[]byte)
	defer procBufs.Put(buf)
	env, err := readProcFile(pid, "environ", buf)
	if err != nil {
		return false // gone, or not ours to read
	}
	for len(env) > 0 {
		entry := env
		if j := bytes.IndexByte(env, 0); j >= 0 {
			entry, env = env[:j], env[j+1:]
		} else {
			env = nil
		}
		if prefix && bytes.HasPrefix(entry, []byte(kv)) || string(entry) == kv {
			return true
		}
	}
	return false
}

// generationPIDs lists the live processes carrying the generation marker
// entry kv in their environment, wherever they are in the process tree and
// whatever their group or session. With scope set, only the processes it
// may hold have their environment read.
func generationPIDs(kv string, scope *genScope) []int {
	procs, err := listProcs()
	if err != nil {
		return nil
	}
	return generationPIDsIn(procs, kv, scope)
}

// generationPIDsIn is generationPIDs on the scan procs.
func generationPIDsIn(procs []procInfo, kv string, scope *genScope) []int {
	var parent map[int]int
	if scope != nil {
		parent = make(map[int]int, len(procs))
		for _, p := range procs {
			parent[p.pid] = p.ppid
		}
	}
	var pids []int
	self := os.Getpid()
	for _, p := range procs {
		if p.pid == self || !p.live() || scope != nil && !scope.mayHold(p.pid, parent) {
			continue
		}
		if environHas(p.pid, kv, false) {
			pids = append(pids, p.pid)
		}
	}
	return pids
}

// genScope narrows the scan for one generation's processes when this
// process is a child subreaper: every process of a generation then
// descends from it (an orphan is reparented to it, not to init), and none
// descends from another agent's leader (a process only ever moves up its
// tree). So the environment of a process is read only if it descends from
// this process other than through another agent's leader, or if the scan
// cannot follow its ancestry (a parent that exited meanwhile). On a busy
// host this skips most processes; a restart no longer reads every
// process's environment (issue #6).
type genScope struct {
	self   int
	leader int              // the generation's own leader
	others map[int]struct{} // every other agent's leader
}

// mayHold reports whether process pid may belong to the generation, given
// the scan's parent of each process.
func (g *genScope) mayHold(pid int, parent map[int]int) bool {
	for range len(parent) + 1 { // bounds a (transient) cycle
		if _, other := g.others[pid]; other && pid != g.leader {
			return false
		}
		ppid, ok := parent[pid]
		switch {
		case !ok:
			return true // exited meanwhile: cannot tell
		case ppid == g.self:
			return true
		case ppid <= 1:
			return false // init's, or outside our PID namespace
		}
		pid = ppid
	}
	return true
}

// signalPIDs sends sig to each pid; one that is gone already is not an
// error.
func signalPIDs(pids []int, sig syscall.Signal) error {
	var errs []error
	for _, pid := range pids {
		if pid <= 1 {
			continue
		}
		if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("signal %d with %s: %w", pid, sig, err))
		}
	}
	return errors.Join(errs...)
}

// reapPID reaps pid if it is a zombie child of ours; ok is false if it is
// still running or not our child.
func reapPID(pid int) (syscall.WaitStatus, bool) {
	var ws syscall.WaitStatus
	wpid, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
	return ws, err == nil && wpid == pid
}

// containSupported reports whether descendants that leave the process group
// can be tracked here.
const containSupported = true

// procStartTime is process pid's start time in clock ticks since boot
// (/proc/<pid>/stat field 22): with the pid, it names one process for good.
func procStartTime(pid int) (uint64, bool) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	state, start, ok := parseStatStartTime(stat)
	if !ok || state == 'Z' || state == 'X' {
		return 0, false
	}
	return start, true
}

// generationOf returns the EnvGeneration value of process pid, if any.
func generationOf(pid int) (string, bool) {
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return "", false
	}
	for entry := range bytes.SplitSeq(env, []byte{0}) {
		if v, ok := bytes.CutPrefix(entry, []byte(EnvGeneration+"=")); ok {
			return string(v), true
		}
	}
	return "", false
}

// orphanedGenerationPIDs lists live processes launched for one of agents by
// a supervisor that is no longer running: their EnvGeneration names a
// supervisor (pid and start time) that is gone. self is this supervisor's
// own generation prefix, whose processes are never listed.
func orphanedGenerationPIDs(agents map[string]bool, self string) []int {
	procs, err := listProcs()
	if err != nil {
		return nil
	}
	var pids []int
	me := os.Getpid()
	for _, p := range procs {
		if p.pid == me || !p.live() {
			continue
		}
		gen, ok := generationOf(p.pid)
		if !ok || strings.HasPrefix(gen, self) {
			continue
		}
		sup, agent, ok := parseGeneration(gen)
		if !ok || !agents[agent] || supervisorRunning(sup) {
			continue
		}
		pids = append(pids, p.pid)
	}
	return pids
}

// supervisorRunning reports whether the supervisor named "pid-starttime" in
// a generation marker still runs.
func supervisorRunning(sup string) bool {
	pidText, startText, ok := strings.Cut(sup, "-")
	if !ok {
		return true // not ours to judge: leave it alone
	}
	pid, err1 := strconv.Atoi(pidText)
	start, err2 := strconv.ParseUint(startText, 10, 64)
	if err1 != nil || err2 != nil {
		return true
	}
	now, ok := procStartTime(pid)
	return ok && now == start
}

// selfStartTime is this process's start time, for its generation markers.
func selfStartTime() uint64 {
	t, _ := procStartTime(os.Getpid())
	return t
}

// ownsProcess reports whether pid is the agent's current process or one of
// its generation's descendants (it carries the marker gen).
func ownsProcess(pid, leader int, gen string) bool {
	return pid == leader || (gen != "" && environHas(pid, gen, false))
}
