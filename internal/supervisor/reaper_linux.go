//go:build linux

package supervisor

import (
	"context"
	"errors"
	"maps"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// reaper reaps the orphans reparented to this (subreaper) process: the
// agents' descendants whose parent died. It is the only code here that calls
// wait4 for anything but an agent's leader, whose status belongs to os/exec.
//
// It never calls wait4(-1): this process may have other children (the
// daemon's and the CLI's own os/exec children, other supervisors' agents,
// tests), and reaping one of them would steal its exit status from its
// cmd.Wait. A zombie child is reaped
//   - when known to descend from an agent: seen alive with this
//     supervisor's generation marker (EnvGeneration) in its environment, in
//     the process group of an agent generation, or in a session created by
//     a process that carried the marker; or
//   - whatever its session or group, when no os/exec caller waits for it:
//     os.Process holds a pidfd for each child it starts until Wait has
//     reaped it (osHoldsPidfds), and this process holds none for it
//     (pidfdPIDs). This catches the orphan that setsid()s and dies before
//     any pass saw it alive (issue #12: `setsid -f true` ten times a second
//     left 10 zombies a second). Where os uses no pidfds (Linux before 5.4,
//     a seccomp filter), only the known descendants are reaped.
//
// Leaders are registered under mu while os/exec starts them, so a pass never
// sees an unregistered leader.
type reaper struct {
	self     int
	marker   string // EnvGeneration + "=" + this supervisor's prefix
	onReaped func(pid int, ws syscall.WaitStatus)

	mu       sync.Mutex
	leaders  map[int]struct{} // started by os/exec, not yet waited: never ours to reap
	groups   map[int]struct{} // process groups of agent generations
	seen     map[int]struct{} // live descendants seen carrying the marker
	sessions map[int]struct{} // sessions led by a marked process

	// Scratch maps of pass, kept between passes (cleared, not
	// reallocated), so that an idle fleet's passes make little garbage.
	scratchParent                                  map[int]int
	scratchPresent, scratchGroups, scratchSessions map[int]struct{}
}

func newReaper(marker string, onReaped func(int, syscall.WaitStatus)) *reaper {
	return &reaper{
		self: os.Getpid(), marker: marker, onReaped: onReaped,
		leaders: map[int]struct{}{}, groups: map[int]struct{}{},
		seen: map[int]struct{}{}, sessions: map[int]struct{}{},
		scratchParent: map[int]int{}, scratchPresent: map[int]struct{}{},
		scratchGroups: map[int]struct{}{}, scratchSessions: map[int]struct{}{},
	}
}

// startLeader runs start (which starts one agent process and returns its
// pid, or an error) with passes held off, and registers the new leader and
// its group.
func (r *reaper) startLeader(start func() (int, error)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := start()
	if err != nil {
		return err
	}
	r.leaders[pid] = struct{}{}
	r.groups[pid] = struct{}{}
	return nil
}

// note records pids as live marked descendants (found by a generation
// scan), reapable once they die.
func (r *reaper) note(pids []int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, pid := range pids {
		if _, leader := r.leaders[pid]; !leader {
			r.seen[pid] = struct{}{}
		}
	}
}

// otherLeaders copies the set of running leaders but leader.
func (r *reaper) otherLeaders(leader int) map[int]struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	others := maps.Clone(r.leaders)
	delete(others, leader)
	return others
}

// leaderWaited forgets leader pid once os/exec has reaped it.
func (r *reaper) leaderWaited(pid int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.leaders, pid)
}

// pass records the live marked descendants and reaps every zombie child
// that is not a leader and is known to descend from an agent or that no
// os/exec caller waits for. It returns how many it reaped.
func (r *reaper) pass() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	procs, err := listProcs()
	if err != nil {
		return 0
	}
	return r.passLocked(procs)
}

// exitPass is the check after leader's exit, on one scan of /proc (issue
// #6: restart latency): it returns the live processes of its generation
// (marker entry kv), as generationPIDs does, scoped as genScope says when
// scoped is set, and records them as seen; when there are none, it also
// runs a pass on the same scan, so that the caller need not.
func (r *reaper) exitPass(kv string, leader int, scoped bool) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	procs, err := listProcs()
	if err != nil {
		return nil
	}
	var scope *genScope
	if scoped {
		scope = &genScope{self: r.self, leader: leader, others: r.leaders}
	}
	pids := generationPIDsIn(procs, kv, scope)
	if len(pids) > 0 {
		for _, pid := range pids {
			if _, isLeader := r.leaders[pid]; !isLeader {
				r.seen[pid] = struct{}{}
			}
		}
		return pids
	}
	r.passLocked(procs)
	return nil
}

// passLocked is pass on the scan procs, with mu held.
func (r *reaper) passLocked(procs []procInfo) int {
	selfSID := -1
	parent, present := r.scratchParent, r.scratchPresent
	groups, sessions := r.scratchGroups, r.scratchSessions
	clear(parent)
	clear(present)
	clear(groups)
	clear(sessions)
	for _, p := range procs {
		parent[p.pid] = p.ppid
		present[p.pid] = struct{}{}
		if p.pid == r.self {
			selfSID = p.sid
		}
	}
	reaped := 0
	var strays []int // zombie children of ours not known to descend from an agent
	for _, p := range procs {
		groups[p.pgid] = struct{}{}
		sessions[p.sid] = struct{}{}
		if _, leader := r.leaders[p.pid]; leader || p.pid == r.self {
			continue
		}
		if p.live() {
			if descends(p.pid, r.self, parent) && environHas(p.pid, r.marker, true) {
				r.seen[p.pid] = struct{}{}
				if p.sid != selfSID && p.sid == p.pid {
					r.sessions[p.sid] = struct{}{}
				}
			}
			continue
		}
		if p.ppid != r.self {
			continue
		}
		_, seen := r.seen[p.pid]
		_, group := r.groups[p.pgid]
		_, session := r.sessions[p.sid]
		if !seen && !group && !session {
			strays = append(strays, p.pid)
			continue
		}
		reaped += r.reap(p.pid)
	}
	if len(strays) > 0 && osHoldsPidfds() {
		// Each stray was a zombie when the scan read it, so a pidfd that os
		// made for it (in the clone that created it) is open now, and stays
		// open until its cmd.Wait has reaped it: read them only now.
		if held, err := pidfdPIDs(); err == nil {
			for _, pid := range strays {
				if _, waited := held[pid]; !waited {
					reaped += r.reap(pid)
				}
			}
		}
	}
	// Forget what no longer exists: no process can join a group or session
	// that has no member left.
	for pid := range r.seen {
		if _, ok := present[pid]; !ok {
			delete(r.seen, pid)
		}
	}
	for g := range r.groups {
		if _, ok := groups[g]; !ok {
			delete(r.groups, g)
		}
	}
	for s := range r.sessions {
		if _, ok := sessions[s]; !ok {
			delete(r.sessions, s)
		}
	}
	return reaped
}

// reap reaps pid, a zombie child, and reports it; it returns how many it
// reaped (0 or 1).
func (r *reaper) reap(pid int) int {
	ws, ok := reapPID(pid)
	if !ok {
		return 0
	}
	delete(r.seen, pid)
	if r.onReaped != nil {
		r.onReaped(pid, ws)
	}
	return 1
}

// mayHaveAdopted reports whether this process may have a child that is not
// a running agent's leader — an adopted orphan, alive or dead, or a child of
// other code in this process — by reading its threads' children lists
// (/proc/self/task/*/children). Most SIGCHLDs come from a leader's exit,
// and this spares them a full scan of /proc (issue #6: restart latency).
// The lists are not read atomically, so a child may be missed; the next
// tick's pass then reaps it. Any error answers true.
func (r *reaper) mayHaveAdopted() bool {
	tids, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return true
	}
	buf := procBufs.Get().(*[]byte)
	defer procBufs.Put(buf)
	// Read without mu, so that starts are not held up: a leader seen here
	// while it starts is registered by the time mu is ours (startLeader
	// holds mu until it is), and one waited meanwhile only costs a pass.
	var children []int
	for _, t := range tids {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		list, err := readProcFile(r.self, "task/"+strconv.Itoa(tid)+"/children", buf)
		if err != nil {
			if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ESRCH) {
				continue // the thread exited meanwhile
			}
			return true
		}
		for len(list) > 0 {
			var f []byte
			if f, list, _ = nextStatField(list); len(f) == 0 {
				break
			}
			pid, ok := atoiBytes(f)
			if !ok {
				return true
			}
			children = append(children, pid)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, pid := range children {
		if _, leader := r.leaders[pid]; !leader {
			return true
		}
	}
	return false
}

// descends reports whether pid has ancestor in the parent map.
func descends(pid, ancestor int, parent map[int]int) bool {
	for range len(parent) { // bounds a (transient) cycle
		ppid, ok := parent[pid]
		if !ok || ppid <= 1 {
			return ppid == ancestor
		}
		if ppid == ancestor {
			return true
		}
		pid = ppid
	}
	return false
}

// reapLoop runs reaper passes on every SIGCHLD and every reapInterval until
// ctx is cancelled. The ticker catches orphans that die without a SIGCHLD
// reaching us and records marked descendants before they are orphaned.
func (s *Supervisor) reapLoop(ctx context.Context) {
	sigchld := make(chan os.Signal, 1)
	signal.Notify(sigchld, syscall.SIGCHLD)
	defer signal.Stop(sigchld)
	tick := time.NewTicker(s.reapInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-sigchld:
			if !s.reaper.mayHaveAdopted() {
				continue // a leader exited: os/exec reaps it, no scan needed
			}
		case <-tick.C:
		}
		s.reaper.pass()
	}
}
