package store

import (
	"cmp"
	"slices"
)

// HeartbeatWrite is one row write of a ProcessHeartbeatBatch: every item of
// one instance with one token hash, at the latest of their Now.
type HeartbeatWrite struct {
	ProcessHeartbeatParams
	Items []int // indexes of the batch items it answers
}

// CoalesceHeartbeats groups a ProcessHeartbeatBatch's items into the row
// writes a backend performs: one per instance and token hash, at the
// group's latest Now (last value wins), ordered by instance id then token
// hash so that every batch locks rows in one order. Backends share it so
// that both coalesce alike.
func CoalesceHeartbeats(items []ProcessHeartbeatParams) []HeartbeatWrite {
	type key struct{ id, hash string }
	byKey := make(map[key]int, len(items))
	writes := make([]HeartbeatWrite, 0, len(items))
	for i, it := range items {
		k := key{it.InstanceID, it.TokenHash}
		w, ok := byKey[k]
		if !ok {
			byKey[k] = len(writes)
			writes = append(writes, HeartbeatWrite{ProcessHeartbeatParams: it, Items: []int{i}})
			continue
		}
		if it.Now.After(writes[w].Now) {
			writes[w].Now = it.Now
		}
		writes[w].Items = append(writes[w].Items, i)
	}
	slices.SortFunc(writes, func(a, b HeartbeatWrite) int {
		return cmp.Or(cmp.Compare(a.InstanceID, b.InstanceID), cmp.Compare(a.TokenHash, b.TokenHash))
	})
	return writes
}

// HeartbeatResults answers n batch items from the results of their writes
// (written[i] answers writes[i]); items of one write get copies of its
// row, so no two results share a pointer.
func HeartbeatResults(n int, writes []HeartbeatWrite, written []ProcessHeartbeatResult) []ProcessHeartbeatResult {
	results := make([]ProcessHeartbeatResult, n)
	for i, w := range writes {
		for _, item := range w.Items {
			r := written[i]
			if r.Process != nil {
				p := *r.Process
				r.Process = &p
			}
			results[item] = r
		}
	}
	return results
}
