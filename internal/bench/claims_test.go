package bench

import "testing"

func TestClaimsSmoke(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { t.Parallel(); rdRunSmoke(t, "claims-sqlite") })
	t.Run("postgres", func(t *testing.T) { t.Parallel(); rdRunSmoke(t, "claims-postgres") })
}
