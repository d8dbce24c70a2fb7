package clock

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// skewed is a local clock that runs off by skew.
type skewed struct{ skew time.Duration }

func (s skewed) Now() time.Time { return time.Now().Add(s.skew) }

func TestSyncedServersAgreeWhateverTheirLocalClocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The reference answers after a 10ms round trip, stamped midway.
		reference := func(ctx context.Context) (time.Time, error) {
			time.Sleep(5 * time.Millisecond)
			now := time.Now()
			time.Sleep(5 * time.Millisecond)
			return now, nil
		}
		ahead, err := NewSynced(t.Context(), skewed{7 * time.Minute}, reference, 0, nil)
		require.NoError(t, err)
		behind, err := NewSynced(t.Context(), skewed{-3 * time.Minute}, reference, 0, nil)
		require.NoError(t, err)

		require.Equal(t, -7*time.Minute, ahead.Offset())
		require.Equal(t, 3*time.Minute, behind.Offset())
		require.Equal(t, time.Now().UTC(), ahead.Now())
		require.Equal(t, ahead.Now(), behind.Now())
	})
}

func TestSyncedFollowsDriftAndKeepsOffsetOnFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var drift atomic.Int64
		var fail atomic.Bool
		reference := func(ctx context.Context) (time.Time, error) {
			if fail.Load() {
				return time.Time{}, errors.New("database down")
			}
			return time.Now().Add(time.Duration(drift.Load())), nil
		}
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		s, err := NewSynced(t.Context(), nil, reference, time.Minute, quiet)
		require.NoError(t, err)
		s.Start(t.Context())
		defer s.Stop()

		drift.Store(int64(2 * time.Second))
		time.Sleep(time.Minute + time.Millisecond)
		synctest.Wait()
		require.Equal(t, 2*time.Second, s.Offset(), "the loop re-syncs every interval")

		fail.Store(true)
		drift.Store(int64(time.Hour))
		time.Sleep(time.Minute)
		synctest.Wait()
		require.Equal(t, 2*time.Second, s.Offset(), "a failed sync keeps the last offset")
		s.Stop()
		s.Stop()
	})
}

func TestNewSyncedFailsWhenTheReferenceDoes(t *testing.T) {
	_, err := NewSynced(context.Background(), nil, func(context.Context) (time.Time, error) {
		return time.Time{}, errors.New("connection refused")
	}, 0, nil)
	require.ErrorContains(t, err, "read the reference clock: connection refused")
}
