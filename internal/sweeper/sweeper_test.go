package sweeper_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/vigil-fleet/vigil/internal/clock"
	"github.com/vigil-fleet/vigil/internal/store/sqlitestore"
	"github.com/vigil-fleet/vigil/internal/sweeper"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRunOnceRecordsStatus(t *testing.T) {
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "v.db"))
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	clk := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))

	result, failure := 3, error(nil)
	s, err := sweeper.New(sweeper.Config{
		Name: "lease_reclaimer", Interval: time.Minute, Store: st, Clock: clk,
		Pass: func(context.Context) (int, error) { return result, failure },
	})
	require.NoError(t, err)

	n, err := s.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	list, err := st.SweeperList(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	got := list[0]
	require.Equal(t, "lease_reclaimer", got.Name)
	require.Equal(t, vigiltype.SweeperKind, got.Kind)
	require.Equal(t, 60.0, got.IntervalS)
	require.Equal(t, 3, got.LastResultCount)
	require.True(t, got.LastRunAt.Equal(clk.Now()))
	require.Nil(t, got.LastError)

	result, failure = 0, errors.New("database is on fire")
	clk.Advance(time.Minute)
	_, err = s.RunOnce(ctx)
	require.Error(t, err)
	list, err = st.SweeperList(ctx)
	require.NoError(t, err)
	require.Equal(t, "database is on fire", *list[0].LastError)
	require.True(t, list[0].LastRunAt.Equal(clk.Now()))
}

func TestStartStop(t *testing.T) {
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "v.db"))
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	passes, release := make(chan struct{}, 10), make(chan struct{})
	s, err := sweeper.New(sweeper.Config{
		Name: "x", Interval: time.Hour, Store: st,
		Pass: func(context.Context) (int, error) { passes <- struct{}{}; <-release; return 0, nil },
	})
	require.NoError(t, err)
	s.Stop() // never started: no-op
	s.Start(ctx)
	<-passes // the first pass runs at once, and is held there
	list, err := st.SweeperList(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1, "listed as soon as it starts, before any pass ended")
	require.Equal(t, "x", list[0].Name)
	require.Nil(t, list[0].LastRunAt, "not run yet")
	s.Start(ctx) // already started: no second loop
	close(release)
	s.Stop()
	s.Stop()
	require.Empty(t, passes, "a second loop ran a pass")
}

func TestNewValidates(t *testing.T) {
	st, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "v.db"))
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	pass := func(context.Context) (int, error) { return 0, nil }

	_, err = sweeper.New(sweeper.Config{Name: "x", Interval: time.Second, Pass: pass})
	require.ErrorContains(t, err, "Store are required")
	_, err = sweeper.New(sweeper.Config{Name: "x", Interval: 0, Pass: pass, Store: st})
	require.ErrorContains(t, err, "interval must be positive")
}
