// Package httpapi serves vigil's JSON API under /v1 (docs/api.md). Handlers
// are thin: they decode, call the liveness and lease services, and encode.
// Every error leaves as {"error":{"code","message"}}; a server fault's text
// stays in the log and the body says only "internal error".
package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/vigil-fleet/vigil/internal/auth"
	"github.com/vigil-fleet/vigil/internal/dashboard"
	"github.com/vigil-fleet/vigil/internal/events"
	"github.com/vigil-fleet/vigil/internal/lease"
	"github.com/vigil-fleet/vigil/internal/liveness"
	"github.com/vigil-fleet/vigil/internal/metrics"
	"github.com/vigil-fleet/vigil/internal/registry"
	"github.com/vigil-fleet/vigil/internal/snapshot"
	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// BodyMaxBytes bounds every request body (1 MiB).
const BodyMaxBytes = 1 << 20

// InstanceTokenHeader carries the instance token on every write made on
// behalf of an instance (DESIGN L2).
const InstanceTokenHeader = "X-Vigil-Instance-Token"

// Config wires the API to its services.
type Config struct {
	Liveness *liveness.Service
	Lease    *lease.Service
	Registry *registry.Service
	Events   *events.Service
	Snapshot *snapshot.Service
	Store    store.Store      // sweeper status reads
	Metrics  *metrics.Metrics // served at /metrics and fed by the handlers; optional
	Logger   *slog.Logger
	// MCP, when set, is served at /mcp (the MCP streamable HTTP transport).
	MCP http.Handler
	// Timeline, when set, serves GET /v1/timeline (the dashboard's strips).
	Timeline *dashboard.Service
	// Dashboard, when set, is served at / and /assets/ without the token.
	Dashboard http.Handler
	// Keyring maps bearer tokens to roles (operator, agent, read); every
	// endpoint but /healthz and the dashboard's page and assets then needs
	// one ("Authorization: Bearer <token>"), and each route a role (Routes).
	// nil: no token files, every request has the operator role.
	Keyring *auth.Keyring
	// Hosts are the Host header values the server answers for (see
	// ServedHosts): NAME:PORT for that port, NAME for any. A request for
	// another Host is refused with 421 (DNS rebinding). nil: the loopback
	// names (LoopbackHosts) on any port.
	Hosts []string
}

type api struct {
	Config
	hosts *hostPolicy
}

// New returns the API's http.Handler. It fails only on a malformed
// Config.Hosts entry.
func New(cfg Config) (http.Handler, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	hosts, err := newHostPolicy(cfg.Hosts)
	if err != nil {
		return nil, err
	}
	a := &api{Config: cfg, hosts: hosts}
	mux := http.NewServeMux()
	a.register(mux)
	return a.middleware(mux), nil
}

// middleware: panic recovery, the guard (Host, Origin, bearer token and
// role, Content-Type), body limit, request log, the audit line of each
// write, and the JSON error shape for the mux's own 404s and 405s.
func (a *api) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		r, _ = withCaller(r)
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		defer func() {
			if p := recover(); p != nil {
				a.Logger.Error("handler panic", "method", r.Method, "path", r.URL.Path, "panic", p)
				writeError(rec, http.StatusInternalServerError, "internal", "internal error")
			}
			if a.Metrics != nil {
				route := r.Pattern // set by the mux on this request
				if route == "" {
					route = "unmatched"
				}
				a.Metrics.HTTP.WithLabelValues(r.Method, route, strconv.Itoa(rec.status)).Observe(time.Since(start).Seconds())
			}
			a.Logger.Debug("http", "method", r.Method, "path", r.URL.Path, "status", rec.status,
				"duration_ms", float64(time.Since(start).Microseconds())/1000)
			a.audit(r, rec.status)
		}()
		if !a.guard(rec, r) {
			return
		}
		r.Body = http.MaxBytesReader(rec, r.Body, BodyMaxBytes)
		next.ServeHTTP(&muxErrorWriter{statusRecorder: rec, route: r.Method + " " + r.URL.Path}, r)
	})
}

// healthzTimeout bounds the store read /healthz makes.
const healthzTimeout = 2 * time.Second

// RetryAfterUnavailable is the Retry-After, in seconds, of a 503
// unavailable: how long a client should wait before it asks again while
// the store cannot be reached.
const RetryAfterUnavailable = 2

// writeUnavailable answers 503 unavailable with Retry-After; the message is
// fixed, so no driver text reaches the body.
func writeUnavailable(w http.ResponseWriter, msg string) {
	w.Header().Set("Retry-After", strconv.Itoa(RetryAfterUnavailable))
	writeError(w, http.StatusServiceUnavailable, "unavailable", msg)
}

// healthz answers 200 {"status":"ok"} when the store answers a read, else
// 503 with code "unavailable".
func (a *api) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), healthzTimeout)
	defer cancel()
	if _, err := a.Store.SweeperList(ctx); err != nil {
		a.Logger.Warn("health check: store read failed", "err", err)
		writeUnavailable(w, "the store does not answer")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// onlyPost answers the methods a POST-only route does not take.
func onlyPost(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Allow", http.MethodPost)
	writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "method not allowed; allowed: POST")
}

// --- processes ---

func (a *api) processRegister(w http.ResponseWriter, r *http.Request) {
	create(a, w, r, func(ctx context.Context, p liveness.RegisterParams) (*liveness.Registered, error) {
		reg, err := a.Liveness.Register(ctx, p)
		if err == nil {
			actsFor(r, reg.InstanceID)
		}
		return reg, err
	})
}

func (a *api) processHeartbeat(w http.ResponseWriter, r *http.Request) {
	actsFor(r, r.PathValue("id"))
	routine(r)
	token, ok := instanceToken(w, r)
	if !ok {
		return
	}
	p, err := a.Liveness.Heartbeat(r.Context(), r.PathValue("id"), token)
	if err == nil && a.Metrics != nil {
		a.Metrics.Heartbeats.WithLabelValues("liveness", "1").Inc()
	}
	a.respond(w, r, p, err)
}

func (a *api) processExit(w http.ResponseWriter, r *http.Request) {
	actsFor(r, r.PathValue("id"))
	token, ok := instanceToken(w, r)
	if !ok {
		return
	}
	p, err := a.Liveness.Exit(r.Context(), r.PathValue("id"), token)
	a.respond(w, r, p, err)
}

func (a *api) processGet(w http.ResponseWriter, r *http.Request) {
	p, err := a.Liveness.Get(r.Context(), r.PathValue("id"))
	a.respond(w, r, p, err)
}

func (a *api) processStatus(w http.ResponseWriter, r *http.Request) {
	p, err := a.Liveness.Latest(r.Context(), r.PathValue("kind"))
	a.respond(w, r, p, err)
}

// startedWithinMaxS bounds GET /v1/processes?started_within_s (a year).
const startedWithinMaxS = 366 * 86400

func (a *api) processList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, ok := a.queryInt(w, r, "limit")
	if !ok {
		return
	}
	within, ok := a.querySeconds(w, r, "started_within_s", 0, startedWithinMaxS)
	if !ok {
		return
	}
	procs, next, err := a.Liveness.List(r.Context(), liveness.ListParams{
		Kind: q.Get("kind"), Host: q.Get("host"), Status: q.Get("status"),
		Limit: limit, Cursor: q.Get("cursor"), StartedWithin: within,
	})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if procs == nil {
		procs = []*vigiltype.Process{}
	}
	writeJSON(w, http.StatusOK, struct {
		Processes  []*vigiltype.Process `json:"processes"`
		NextCursor *string              `json:"next_cursor"`
	}{procs, optString(next)})
}

func (a *api) processPrune(w http.ResponseWriter, r *http.Request) {
	var p struct {
		OlderThanS float64 `json:"older_than_s"`
	}
	if !a.decode(w, r, &p) {
		return
	}
	if err := liveness.CheckInterval("older_than_s", p.OlderThanS, 1, 100*365*86400); err != nil {
		a.fail(w, r, err)
		return
	}
	n, err := a.Liveness.Prune(r.Context(), time.Duration(p.OlderThanS*float64(time.Second)))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"deleted": n})
}

// --- tasks ---

func (a *api) taskEnqueue(w http.ResponseWriter, r *http.Request) {
	create(a, w, r, a.Lease.Enqueue)
}

func (a *api) taskList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, before, ok := a.idPage(w, r)
	if !ok {
		return
	}
	tasks, next, err := a.Lease.List(r.Context(), lease.ListParams{
		Status: q.Get("status"), TaskType: q.Get("type"), Limit: limit, BeforeID: before,
	})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if tasks == nil {
		tasks = []*vigiltype.Task{}
	}
	writeJSON(w, http.StatusOK, struct {
		Tasks      []*vigiltype.Task `json:"tasks"`
		NextCursor *string           `json:"next_cursor"`
	}{tasks, idCursor(next)})
}

func (a *api) taskGet(w http.ResponseWriter, r *http.Request) {
	id, ok := a.taskID(w, r)
	if !ok {
		return
	}
	t, err := a.Lease.Get(r.Context(), id)
	a.respond(w, r, t, err)
}

func (a *api) taskClaim(w http.ResponseWriter, r *http.Request) {
	var p struct {
		InstanceID string   `json:"instance_id"`
		TaskTypes  []string `json:"task_types"`
		TaskID     *int64   `json:"task_id"`
		// MaxTasks, when sent, makes this a batch claim (claim_batch.go).
		MaxTasks json.RawMessage `json:"max_tasks"`
	}
	if !a.decode(w, r, &p) {
		return
	}
	if p.InstanceID == "" {
		a.fail(w, r, vigiltype.Invalid("instance_id", "is required"))
		return
	}
	actsFor(r, p.InstanceID)
	if p.TaskID != nil && len(p.TaskTypes) > 0 {
		a.fail(w, r, vigiltype.Invalid("task_id", "give either task_types or task_id, not both"))
		return
	}
	batch, isBatch, err := maxTasks(p.MaxTasks)
	switch {
	case err != nil:
		a.fail(w, r, err)
		return
	case isBatch && p.TaskID != nil:
		a.fail(w, r, vigiltype.Invalid("max_tasks", "give either task_id or max_tasks, not both"))
		return
	}
	token, ok := instanceToken(w, r)
	if !ok {
		return
	}
	if isBatch {
		a.taskClaimBatch(w, r, p.InstanceID, token, p.TaskTypes, batch)
		return
	}
	var t *vigiltype.Task
	if p.TaskID != nil {
		t, err = a.Lease.ClaimByID(r.Context(), p.InstanceID, token, *p.TaskID)
	} else {
		t, err = a.Lease.Claim(r.Context(), p.InstanceID, token, p.TaskTypes)
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if t == nil {
		routine(r)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if a.Metrics != nil {
		a.Metrics.LeasesClaimed.Inc()
	}
	writeJSON(w, http.StatusOK, t)
}

// leaseRequest is the body of every call on a claimed task.
type leaseRequest struct {
	InstanceID    string          `json:"instance_id"`
	LeaseEpoch    int64           `json:"lease_epoch"`
	SchemaVersion int             `json:"schema_version"`  // heartbeat
	ActivityAt    json.RawMessage `json:"activity_at"`     // heartbeat, v2: an RFC 3339 time (activityAt)
	ActivityAgeMS *float64        `json:"activity_age_ms"` // heartbeat, v2: the activity's age on the holder's clock (DESIGN T7)
	Result        json.RawMessage `json:"result"`          // complete
	Error         string          `json:"error"`           // fail
	RetryAfterS   float64         `json:"retry_after_s"`   // fail
}

func (a *api) taskLeaseOp(w http.ResponseWriter, r *http.Request) {
	op := r.PathValue("op")
	allowed := map[string]bool{"heartbeat": true, "complete": true, "fail": true, "release": true}
	if !allowed[op] {
		writeError(w, http.StatusNotFound, "not_found", "no such task operation "+strconv.Quote(op)+": use heartbeat, complete, fail or release")
		return
	}
	id, ok := a.taskID(w, r)
	if !ok {
		return
	}
	var p leaseRequest
	if !a.decode(w, r, &p) {
		return
	}
	actsFor(r, p.InstanceID)
	if op == "heartbeat" {
		routine(r)
	}
	if op != "complete" && len(p.Result) > 0 {
		a.fail(w, r, vigiltype.Invalid("result", "is only accepted by complete"))
		return
	}
	if op != "fail" && (p.Error != "" || p.RetryAfterS != 0) {
		a.fail(w, r, vigiltype.Invalid("error", "error and retry_after_s are only accepted by fail"))
		return
	}
	if op != "heartbeat" && (p.SchemaVersion != 0 || (p.ActivityAt != nil && string(p.ActivityAt) != "null") || p.ActivityAgeMS != nil) {
		a.fail(w, r, vigiltype.Invalid("schema_version", "schema_version, activity_at and activity_age_ms are only accepted by heartbeat"))
		return
	}
	activity, err := activityAt(p.ActivityAt)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	token, ok := instanceToken(w, r)
	if !ok {
		return
	}
	l := lease.Lease{TaskID: id, InstanceID: p.InstanceID, Token: token, Epoch: p.LeaseEpoch}
	var t *vigiltype.Task
	switch op {
	case "heartbeat":
		t, err = a.Lease.Heartbeat(r.Context(), l, lease.Beat{SchemaVersion: p.SchemaVersion, ActivityAt: activity, ActivityAgeMS: p.ActivityAgeMS})
		if err == nil && a.Metrics != nil {
			a.Metrics.Heartbeats.WithLabelValues("lease", strconv.Itoa(t.HeartbeatSchemaVersion)).Inc()
		}
	case "complete":
		t, err = a.Lease.Complete(r.Context(), l, p.Result)
	case "fail":
		if p.RetryAfterS < 0 || p.RetryAfterS > 86400 || p.RetryAfterS != p.RetryAfterS {
			err = vigiltype.Invalid("retry_after_s", "must be between 0 and 86400 seconds")
			break
		}
		t, err = a.Lease.Fail(r.Context(), l, p.Error, time.Duration(p.RetryAfterS*float64(time.Second)))
	case "release":
		t, err = a.Lease.Release(r.Context(), l)
	}
	a.respond(w, r, t, err)
}

// activityAt reads a lease heartbeat's activity_at: absent or null is nil,
// anything but an RFC 3339 time a 400 naming the field.
func activityAt(raw json.RawMessage) (*time.Time, error) {
	if raw == nil || string(raw) == "null" {
		return nil, nil
	}
	var t time.Time
	if err := t.UnmarshalJSON(raw); err != nil {
		return nil, vigiltype.Invalid("activity_at", "must be an RFC 3339 time, e.g. \"2026-12-01T09:30:00Z\"")
	}
	return &t, nil
}

// taskStalled lists a kind's tasks running longer than after_s (default
// 1800, DESIGN S4), for a supervisor's stall check.
func (a *api) taskStalled(w http.ResponseWriter, r *http.Request) {
	after, ok := a.querySeconds(w, r, "after_s", lease.StallAfterDefault, 30*86400)
	if !ok {
		return
	}
	tasks, err := a.Lease.Stalled(r.Context(), r.URL.Query().Get("kind"), after)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if tasks == nil {
		tasks = []*vigiltype.Task{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"tasks": tasks})
}

// taskReclaimStalled takes a running task back (a supervisor after a stall
// kill, an operator, or the holder with its instance token);
// compare-and-swap on lease_epoch.
func (a *api) taskReclaimStalled(w http.ResponseWriter, r *http.Request) {
	id, ok := a.taskID(w, r)
	if !ok {
		return
	}
	var p struct {
		LeaseEpoch int64  `json:"lease_epoch"`
		Reason     string `json:"reason"`
	}
	if !a.decode(w, r, &p) {
		return
	}
	// With an instance token it is the holder's own reclaim, whatever the
	// role: the token must be the holder's. Without one it is the
	// operator's (authorize let no other role through).
	var t *vigiltype.Task
	var err error
	if token := r.Header.Get(InstanceTokenHeader); token != "" {
		var holder string
		t, holder, err = a.Lease.ReclaimByHolder(r.Context(), id, p.LeaseEpoch, token, p.Reason)
		actsFor(r, holder)
	} else {
		t, err = a.Lease.ReclaimStalled(r.Context(), id, p.LeaseEpoch, p.Reason)
	}
	a.respond(w, r, t, err)
}

func (a *api) heartbeatVersions(w http.ResponseWriter, r *http.Request) {
	window, ok := a.querySeconds(w, r, "window_s", lease.HeartbeatVersionsWindowDefault, 366*86400)
	if !ok {
		return
	}
	list, err := a.Lease.HeartbeatVersions(r.Context(), window)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if list == nil {
		list = []*vigiltype.HeartbeatVersion{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"window_s": window.Seconds(), "hosts": list})
}

func (a *api) sweepers(w http.ResponseWriter, r *http.Request) {
	list, err := a.Store.SweeperList(r.Context())
	if err != nil {
		a.fail(w, r, fmt.Errorf("list sweepers: %w", err))
		return
	}
	if list == nil {
		list = []*vigiltype.Sweeper{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"sweepers": list})
}

// --- helpers ---

// create decodes a P from the body, calls fn and answers 201 with its result.
func create[P, R any](a *api, w http.ResponseWriter, r *http.Request, fn func(context.Context, P) (R, error)) {
	var p P
	if !a.decode(w, r, &p) {
		return
	}
	res, err := fn(r.Context(), p)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, res)
}

// idPage reads the limit and cursor of a listing paged by id.
func (a *api) idPage(w http.ResponseWriter, r *http.Request) (limit int, before int64, ok bool) {
	limit, ok = a.queryInt(w, r, "limit")
	if !ok {
		return 0, 0, false
	}
	cursor, ok := a.queryInt(w, r, "cursor")
	return limit, int64(cursor), ok
}

// idCursor is the next_cursor of a listing paged by id: nil on the last page.
func idCursor(next int64) *string {
	if next == 0 {
		return nil
	}
	return optString(strconv.FormatInt(next, 10))
}

// instanceToken reads the instance token header, answering 403 when it is
// missing.
func instanceToken(w http.ResponseWriter, r *http.Request) (string, bool) {
	token := r.Header.Get(InstanceTokenHeader)
	if token == "" {
		writeError(w, http.StatusForbidden, "invalid_token",
			"the "+InstanceTokenHeader+" header is required: send the instance_token returned when the instance registered")
		return "", false
	}
	return token, true
}

func (a *api) taskID(w http.ResponseWriter, r *http.Request) (int64, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		a.fail(w, r, vigiltype.Invalid("task_id", "must be a positive integer"))
		return 0, false
	}
	return id, true
}

// querySeconds reads an optional query parameter of seconds in (0, maxS],
// def when absent.
func (a *api) querySeconds(w http.ResponseWriter, r *http.Request, name string, def time.Duration, maxS float64) (time.Duration, bool) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, true
	}
	secs, err := strconv.ParseFloat(s, 64)
	if err != nil || secs <= 0 || secs > maxS || secs != secs {
		a.fail(w, r, vigiltype.Invalid(name, fmt.Sprintf("must be a number of seconds, more than 0 and at most %d", int64(maxS))))
		return 0, false
	}
	return time.Duration(secs * float64(time.Second)), true
}

func (a *api) queryInt(w http.ResponseWriter, r *http.Request, name string) (int, bool) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return 0, true
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		a.fail(w, r, vigiltype.Invalid(name, "must be an integer"))
		return 0, false
	}
	if n == 0 {
		// 0 would read as "not given" below; say so rather than guess.
		a.fail(w, r, vigiltype.Invalid(name, "must not be 0"))
		return 0, false
	}
	return n, true
}

// decode reads a strict JSON body into v. An empty body decodes as {}. A
// body that is not valid UTF-8 is refused naming the field that holds the
// bad bytes, which encoding/json would quietly turn into U+FFFD (but in
// cleanedFields, where that is what is wanted).
func (a *api) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(r.Body)
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		writeError(w, http.StatusRequestEntityTooLarge, "payload_too_large",
			fmt.Sprintf("request body is over the %d byte limit", BodyMaxBytes))
		return false
	}
	if err != nil {
		a.fail(w, r, fmt.Errorf("read request body: %w", err))
		return false
	}
	if len(body) == 0 {
		return true
	}
	if !utf8.Valid(body) {
		if field := invalidUTF8Field(body); field != "" {
			a.fail(w, r, vigiltype.Invalid(field, "must be valid UTF-8"))
			return false
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err = dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("unexpected data after the JSON object")
	}
	if err == nil {
		return true
	}
	writeError(w, http.StatusBadRequest, "malformed_json", "request body: "+jsonErrorText(err))
	return false
}

func (a *api) respond(w http.ResponseWriter, r *http.Request, v any, err error) {
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// fail maps an error to its status and code. Only sentinel errors show their
// text; anything else is logged and answered "internal error". A store that
// cannot be reached is 503 unavailable with Retry-After, whatever the
// route, its text in the log only.
func (a *api) fail(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, vigiltype.ErrUnavailable) {
		a.Logger.Warn("store unavailable", "method", r.Method, "path", r.URL.Path, "err", err)
		writeUnavailable(w, "the store is unavailable; retry later")
		return
	}
	status, code := http.StatusInternalServerError, "internal"
	switch {
	case errors.Is(err, vigiltype.ErrInvalid):
		status, code = http.StatusBadRequest, "invalid"
	case errors.Is(err, vigiltype.ErrNotFound):
		status, code = http.StatusNotFound, "not_found"
	case errors.Is(err, vigiltype.ErrStaleEpoch):
		status, code = http.StatusConflict, "stale_epoch"
	case errors.Is(err, vigiltype.ErrInstanceExited):
		status, code = http.StatusConflict, "instance_exited"
	case errors.Is(err, vigiltype.ErrInstanceStopped):
		status, code = http.StatusConflict, "instance_stopped"
	case errors.Is(err, vigiltype.ErrNotClaimable):
		status, code = http.StatusConflict, "not_claimable"
	case errors.Is(err, vigiltype.ErrConflict):
		status, code = http.StatusConflict, "conflict"
	case errors.Is(err, vigiltype.ErrOutcomeConflict):
		status, code = http.StatusConflict, "outcome_conflict"
	case errors.Is(err, vigiltype.ErrInvalidToken):
		status, code = http.StatusForbidden, "invalid_token"
	case errors.Is(err, vigiltype.ErrUnauthorized):
		status, code = http.StatusUnauthorized, "unauthorized"
	}
	if status == http.StatusInternalServerError && r.Context().Err() != nil {
		// The client went away (timeout, shutdown): nobody reads this answer.
		a.Logger.Debug("request abandoned by client", "method", r.Method, "path", r.URL.Path, "err", err)
		writeError(w, http.StatusServiceUnavailable, "unavailable", "request cancelled")
		return
	}
	if status == http.StatusUnauthorized {
		writeUnauthorized(w, publicMessage(err))
		return
	}
	if status == http.StatusInternalServerError {
		a.Logger.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		writeError(w, status, code, "internal error")
		return
	}
	writeError(w, status, code, publicMessage(err))
}

// publicMessage is the error text without the store's inner wrapping: the
// sentinels', FieldErrors' and OutcomeConflictErrors' text is written for
// users, and the latter two start with the field they name.
func publicMessage(err error) string {
	var fe *vigiltype.FieldError
	if errors.As(err, &fe) {
		return fe.Error()
	}
	var oe *vigiltype.OutcomeConflictError
	if errors.As(err, &oe) {
		return oe.Error()
	}
	return err.Error()
}

func optString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	var b errorBody
	b.Error.Code, b.Error.Message = code, msg
	writeJSON(w, status, b)
}
