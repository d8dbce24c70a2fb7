package supervisor

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestFlapDetector(t *testing.T) {
	t.Parallel()

	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }

	t.Run("SlowCrashLoopFlapsOncePerEpisode", func(t *testing.T) {
		t.Parallel()
		// Each run lasts 31s, beyond the 30s fast-failure threshold, so
		// backoff alone would never notice.
		d := NewFlapDetector(FlapPolicy{})
		var starts []int
		for i := range 12 {
			if s, _ := d.Exit(at(time.Duration(i) * 36 * time.Second)); s {
				starts = append(starts, i)
			}
		}
		require.Equal(t, []int{4}, starts, "the fifth exit starts the episode; later ones continue it")
		require.True(t, d.Flapping())
	})

	t.Run("EpisodeEndsAndANewOneStarts", func(t *testing.T) {
		t.Parallel()
		d := NewFlapDetector(FlapPolicy{Exits: 3, Window: time.Minute})
		exit := func(off time.Duration) bool { s, _ := d.Exit(at(off)); return s }
		require.False(t, exit(0))
		require.False(t, exit(10*time.Second))
		require.True(t, exit(20*time.Second))
		require.False(t, exit(30*time.Second))
		require.True(t, d.Flapping())
		// A long healthy run: the next exit is alone in its window.
		s, n := d.Exit(at(time.Hour))
		require.False(t, s)
		require.Equal(t, 1, n)
		require.False(t, d.Flapping())
		require.False(t, exit(time.Hour+time.Second))
		require.True(t, exit(time.Hour+2*time.Second), "a new burst is a new episode")
	})

	t.Run("WindowIsSliding", func(t *testing.T) {
		t.Parallel()
		d := NewFlapDetector(FlapPolicy{Exits: 3, Window: time.Minute})
		for _, off := range []time.Duration{0, 40 * time.Second, 80 * time.Second, 120 * time.Second} {
			s, n := d.Exit(at(off))
			require.False(t, s, "never 3 within a minute")
			require.LessOrEqual(t, n, 2)
		}
		s, n := d.Exit(at(121 * time.Second))
		require.True(t, s)
		require.Equal(t, 3, n)
		// Exactly Window after an exit, that exit is out of the window.
		d = NewFlapDetector(FlapPolicy{Exits: 2, Window: time.Minute})
		d.Exit(at(0))
		s, n = d.Exit(at(time.Minute))
		require.False(t, s)
		require.Equal(t, 1, n)
	})

	t.Run("Policy", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, FlapPolicy{Exits: 5, Window: 10 * time.Minute}, FlapPolicy{}.withDefaults())
		require.NoError(t, FlapPolicy{}.withDefaults().validate("Flapping"))
		err := FlapPolicy{Exits: 1, Window: -time.Second}.validate("Flapping")
		require.ErrorContains(t, err, "Flapping.Exits: must be at least 2, got 1")
		require.ErrorContains(t, err, "Flapping.Window: must be positive, got -1s")
	})
}
