package heartbeat

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Scan lists the heartbeat loops owned by the calling user, from /proc.
func Scan() ([]LoopProcess, error) {
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", procRoot, err)
	}
	uid := uint32(os.Getuid())
	var out []LoopProcess
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		dir := procRoot + "/" + e.Name()
		var st syscall.Stat_t
		if syscall.Stat(dir, &st) != nil || st.Uid != uid {
			continue
		}
		raw, err := os.ReadFile(dir + "/cmdline")
		if err != nil || len(raw) == 0 {
			continue
		}
		argv := strings.Split(string(bytes.TrimRight(raw, "\x00")), "\x00")
		workdir, parent, ok := ParseLoopArgs(argv)
		if !ok {
			continue
		}
		state, start, err := readProcStat(pid)
		if err != nil || state == 'Z' {
			continue
		}
		lp := LoopProcess{PID: pid, StartTime: start, Workdir: workdir, Parent: parent}
		lp.WorkdirGone, err = cwdGone(pid)
		if err != nil {
			continue // exited meanwhile, or not ours to read
		}
		out = append(out, lp)
	}
	return out, nil
}

// cwdGone reports whether the cwd of pid was deleted: the directory the
// /proc/PID/cwd link resolves to has no links left.
func cwdGone(pid int) (bool, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(procRoot+"/"+strconv.Itoa(pid)+"/cwd", &st); err != nil {
		return false, err
	}
	return st.Nlink == 0, nil
}

// Sweep scans for loops under roots (absolute, clean; none: all the
// user's loops), judges each and, unless dryRun, SIGTERMs those to end.
func Sweep(roots []string, dryRun bool) ([]SweepReport, error) {
	loops, err := Scan()
	if err != nil {
		return nil, err
	}
	var out []SweepReport
	for _, lp := range loops {
		if !UnderRoots(lp.Workdir, roots) {
			continue
		}
		v := Judge(lp, Alive(lp.Parent))
		r := SweepReport{LoopProcess: lp, ParentPID: lp.Parent.PID, Reason: v.Reason}
		switch {
		case !v.Terminate:
			r.Action = SweepLeftAlone
		case dryRun:
			r.Action = SweepWouldTerminate
		default:
			self := ProcRef{PID: lp.PID, StartTime: lp.StartTime}
			if !Alive(self) {
				continue // exited on its own meanwhile
			}
			if err := syscall.Kill(lp.PID, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
				r.Action, r.Reason = SweepError, fmt.Sprintf("%s; SIGTERM: %v", v.Reason, err)
			} else {
				r.Action = SweepTerminated
			}
		}
		out = append(out, r)
	}
	return out, nil
}
