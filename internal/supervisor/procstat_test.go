package supervisor

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// procStatSeeds are real /proc/<pid>/stat lines, and comms a process can
// give itself (prctl PR_SET_NAME, or the name of the file it runs).
var procStatSeeds = []string{
	"16292 (cat) R 16290 16290 9845 0 -1 4194304 100 0 0 0 0 0 0 0 20 0 1 0 192933 3133440 413 18446744073709551615 94191938297856 94191938317737 140730514217904 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 94191938333744 94191938335360 94192169816064 140730514225857 140730514225877 140730514225877 140730514227179 0\n",
	"1 (process_api) S 0 0 0 0 -1 4194560 60812 67014009 0 3847 260 856 224919 46912 10 -10 14 0 20 46284800 3365 18446744073709551615 1 1 0 0 0 0 0 4096 1256 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
	"2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 20 0 0 18446744073709551615 0 0 0 0 0 0 0 2147483647 0 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
	"77 (my worker) Z 1 77 77 0 -1 4227084 0 0 0 0 0 0 0 0 20 0 1 0 5000 0 0 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
	"88 (a) b) (c) S 1 88 88 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 7 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
	"99 () R 1 99 99\n",
	"",
	")",
	"1 (x",
}

// FuzzParseProcStat drives the /proc/<pid>/stat parsers (parseProcStatFull,
// parseStatStartTime) with arbitrary text and with well-formed lines whose
// comm is arbitrary. Invariants: no panic; the two agree on the state of a
// line both accept; a well-formed line is read back exactly, whatever its
// comm holds (spaces, parentheses, newlines, a fake stat line).
func FuzzParseProcStat(f *testing.F) {
	for _, s := range procStatSeeds {
		f.Add([]byte(s), byte('S'), int32(1), int32(4242), int32(4242), uint64(192933))
	}
	f.Add([]byte("sh"), byte('Z'), int32(0), int32(-1), int32(0), uint64(0))
	f.Add([]byte("x) R 1 2 3"), byte('R'), int32(7), int32(8), int32(9), uint64(1<<63))
	f.Add([]byte(")\n) ) "), byte('D'), int32(1), int32(1), int32(1), ^uint64(0))
	f.Fuzz(func(t *testing.T, raw []byte, state byte, ppid, pgid, sid int32, start uint64) {
		// Arbitrary text: no panic, and no disagreement.
		full, okFull := parseProcStatFull(raw)
		st, _, okStart := parseStatStartTime(raw)
		if okFull && okStart {
			require.Equal(t, full.state, st, "the parsers disagree on the state of %q", raw)
		}

		// A well-formed line with raw as its comm.
		state = 'A' + state%26
		line := fmt.Appendf(nil, "4242 (%s) %c %d %d %d 0 -1 4194304 100 0 0 0 0 0 0 0 20 0 1 0 %d 3133440 413 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
			raw, state, ppid, pgid, sid, start)
		got, ok := parseProcStatFull(line)
		require.True(t, ok, "parseProcStatFull refused %q", line)
		require.Equal(t, procInfo{state: state, ppid: int(ppid), pgid: int(pgid), sid: int(sid)}, got, "line %q", line)
		gotState, gotStart, ok := parseStatStartTime(line)
		require.True(t, ok, "parseStatStartTime refused %q", line)
		require.Equal(t, state, gotState, "line %q", line)
		require.Equal(t, start, gotStart, "line %q", line)
	})
}

func TestParseStatStartTime(t *testing.T) {
	t.Parallel()
	state, start, ok := parseStatStartTime([]byte(procStatSeeds[0]))
	require.True(t, ok)
	require.Equal(t, byte('R'), state)
	require.Equal(t, uint64(192933), start)

	for _, bad := range []string{
		"", "1 (x) R", "1 (x) RR 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
		"1 (x) R 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 -19 20",
		"1 (x) R 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 18446744073709551616 20",
	} {
		_, _, ok := parseStatStartTime([]byte(bad))
		require.False(t, ok, bad)
	}
}
