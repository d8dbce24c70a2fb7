package storetest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// exerciseSweeper covers the sweepers table: status upserted by name and
// listed in name order, always of kind "sweeper".
func exerciseSweeper(ctx context.Context, t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("RecordAndList", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		sweepers, err := b.s.SweeperList(ctx)
		require.NoError(t, err)
		require.Empty(t, sweepers)

		// Never run yet: no last run, no error.
		require.NoError(t, b.s.SweeperRecord(ctx, &vigiltype.Sweeper{Name: "lease_reclaimer", IntervalS: 5}))
		require.NoError(t, b.s.SweeperRecord(ctx, &vigiltype.Sweeper{
			Name: "event_pruner", IntervalS: 3600, LastRunAt: ptr(t0), LastResultCount: 7, LastRunDurationMS: 12.5,
		}))
		sweepers, err = b.s.SweeperList(ctx)
		require.NoError(t, err)
		require.Equal(t, []*vigiltype.Sweeper{
			{Name: "event_pruner", Kind: vigiltype.SweeperKind, IntervalS: 3600, LastRunAt: ptr(t0), LastResultCount: 7, LastRunDurationMS: 12.5},
			{Name: "lease_reclaimer", Kind: vigiltype.SweeperKind, IntervalS: 5},
		}, sweepers)

		// Recording again replaces the row; the run time is kept to the
		// millisecond.
		require.NoError(t, b.s.SweeperRecord(ctx, &vigiltype.Sweeper{
			Name: "lease_reclaimer", IntervalS: 2, LastRunAt: ptr(t0.Add(1500 * time.Microsecond)),
			LastResultCount: 3, LastRunDurationMS: 0.4, LastError: ptr("database is busy"),
		}))
		require.NoError(t, b.s.SweeperRecord(ctx, &vigiltype.Sweeper{
			Name: "event_pruner", IntervalS: 3600, LastRunAt: ptr(at(time.Hour)),
		}))
		sweepers, err = b.s.SweeperList(ctx)
		require.NoError(t, err)
		require.Equal(t, []*vigiltype.Sweeper{
			{Name: "event_pruner", Kind: vigiltype.SweeperKind, IntervalS: 3600, LastRunAt: ptr(at(time.Hour))},
			{
				Name: "lease_reclaimer", Kind: vigiltype.SweeperKind, IntervalS: 2, LastRunAt: ptr(at(time.Millisecond)),
				LastResultCount: 3, LastRunDurationMS: 0.4, LastError: ptr("database is busy"),
			},
		}, sweepers)
	})

	t.Run("ListOrderIsByteOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		// Names are ordered byte by byte, not by a linguistic collation.
		names := []string{"b", "B", "a_b", "a-b", "ab", "Z"}
		for _, name := range names {
			require.NoError(t, b.s.SweeperRecord(ctx, &vigiltype.Sweeper{Name: name, IntervalS: 1}))
		}
		sweepers, err := b.s.SweeperList(ctx)
		require.NoError(t, err)
		var got []string
		for _, sw := range sweepers {
			got = append(got, sw.Name)
		}
		want := slices.Clone(names)
		slices.Sort(want)
		require.Equal(t, want, got)
	})
}
