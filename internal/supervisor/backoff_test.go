package supervisor

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBackoffTracker(t *testing.T) {
	t.Parallel()

	const (
		fast    = time.Second      // below the default FastFailure (30s)
		healthy = 30 * time.Second // exactly FastFailure: healthy
	)
	s := time.Second

	tests := []struct {
		name   string
		policy BackoffPolicy
		runs   []time.Duration
		want   []time.Duration
	}{
		{
			name: "DefaultsDoubleOnFastFailuresUpToCap",
			runs: []time.Duration{0, fast, fast, fast, fast, fast, fast, fast, fast},
			want: []time.Duration{5 * s, 10 * s, 20 * s, 40 * s, 80 * s, 160 * s, 300 * s, 300 * s, 300 * s},
		},
		{
			name: "HealthyRunResetsToMin",
			runs: []time.Duration{fast, fast, fast, healthy, fast, fast},
			want: []time.Duration{5 * s, 10 * s, 20 * s, 5 * s, 5 * s, 10 * s},
		},
		{
			name: "FirstFastFailureAfterHealthyRunsWaitsMin",
			runs: []time.Duration{time.Hour, healthy, fast},
			want: []time.Duration{5 * s, 5 * s, 5 * s},
		},
		{
			name: "JustBelowThresholdIsFast",
			runs: []time.Duration{healthy - time.Nanosecond, healthy - time.Nanosecond},
			want: []time.Duration{5 * s, 10 * s},
		},
		{
			name: "NegativeRunIsFast", // cannot happen with a monotonic clock; still a failure
			runs: []time.Duration{-time.Second, -time.Second},
			want: []time.Duration{5 * s, 10 * s},
		},
		{
			name:   "CustomPolicy",
			policy: BackoffPolicy{Min: 10 * time.Millisecond, FastFailure: time.Second, Max: 50 * time.Millisecond},
			runs:   []time.Duration{0, 0, 0, 0, time.Second, 0},
			want: []time.Duration{
				10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond, 50 * time.Millisecond,
				10 * time.Millisecond, 10 * time.Millisecond,
			},
		},
		{
			name:   "CapNotAMultipleOfMin",
			policy: BackoffPolicy{Min: 3 * s, Max: 7 * s},
			runs:   []time.Duration{0, 0, 0, 0},
			want:   []time.Duration{3 * s, 6 * s, 7 * s, 7 * s},
		},
		{
			name:   "MaxBelowMinMeansMin",
			policy: BackoffPolicy{Min: 10 * s, Max: s},
			runs:   []time.Duration{0, 0},
			want:   []time.Duration{10 * s, 10 * s},
		},
		{
			name:   "HugeCapDoesNotOverflow",
			policy: BackoffPolicy{Min: time.Duration(1 << 61), Max: time.Duration(1<<63 - 1)},
			runs:   []time.Duration{0, 0, 0},
			want:   []time.Duration{1 << 61, 1 << 62, 1<<63 - 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := NewBackoffTracker(tt.policy, nil)
			got := make([]time.Duration, 0, len(tt.runs))
			for _, run := range tt.runs {
				got = append(got, b.Next(run))
			}
			require.Equal(t, tt.want, got)
		})
	}
}

func TestBackoffTrackerReset(t *testing.T) {
	t.Parallel()

	b := NewBackoffTracker(BackoffPolicy{}, nil)
	require.Equal(t, BackoffMinDefault, b.Next(0))
	require.Equal(t, 2*BackoffMinDefault, b.Next(0))
	b.Reset()
	require.Equal(t, BackoffMinDefault, b.Next(0))
}

func TestBackoffPolicyDefaultsAndValidate(t *testing.T) {
	t.Parallel()

	require.Equal(t,
		BackoffPolicy{Min: 5 * time.Second, FastFailure: 30 * time.Second, Reset: 30 * time.Second, Max: 300 * time.Second, Jitter: 0.2},
		BackoffPolicy{}.withDefaults())
	require.Equal(t,
		BackoffPolicy{Min: time.Millisecond, FastFailure: 30 * time.Second, Reset: 30 * time.Second, Max: 300 * time.Second, Jitter: 0.2},
		BackoffPolicy{Min: time.Millisecond}.withDefaults())

	require.NoError(t, BackoffPolicy{}.withDefaults().validate("Backoff"))
	require.NoError(t, BackoffPolicy{Jitter: JitterOff}.withDefaults().validate("Backoff"))
	require.ErrorContains(t, BackoffPolicy{Jitter: -0.5}.withDefaults().validate("Backoff"),
		"Backoff.Jitter: must be between 0 and 1 (or JitterOff), got -0.5")
	err := BackoffPolicy{Min: -1, FastFailure: -2, Max: -3}.validate("Backoff")
	require.ErrorContains(t, err, "Backoff.Min: must not be negative")
	require.ErrorContains(t, err, "Backoff.FastFailure: must not be negative")
	require.ErrorContains(t, err, "Backoff.Max: must not be negative")
	require.ErrorContains(t,
		BackoffPolicy{Min: 10 * time.Second, FastFailure: time.Second, Max: time.Second}.validate("Backoff"),
		"Backoff.Min: 10s must not exceed Backoff.Max (1s)")
}

// The jittered delays stay within the band around the DESIGN S2 sequence,
// and trackers fed the same history spread out instead of moving in
// lockstep — at the cap too.
func TestBackoffTrackerJitter(t *testing.T) {
	t.Parallel()

	s := time.Second
	policy := BackoffPolicy{}.withDefaults()
	want := []time.Duration{5 * s, 10 * s, 20 * s, 40 * s, 80 * s, 160 * s, 300 * s, 300 * s}
	runs := []time.Duration{0, 0, 0, 0, 0, 0, 0, 0, time.Hour} // then a healthy run: back to Min
	want = append(want, 5*s)

	const trackers = 50
	delays := make([][]time.Duration, len(runs)) // [step][tracker]
	for k := range trackers {
		b := NewBackoffTracker(BackoffPolicy{}, rand.New(rand.NewPCG(1, uint64(k))))
		for i, run := range runs {
			d := b.Next(run)
			lo, hi := policy.JitterBand(want[i])
			require.GreaterOrEqual(t, d, lo, "step %d", i)
			require.LessOrEqual(t, d, hi, "step %d", i)
			delays[i] = append(delays[i], d)
		}
	}
	for i, ds := range delays {
		lo, hi := policy.JitterBand(want[i])
		require.Equal(t, want[i]/5, hi-lo, "step %d: the band is 20%% of the delay wide", i)
		slices.Sort(ds)
		require.Greater(t, len(slices.Compact(ds)), trackers*9/10, "step %d: delays are spread out", i)
		require.Greater(t, ds[len(ds)-1]-ds[0], (hi-lo)/2, "step %d: delays cover the band", i)
	}
	require.Equal(t, [2]time.Duration{240 * s, 300 * s}, band(policy, 300*s), "at the cap the band ends at Max")
	require.Equal(t, [2]time.Duration{5 * s, 6 * s}, band(policy, 5*s), "never below Min")
	require.Equal(t, [2]time.Duration{160 * s, 192 * s}, band(policy, 160*s))
	require.Equal(t, [2]time.Duration{280 * s, 280 * s}, band(BackoffPolicy{Jitter: JitterOff}.withDefaults(), 280*s))

	// The same seed gives the same delays.
	a := NewBackoffTracker(BackoffPolicy{}, rand.New(rand.NewPCG(7, 7)))
	b := NewBackoffTracker(BackoffPolicy{}, rand.New(rand.NewPCG(7, 7)))
	for range 5 {
		require.Equal(t, a.Next(0), b.Next(0))
	}
}

func band(p BackoffPolicy, d time.Duration) [2]time.Duration {
	lo, hi := p.JitterBand(d)
	return [2]time.Duration{lo, hi}
}

// DESIGN S2's four numbers are separate: a run between the fast-failure
// threshold and the reset threshold neither doubles nor resets the delay.
func TestBackoffResetThreshold(t *testing.T) {
	t.Parallel()
	b := NewBackoffTracker(BackoffPolicy{Min: time.Second, FastFailure: 10 * time.Second, Reset: time.Minute, Max: time.Hour}, nil)
	require.Equal(t, time.Second, b.Next(0))
	require.Equal(t, 2*time.Second, b.Next(time.Second))
	require.Equal(t, 4*time.Second, b.Next(time.Second))
	require.Equal(t, 4*time.Second, b.Next(30*time.Second), "not a fast failure, not long enough to reset")
	require.Equal(t, 8*time.Second, b.Next(time.Second))
	require.Equal(t, time.Second, b.Next(time.Minute), "a run of Reset resets")
	require.Error(t, BackoffPolicy{FastFailure: time.Minute, Reset: time.Second}.withDefaults().validate("Backoff"))
}
