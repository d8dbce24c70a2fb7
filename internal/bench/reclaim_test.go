package bench

import "testing"

func TestReclaimSmoke(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { t.Parallel(); rdRunSmoke(t, "reclaim-sqlite") })
	t.Run("postgres", func(t *testing.T) { t.Parallel(); rdRunSmoke(t, "reclaim-postgres") })
}
