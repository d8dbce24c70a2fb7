package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// statusRecorder remembers the status written, for the request log.
type statusRecorder struct {
	http.ResponseWriter
	status  int
	written bool
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.written {
		return
	}
	s.status, s.written = code, true
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if !s.written {
		s.WriteHeader(http.StatusOK)
	}
	return s.ResponseWriter.Write(b)
}

// muxErrorWriter turns the ServeMux's plain-text 404 and 405 into the API's
// JSON error shape, so every error a client sees has one form.
type muxErrorWriter struct {
	*statusRecorder
	route   string // "METHOD /path", for the message
	swallow bool
}

func (m *muxErrorWriter) WriteHeader(code int) {
	plain := strings.HasPrefix(m.Header().Get("Content-Type"), "text/plain")
	switch {
	case plain && code == http.StatusNotFound:
		m.swallow = true
		writeError(m.statusRecorder, code, "not_found", "no such endpoint: "+m.route)
	case plain && code == http.StatusMethodNotAllowed:
		m.swallow = true
		writeError(m.statusRecorder, code, "method_not_allowed", "method not allowed; allowed: "+m.Header().Get("Allow"))
	default:
		m.statusRecorder.WriteHeader(code)
	}
}

func (m *muxErrorWriter) Write(b []byte) (int, error) {
	if m.swallow {
		return len(b), nil
	}
	return m.statusRecorder.Write(b)
}

// jsonErrorText rewrites encoding/json's errors into what a client can act on.
func jsonErrorText(err error) string {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			return fmt.Sprintf("must be a JSON object, not %s", typeErr.Value)
		}
		return fmt.Sprintf("field %s must be %s, not %s", field, jsonKind(typeErr.Type.Kind().String()), typeErr.Value)
	case errors.As(err, &syntaxErr):
		return fmt.Sprintf("invalid JSON at byte %d: %v", syntaxErr.Offset, syntaxErr)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "unexpected end of JSON"
	}
	// DisallowUnknownFields: `json: unknown field "x"`.
	return strings.TrimPrefix(err.Error(), "json: ")
}

func jsonKind(goKind string) string {
	switch goKind {
	case "int", "int64", "int32", "uint", "uint64":
		return "an integer"
	case "float64", "float32":
		return "a number"
	case "string":
		return "a string"
	case "slice":
		return "an array"
	case "struct", "map":
		return "an object"
	case "bool":
		return "a boolean"
	}
	return "a " + goKind
}
