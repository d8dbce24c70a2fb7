package lease

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRetryBackoff(t *testing.T) {
	t.Parallel()
	base, maxDelay := 2*time.Second, 10*time.Minute
	cases := []struct {
		attempt int
		want    time.Duration
	}{
		{1, 2 * time.Second},
		{2, 4 * time.Second},
		{3, 8 * time.Second},
		{8, 256 * time.Second},
		{9, 512 * time.Second},
		{10, 10 * time.Minute}, // 1024s capped
		{1000, 10 * time.Minute},
	}
	for _, c := range cases {
		require.Equal(t, c.want, RetryBackoff(c.attempt, base, maxDelay), "attempt %d", c.attempt)
	}
	require.Equal(t, time.Second, RetryBackoff(1, 5*time.Second, time.Second), "the cap wins over the base")
}
