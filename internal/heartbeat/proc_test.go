package heartbeat

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParseStat drives parseStat, the reader of /proc/PID/stat behind
// Observe and ProcStartTime, with arbitrary text and with well-formed
// lines whose comm is arbitrary. Invariants: no panic; an error says
// "stat:"; a well-formed line is read back exactly, whatever its comm holds
// (spaces, parentheses, newlines, a fake stat line).
func FuzzParseStat(f *testing.F) {
	for _, s := range []string{
		"16292 (cat) R 16290 16290 9845 0 -1 4194304 100 0 0 0 0 0 0 0 20 0 1 0 192933 3133440 413 18446744073709551615 94191938297856 94191938317737 140730514217904 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 94191938333744 94191938335360 94192169816064 140730514225857 140730514225877 140730514225877 140730514227179 0\n",
		"2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 20 0 0 18446744073709551615 0 0 0 0 0 0 0 2147483647 0 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
		"42 (a (weird) name) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 50 18446744073709551615",
		"77 (my worker) Z 1 77 77 0 -1 4227084 0 0 0 0 0 0 0 0 20 0 1 0 5000 0 0 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
		"42 (x) S 1",
		"",
		")",
	} {
		f.Add([]byte(s), byte('S'), uint64(987654))
	}
	f.Add([]byte("x) R 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19"), byte('Z'), ^uint64(0))
	f.Fuzz(func(t *testing.T, raw []byte, state byte, start uint64) {
		if _, _, err := parseStat(raw); err != nil {
			require.ErrorContains(t, err, "stat:")
		}

		state = 'A' + state%26
		line := fmt.Appendf(nil, "4242 (%s) %c 1 4242 4242 0 -1 4194304 100 0 0 0 0 0 0 0 20 0 1 0 %d 3133440 413 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
			raw, state, start)
		gotState, gotStart, err := parseStat(line)
		require.NoError(t, err, "line %q", line)
		require.Equal(t, state, gotState, "line %q", line)
		require.Equal(t, start, gotStart, "line %q", line)
	})
}
