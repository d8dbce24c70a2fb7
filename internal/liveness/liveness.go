// Package liveness answers "is this OS process up?" (DESIGN L1–L7).
//
// Each process instance registers once at start and gets an instance token;
// it then sends a liveness heartbeat every liveness_interval_s. The status is
// never stored: it is computed at read time from the server's clock,
//
//	alive   iff  now - last_heartbeat_at <= 3 × liveness_interval_s  and no clean exit
//	stopped otherwise
//
// so a dead process shows stopped within three intervals without any sweeper,
// and a skewed agent clock can neither fake nor hide liveness (DESIGN L3).
//
//	register ──► alive ──(no heartbeat for 3× interval)──► stopped
//	               ▲  │                                       │
//	               │  └──────────(exit)──────────────────────►│
//	               └────────(heartbeat, not after exit)───────┘
//
// Liveness is independent of lease heartbeats (package lease): a process can
// be alive while holding no task, and a task's lease can lapse while its
// holder is alive.
package liveness

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/vigil-fleet/vigil/internal/clock"
	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

const (
	// LivenessIntervalMinS is the shortest liveness interval accepted, in seconds.
	LivenessIntervalMinS = 0.01
	// LivenessIntervalMaxS is the longest liveness interval accepted, in seconds (one day).
	LivenessIntervalMaxS = 86400
	// HostnameMaxLen is the longest hostname accepted.
	HostnameMaxLen = 255
	// ListLimitDefault is the page size when a listing names none.
	ListLimitDefault = 50
	// ListLimitMax is the largest page size accepted.
	ListLimitMax = 1000
)

// Service registers instances, records their heartbeats and reads their
// computed status. Create it with New.
type Service struct {
	store  store.Store
	clock  clock.Clock
	commit *groupCommit // nil unless EnableGroupCommit
}

// New returns a Service over st; clk decides "now" for every write and every
// computed status (clock.Real when nil).
func New(st store.Store, clk clock.Clock) *Service {
	if clk == nil {
		clk = clock.Real{}
	}
	return &Service{store: st, clock: clk}
}

// RegisterParams describes a starting process instance.
type RegisterParams struct {
	ProcessKind       string  `json:"process_kind"`
	Hostname          string  `json:"hostname"`
	PID               int     `json:"pid"`
	LivenessIntervalS float64 `json:"liveness_interval_s"` // seconds; > 0, ≤ LivenessIntervalMaxS
}

// Validate returns a *vigiltype.FieldError naming the first bad field.
func (p RegisterParams) Validate() error {
	if err := vigiltype.CheckName("process_kind", p.ProcessKind); err != nil {
		return err
	}
	if err := CheckHostname("hostname", p.Hostname); err != nil {
		return err
	}
	if p.PID <= 0 {
		return vigiltype.Invalid("pid", "must be a positive integer")
	}
	return CheckInterval("liveness_interval_s", p.LivenessIntervalS, LivenessIntervalMinS, LivenessIntervalMaxS)
}

// CheckHostname validates a hostname: required, at most HostnameMaxLen
// bytes of UTF-8 text without control characters (they would corrupt
// every table and log that prints it).
func CheckHostname(field, h string) error {
	if strings.TrimSpace(h) == "" {
		return vigiltype.Invalid(field, "is required")
	}
	if len(h) > HostnameMaxLen {
		return vigiltype.Invalid(field, "must be at most 255 characters")
	}
	return vigiltype.CheckText(field, h)
}

// CheckInterval validates a duration in seconds: finite and within
// [minS, maxS]. The message is written for whole seconds when both bounds
// are.
func CheckInterval(field string, s, minS, maxS float64) error {
	if math.IsNaN(s) || math.IsInf(s, 0) || s <= 0 {
		return vigiltype.Invalid(field, "must be a positive number of seconds")
	}
	if s < minS || s > maxS {
		return vigiltype.Invalid(field, "must be between "+formatSeconds(minS)+" and "+formatSeconds(maxS)+" seconds")
	}
	return nil
}

func formatSeconds(s float64) string { return strconv.FormatFloat(s, 'f', -1, 64) }

// Registered is a new instance together with the token that authorises its
// later writes. The token is shown once; the store keeps only its hash.
type Registered struct {
	*vigiltype.Process
	InstanceToken string `json:"instance_token"`
}

// Register creates a fresh instance (new uuid4) with started_at =
// last_heartbeat_at = now (DESIGN L2).
func (s *Service) Register(ctx context.Context, p RegisterParams) (*Registered, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	token, err := newToken()
	if err != nil {
		return nil, err
	}
	proc, err := s.store.ProcessRegister(ctx, store.ProcessRegisterParams{
		InstanceID:        uuid.NewString(),
		TokenHash:         HashToken(token),
		ProcessKind:       p.ProcessKind,
		Hostname:          p.Hostname,
		PID:               p.PID,
		LivenessIntervalS: p.LivenessIntervalS,
		Now:               s.clock.Now(),
	})
	if err != nil {
		return nil, fmt.Errorf("register %s instance: %w", p.ProcessKind, err)
	}
	return &Registered{Process: proc, InstanceToken: token}, nil
}

// Heartbeat records a liveness heartbeat at the server's now. Errors:
// ErrNotFound, ErrInvalidToken, ErrInstanceExited. With group commit
// running it returns once the transaction holding the heartbeat committed.
func (s *Service) Heartbeat(ctx context.Context, instanceID, token string) (*vigiltype.Process, error) {
	if err := CheckInstanceID(instanceID); err != nil {
		return nil, err
	}
	p := store.ProcessHeartbeatParams{InstanceID: instanceID, TokenHash: HashToken(token)}
	if s.commit != nil {
		if r, ok := s.commit.submit(ctx, p, s.clock.Now); ok {
			return r.Process, r.Err
		}
	}
	p.Now = s.clock.Now()
	return s.store.ProcessHeartbeat(ctx, p)
}

// Exit records a clean exit: the instance shows stopped at once and the
// lease sweeper reclaims whatever it still holds on its next pass.
func (s *Service) Exit(ctx context.Context, instanceID, token string) (*vigiltype.Process, error) {
	if err := CheckInstanceID(instanceID); err != nil {
		return nil, err
	}
	return s.store.ProcessMarkExited(ctx, store.ProcessMarkExitedParams{
		InstanceID: instanceID, TokenHash: HashToken(token), Now: s.clock.Now(),
	})
}

// Authenticate checks that token belongs to instanceID.
// Errors: ErrNotFound, ErrInvalidToken.
func (s *Service) Authenticate(ctx context.Context, instanceID, token string) error {
	if err := CheckInstanceID(instanceID); err != nil {
		return err
	}
	return s.store.ProcessCheckToken(ctx, instanceID, HashToken(token))
}

// Get returns one instance with its status at now.
func (s *Service) Get(ctx context.Context, instanceID string) (*vigiltype.Process, error) {
	if err := CheckInstanceID(instanceID); err != nil {
		return nil, err
	}
	return s.store.ProcessGet(ctx, instanceID, s.clock.Now())
}

// CheckInstanceID refuses an instance id no server could have issued —
// invalid UTF-8 or a control character — with one 400 naming instance_id,
// before any store sees it, so both backends answer alike and no driver
// text reaches a client. Any other unknown id is ErrNotFound from the store.
func CheckInstanceID(id string) error {
	return vigiltype.CheckText("instance_id", id)
}

// Latest returns the most recently started instance of kind (DESIGN L4
// process_status); the error wraps ErrNotFound when the kind has none.
func (s *Service) Latest(ctx context.Context, kind string) (*vigiltype.Process, error) {
	if err := vigiltype.CheckName("process_kind", kind); err != nil {
		return nil, err
	}
	p, err := s.store.ProcessLatest(ctx, kind, s.clock.Now())
	if errors.Is(err, vigiltype.ErrNotFound) {
		return nil, fmt.Errorf("no process of kind %q has registered: %w", kind, vigiltype.ErrNotFound)
	}
	return p, err
}

// ListParams filters a listing. Empty strings do not filter.
type ListParams struct {
	Kind   string
	Host   string
	Status string // "alive", "stopped" or ""
	Limit  int    // 0 means ListLimitDefault; at most ListLimitMax
	Cursor string // next_cursor of the previous page
	// StartedWithin, when positive, keeps only the instances started within
	// this long before now on the server's clock. A caller on another host
	// asks "registered since my launch" with the time since it, measured on
	// its own monotonic clock, and never compares its clock with the
	// server's (DESIGN L10).
	StartedWithin time.Duration
}

// List returns one page of instances newest first and the cursor of the
// next page ("" on the last page) (DESIGN L4).
func (s *Service) List(ctx context.Context, p ListParams) ([]*vigiltype.Process, string, error) {
	params := store.ProcessListParams{Kind: p.Kind, Host: p.Host, Now: s.clock.Now()}
	if p.Kind != "" {
		if err := vigiltype.CheckName("kind", p.Kind); err != nil {
			return nil, "", err
		}
	}
	if p.Host != "" {
		if err := CheckHostname("host", p.Host); err != nil {
			return nil, "", err
		}
	}
	if p.Status != "" {
		st := vigiltype.ProcessStatus(p.Status)
		if !st.Valid() {
			return nil, "", vigiltype.Invalid("status", "must be alive or stopped")
		}
		params.Status = st
	}
	limit, err := CheckLimit(p.Limit)
	if err != nil {
		return nil, "", err
	}
	params.Limit = limit + 1
	if p.Cursor != "" {
		c, err := decodeCursor(p.Cursor)
		if err != nil {
			return nil, "", err
		}
		params.After = c
	}
	procs, err := s.store.ProcessList(ctx, params)
	if err != nil {
		return nil, "", fmt.Errorf("list processes: %w", err)
	}
	if p.StartedWithin > 0 {
		// Newest first: the instances started before the bound are a tail,
		// and no later page holds one started after it.
		since := params.Now.Add(-p.StartedWithin)
		if i := slices.IndexFunc(procs, func(p *vigiltype.Process) bool { return p.StartedAt.Before(since) }); i >= 0 {
			procs = procs[:i]
		}
	}
	next := ""
	if len(procs) > limit {
		procs = procs[:limit]
		last := procs[limit-1]
		next = encodeCursor(last.StartedAt, last.InstanceID)
	}
	return procs, next, nil
}

// CheckIDPage validates a page of a listing paged by id (newest first): the
// cursor (an id, 0 for the first page) and the limit, which it returns
// with the default applied.
func CheckIDPage(beforeID int64, limit int) (int, error) {
	if beforeID < 0 {
		return 0, vigiltype.Invalid("cursor", "is not a cursor returned by this API")
	}
	return CheckLimit(limit)
}

// TrimPage cuts rows read with limit+1 to limit and returns the next id
// cursor: the last row's id when there were more, else 0.
func TrimPage[T any](rows []T, limit int, id func(T) int64) ([]T, int64) {
	if len(rows) <= limit {
		return rows, 0
	}
	rows = rows[:limit]
	return rows, id(rows[limit-1])
}

// CheckLimit applies the default page size to 0 (no limit given) and
// validates the bound.
func CheckLimit(limit int) (int, error) {
	switch {
	case limit == 0:
		return ListLimitDefault, nil
	case limit < 0 || limit > ListLimitMax:
		return 0, vigiltype.Invalid("limit", "must be between 1 and 1000")
	}
	return limit, nil
}

// Prune deletes stopped instances whose last heartbeat is older than
// olderThan and that hold no task (DESIGN L7). It never runs on its own.
func (s *Service) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan <= 0 {
		return 0, vigiltype.Invalid("older_than", "must be a positive duration")
	}
	now := s.clock.Now()
	n, err := s.store.ProcessPrune(ctx, store.ProcessPruneParams{Before: now.Add(-olderThan), Now: now})
	if err != nil {
		return 0, fmt.Errorf("prune processes: %w", err)
	}
	return n, nil
}

// HashToken is the form in which instance tokens are stored and compared:
// hex sha256.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

func newToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate instance token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

const cursorTimeLayout = "2006-01-02T15:04:05.000Z"

func encodeCursor(startedAt time.Time, instanceID string) string {
	raw := startedAt.UTC().Format(cursorTimeLayout) + "|" + instanceID
	return base64.RawURLEncoding.EncodeToString([]byte(raw))
}

func decodeCursor(s string) (*store.ProcessCursor, error) {
	bad := vigiltype.Invalid("cursor", "is not a cursor returned by this API")
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, bad
	}
	ts, id, ok := strings.Cut(string(raw), "|")
	if !ok || id == "" {
		return nil, bad
	}
	t, err := time.Parse(cursorTimeLayout, ts)
	if err != nil {
		return nil, bad
	}
	return &store.ProcessCursor{StartedAt: t, InstanceID: id}, nil
}
