package supervisor

import (
	"errors"
	"syscall"
)

// groupRunning reports whether any process of group pgid is still running.
// Zombies do not count: they are dead and only wait for their parent (init,
// or a subreaper, for orphaned grandchildren) to reap them — which, in some
// containers, never happens.
func groupRunning(pgid int) bool {
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	// The group has members, or we may not signal them (EPERM); either way
	// kill(2) counts zombies, so look for a live member in /proc.
	live, err := procGroupHasLiveMember(pgid)
	if err != nil {
		return true // no /proc: trust kill(2)
	}
	return live
}

// procGroupHasLiveMember scans /proc/<pid>/stat for a process of group pgid
// in any state but zombie (Z) or dead (X).
func procGroupHasLiveMember(pgid int) (bool, error) {
	pids, err := procPIDs()
	if err != nil {
		return false, err
	}
	buf := procBufs.Get().(*[]byte)
	defer procBufs.Put(buf)
	for _, pid := range pids {
		stat, err := readProcFile(pid, "stat", buf)
		if err != nil {
			continue // exited meanwhile
		}
		state, pg, ok := parseProcStat(stat)
		if ok && pg == pgid && state != 'Z' && state != 'X' {
			return true, nil
		}
	}
	return false, nil
}

// parseProcStat extracts the state and process group from the content of
// /proc/<pid>/stat: "pid (comm) state ppid pgrp …", where comm may itself
// contain spaces and parentheses.
func parseProcStat(stat []byte) (state byte, pgid int, ok bool) {
	p, ok := parseProcStatFull(stat)
	return p.state, p.pgid, ok
}
