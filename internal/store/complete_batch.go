package store

import (
	"cmp"
	"slices"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// TaskCompleteResult answers one item of TaskCompleteBatch: the completed
// task, or Err, the error a TaskComplete of that item alone would have
// returned (ErrStaleEpoch, ErrNotFound, ErrOutcomeConflict, ErrInvalid for
// a result that is not valid JSON). Exactly one of Task and Err is set.
type TaskCompleteResult struct {
	Task *vigiltype.Task
	Err  error
}

// CompleteOrder is the order a backend writes a TaskCompleteBatch's items
// in: by task id (stable, so repeats of one task keep their request order),
// so that every batch locks task rows in one order. Backends share it so
// that both order alike.
func CompleteOrder(items []TaskCompleteParams) []int {
	order := make([]int, len(items))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(items[a].TaskID, items[b].TaskID) })
	return order
}
