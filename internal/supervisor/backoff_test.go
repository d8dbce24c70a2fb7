package supervisor

import (
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
			b := NewBackoffTracker(tt.policy)
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

	b := NewBackoffTracker(BackoffPolicy{})
	require.Equal(t, BackoffMinDefault, b.Next(0))
	require.Equal(t, 2*BackoffMinDefault, b.Next(0))
	b.Reset()
	require.Equal(t, BackoffMinDefault, b.Next(0))
}

func TestBackoffPolicyDefaultsAndValidate(t *testing.T) {
	t.Parallel()

	require.Equal(t,
		BackoffPolicy{Min: 5 * time.Second, FastFailure: 30 * time.Second, Max: 300 * time.Second},
		BackoffPolicy{}.withDefaults())
	require.Equal(t,
		BackoffPolicy{Min: time.Millisecond, FastFailure: 30 * time.Second, Max: 300 * time.Second},
		BackoffPolicy{Min: time.Millisecond}.withDefaults())

	require.NoError(t, BackoffPolicy{}.withDefaults().validate("Backoff"))
	err := BackoffPolicy{Min: -1, FastFailure: -2, Max: -3}.validate("Backoff")
	require.ErrorContains(t, err, "Backoff.Min: must not be negative")
	require.ErrorContains(t, err, "Backoff.FastFailure: must not be negative")
	require.ErrorContains(t, err, "Backoff.Max: must not be negative")
	require.ErrorContains(t,
		BackoffPolicy{Min: 10 * time.Second, FastFailure: time.Second, Max: time.Second}.validate("Backoff"),
		"Backoff.Min: 10s must not exceed Backoff.Max (1s)")
}
