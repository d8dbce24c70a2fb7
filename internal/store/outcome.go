package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// Repeated outcomes (DESIGN T8). A holder whose complete or fail landed but
// whose answer was lost sends it again, at the same epoch: its lease has
// ended, so the guarded write matches no row. Before calling that stale,
// a backend reads the row in the same transaction and asks RepeatedComplete
// or RepeatedFail whether the call repeats the outcome the lease ended
// with. Both backends share these two functions so that they decide alike.

// RepeatedComplete decides a complete under l that matched no row, given
// the task as it is now: nil when the lease ended with a complete by the
// same instance at the same epoch and with the same result (compared as
// JSON values, SameJSON), so the call answers with t as stored; an
// *OutcomeConflictError naming "result" when it ended so with another
// result; else ErrStaleEpoch.
func RepeatedComplete(t *vigiltype.Task, l TaskLease, result json.RawMessage) error {
	if t.Status != vigiltype.TaskCompleted || t.LeaseEpoch != l.Epoch ||
		t.CompletedBy == nil || *t.CompletedBy != l.InstanceID {
		return vigiltype.ErrStaleEpoch
	}
	if !SameJSON(t.Result, result) {
		return &vigiltype.OutcomeConflictError{Field: "result",
			Rule: fmt.Sprintf("task %d was already completed at lease epoch %d with a different result", t.TaskID, l.Epoch)}
	}
	return nil
}

// RepeatedFail decides a fail under l with error text msg that matched no
// row, given the task as it is now and the instance that failed it at its
// current epoch (failedBy, nil when none did): nil when the lease ended
// with a fail by the same instance at the same epoch with the same text,
// so the call answers with t as stored and counts nothing twice; an
// *OutcomeConflictError naming "error" when it ended so with another text;
// else ErrStaleEpoch.
func RepeatedFail(t *vigiltype.Task, failedBy *string, l TaskLease, msg string) error {
	if t.LeaseEpoch != l.Epoch || failedBy == nil || *failedBy != l.InstanceID ||
		(t.Status != vigiltype.TaskScheduled && t.Status != vigiltype.TaskDeadLetter) {
		return vigiltype.ErrStaleEpoch
	}
	if t.LastError == nil || *t.LastError != msg {
		return &vigiltype.OutcomeConflictError{Field: "error",
			Rule: fmt.Sprintf("task %d was already failed at lease epoch %d with a different error", t.TaskID, l.Epoch)}
	}
	return nil
}

// SameJSON reports whether two JSON documents are the same value: object
// key order, white space and number spelling within one value (1 and 1.0
// differ; a number is kept as its text) do not matter. Absent (nil or
// empty) counts as null, as a stored NULL result does. A document that is
// not valid JSON equals nothing.
func SameJSON(a, b json.RawMessage) bool {
	va, errA := decodeJSONValue(a)
	vb, errB := decodeJSONValue(b)
	return errA == nil && errB == nil && reflect.DeepEqual(va, vb)
}

func decodeJSONValue(raw json.RawMessage) (any, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("data after the JSON value")
	}
	return v, nil
}
