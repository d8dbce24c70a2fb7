package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"strings"

	"github.com/vigil-fleet/vigil/internal/auth"
)

// caller is who a request comes from, for the role check and the audit
// line: the role its bearer token grants, and the instance it acts for
// once a handler knows it.
type caller struct {
	role     auth.Role
	instance string
	routine  bool // an agent's steady traffic: its audit line is at DEBUG
}

type callerKey struct{}

// withCaller gives r a caller to fill in.
func withCaller(r *http.Request) (*http.Request, *caller) {
	c := &caller{}
	return r.WithContext(context.WithValue(r.Context(), callerKey{}, c)), c
}

// callerOf is r's caller; a request that did not pass the middleware has
// no role.
func callerOf(r *http.Request) *caller {
	if c, ok := r.Context().Value(callerKey{}).(*caller); ok {
		return c
	}
	return &caller{}
}

// actsFor records, for the audit line, the instance a request acts for.
func actsFor(r *http.Request, instanceID string) {
	if instanceID != "" {
		callerOf(r).instance = instanceID
	}
}

// routine marks a write as an agent's steady traffic — a heartbeat, a
// claim that found nothing — whose audit line is at DEBUG.
func routine(r *http.Request) { callerOf(r).routine = true }

// authenticate sets r's role from its bearer token: on a server without
// token files every request is the operator's; with them, a request
// without a token the server holds gets 401, but on the public paths. It
// returns false when it has answered.
func (a *api) authenticate(w http.ResponseWriter, r *http.Request) bool {
	c := callerOf(r)
	if a.Keyring == nil {
		c.role = auth.RoleOperator
		return true
	}
	if a.public(r.URL.Path) {
		return true
	}
	// Exactly "Bearer <token>": the scheme as written, one space, nothing
	// trimmed from the token.
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if ok {
		c.role = a.Keyring.Role(token)
	}
	if c.role == auth.RoleNone {
		a.refused(r, "no or wrong bearer token")
		writeUnauthorized(w, "missing or wrong bearer token (Authorization: Bearer <token>)")
		return false
	}
	return true
}

// authorize serves rt with h when the request's role covers what rt needs
// (or, for a Holder route, when an agent sends an instance token: the
// handler then checks it is the holder's), and answers 403 forbidden
// naming the role needed otherwise.
func (a *api) authorize(rt Route, h http.Handler) http.Handler {
	if rt.Need == auth.RoleNone {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		role := callerOf(r).role
		if role.Covers(rt.Need) || (rt.Holder && role.Covers(auth.RoleAgent) && r.Header.Get(InstanceTokenHeader) != "") {
			h.ServeHTTP(w, r)
			return
		}
		need := "the " + string(rt.Need) + " role"
		if rt.Holder {
			need += ", or the agent role with the holder's " + InstanceTokenHeader
		}
		writeError(w, http.StatusForbidden, "forbidden", rt.Pattern+" needs "+need+"; this token has the "+string(role)+" role")
	})
}

// audit writes the audit line of a /v1 write once it is answered: method,
// route, status, the role of its token and the instance it acted for.
// Routine agent traffic — liveness and lease heartbeats, a claim that found
// nothing — is at DEBUG, a refusal for want of a role at WARN, every other
// write at INFO; on a server without token files (loopback, every caller
// the operator) every write is at DEBUG, so the quick start's terminal is
// not doubled by it.
func (a *api) audit(r *http.Request, status int) {
	if !isWrite(r) || !strings.HasPrefix(r.URL.Path, "/v1/") || r.Pattern == "" || status == http.StatusUnauthorized {
		return // not a write, no such route, or refused before any role (logged by refused)
	}
	c := callerOf(r)
	level := slog.LevelInfo
	switch {
	case status == http.StatusForbidden:
		level = slog.LevelWarn
	case status < 300 && c.routine, a.Keyring == nil:
		level = slog.LevelDebug
	}
	a.Logger.Log(r.Context(), level, "audit", "method", r.Method, "route", r.Pattern, "path", r.URL.Path,
		"status", status, "role", string(c.role), "instance", c.instance, "remote", r.RemoteAddr)
}
