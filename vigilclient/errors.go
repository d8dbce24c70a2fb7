package vigilclient

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// Error codes of the API's error shape {"error":{"code","message"}}
// (docs/api.md, Conventions).
const (
	CodeInvalid          = "invalid"            // 400: a field breaks a rule
	CodeMalformedJSON    = "malformed_json"     // 400: body is not JSON of the expected shape
	CodeUnauthorized     = "unauthorized"       // 401: server token missing or wrong
	CodeInvalidToken     = "invalid_token"      // 403: instance token does not belong to the instance
	CodeForbidden        = "forbidden"          // 403: the bearer token's role may not make this call
	CodeNotFound         = "not_found"          // 404: no such instance, kind, task or route
	CodeMethodNotAllowed = "method_not_allowed" // 405
	CodeStaleEpoch       = "stale_epoch"        // 409: lease not held at that epoch by that instance
	CodeInstanceExited   = "instance_exited"    // 409: the instance already reported its exit
	CodeInstanceStopped  = "instance_stopped"   // 409: a claim by an instance past its alive window
	CodeConflict         = "conflict"           // 409: a compare-and-swap lost a race
	CodeNotClaimable     = "not_claimable"      // 409: a claim by id of a task not waiting to be claimed
	CodeOutcomeConflict  = "outcome_conflict"   // 409: a repeated complete/fail with another result or error than the stored one
	CodePayloadTooLarge  = "payload_too_large"  // 413: body over 1 MiB
	CodeInternal         = "internal"           // 500: a server fault
	CodeUnavailable      = "unavailable"        // 503: the store cannot be reached (or the request was cancelled); retry
)

// APIError is an error answer from the server: its HTTP status and the
// code and message of the body {"error":{"code","message"}}. An answer
// that is not of that shape (a proxy's HTML page, say) keeps its status,
// an empty Code and the start of the body as Message.
//
// errors.Is matches an APIError against vigiltype's sentinels by code:
// stale_epoch → ErrStaleEpoch, not_found → ErrNotFound, invalid and
// malformed_json → ErrInvalid, invalid_token → ErrInvalidToken,
// instance_exited → ErrInstanceExited, unauthorized → ErrUnauthorized,
// forbidden → ErrForbidden,
// outcome_conflict → ErrOutcomeConflict, unavailable → ErrUnavailable.
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string {
	code := e.Code
	if code == "" {
		code = strings.ToLower(strings.ReplaceAll(http.StatusText(e.Status), " ", "_"))
	}
	return fmt.Sprintf("%s (HTTP %d %s)", e.Message, e.Status, code)
}

// Is maps e's code to the matching vigiltype sentinel error.
func (e *APIError) Is(target error) bool {
	s, ok := sentinels[e.Code]
	return ok && s == target
}

var sentinels = map[string]error{
	CodeStaleEpoch:      vigiltype.ErrStaleEpoch,
	CodeNotFound:        vigiltype.ErrNotFound,
	CodeInvalid:         vigiltype.ErrInvalid,
	CodeMalformedJSON:   vigiltype.ErrInvalid,
	CodeInvalidToken:    vigiltype.ErrInvalidToken,
	CodeInstanceExited:  vigiltype.ErrInstanceExited,
	CodeInstanceStopped: vigiltype.ErrInstanceStopped,
	CodeConflict:        vigiltype.ErrConflict,
	CodeNotClaimable:    vigiltype.ErrNotClaimable,
	CodeUnauthorized:    vigiltype.ErrUnauthorized,
	CodeForbidden:       vigiltype.ErrForbidden,
	CodeOutcomeConflict: vigiltype.ErrOutcomeConflict,
	CodeUnavailable:     vigiltype.ErrUnavailable,
}

func decodeAPIError(status int, raw []byte) *APIError {
	var body struct {
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(raw, &body); err == nil && body.Error != nil && body.Error.Code != "" {
		return &APIError{Status: status, Code: body.Error.Code, Message: body.Error.Message}
	}
	msg := strings.TrimSpace(string(raw))
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	if msg == "" {
		msg = http.StatusText(status)
	}
	return &APIError{Status: status, Message: msg}
}

// isTransient reports whether a failed call may succeed if sent again: the
// server was not reached, or it answered with a 5xx (503 unavailable: its
// store cannot be reached).
func isTransient(err error) bool {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Status >= 500
	}
	return err != nil
}
