package lease

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigiltype"
)

func TestCheckClaimBatchMax(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2, 32, ClaimBatchMax} {
		require.NoError(t, CheckClaimBatchMax(n), "max_tasks %d", n)
	}
	for _, n := range []int{-1, 0, ClaimBatchMax + 1} {
		err := CheckClaimBatchMax(n)
		require.ErrorIs(t, err, vigiltype.ErrInvalid, "max_tasks %d", n)
		var fe *vigiltype.FieldError
		require.ErrorAs(t, err, &fe)
		require.Equal(t, "max_tasks", fe.Field)
	}
}
