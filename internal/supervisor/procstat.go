package supervisor

import "bytes"

// The one reader of /proc/<pid>/stat's text in this package (the reaper,
// the generation scans, the launch rollback and the generation markers all
// use it): "pid (comm) state ppid pgrp session tty_nr … starttime …", where
// comm is what the process named itself, up to 16 bytes that may hold
// spaces, parentheses and newlines. So fields are counted after the last
// ')' in the text, and split on the kernel's separators only. It is plain
// byte parsing, built on every platform, so that its fuzz target
// (FuzzParseProcStat) runs everywhere.

// procInfo is what the reaper and the generation scans read from
// /proc/<pid>/stat.
type procInfo struct {
	pid, ppid, pgid, sid int
	state                byte
}

// live reports whether the process is running (not a zombie or dead).
func (p procInfo) live() bool { return p.state != 'Z' && p.state != 'X' }

// parseProcStatFull extracts state, ppid, pgrp and session from
// "pid (comm) state ppid pgrp session …".
func parseProcStatFull(stat []byte) (procInfo, bool) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return procInfo{}, false
	}
	rest := stat[i+1:]
	state, rest, ok := nextStatField(rest)
	if !ok || len(state) != 1 {
		return procInfo{}, false
	}
	var nums [3]int
	for j := range nums {
		var f []byte
		if f, rest, ok = nextStatField(rest); !ok {
			return procInfo{}, false
		}
		n, ok := atoiBytes(f)
		if !ok {
			return procInfo{}, false
		}
		nums[j] = n
	}
	return procInfo{state: state[0], ppid: nums[0], pgid: nums[1], sid: nums[2]}, true
}

// nextStatField splits the next space-separated field off b.
func nextStatField(b []byte) (field, rest []byte, ok bool) {
	for len(b) > 0 && isStatSpace(b[0]) {
		b = b[1:]
	}
	j := 0
	for j < len(b) && !isStatSpace(b[j]) {
		j++
	}
	return b[:j], b[j:], j > 0
}

func isStatSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\t' }

// atoiBytes parses a decimal int, optionally negative, without allocating.
func atoiBytes(b []byte) (int, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// statStartTimeField is the index of starttime (field 22 of
// /proc/<pid>/stat) among the fields after comm, state being index 0.
const statStartTimeField = 22 - 3

// parseStatStartTime extracts the state and the start time (clock ticks
// since boot) from the content of /proc/<pid>/stat.
func parseStatStartTime(stat []byte) (state byte, start uint64, ok bool) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0, false
	}
	rest := stat[i+1:]
	var f []byte
	for j := 0; j <= statStartTimeField; j++ {
		if f, rest, ok = nextStatField(rest); !ok {
			return 0, 0, false
		}
		if j == 0 {
			if len(f) != 1 {
				return 0, 0, false
			}
			state = f[0]
		}
	}
	start, ok = atouBytes(f)
	return state, start, ok
}

// atouBytes parses a decimal uint64 without allocating; false on overflow.
func atouBytes(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if n > (^uint64(0)-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}
