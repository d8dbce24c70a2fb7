// Package registry keeps the agent registry (DESIGN R1): each agent's
// declared identity, schedule and lifecycle status. A record is durable
// intent; it never says whether a process is running — the fleet snapshot
// correlates the two and keeps a mismatch visible.
package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/vigil-fleet/vigil/internal/clock"
	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

const (
	// FunctionMaxLen bounds an agent's function text, in bytes.
	FunctionMaxLen = 1024
	// ConfigMaxBytes bounds an agent's opaque config.
	ConfigMaxBytes = 256 << 10
)

// cronParser accepts standard 5-field specs and descriptors (@hourly, @every 5m).
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Service is the agent registry.
type Service struct {
	store store.Store
	clock clock.Clock
}

// New returns a Service over st; clk stamps every write (clock.Real when nil).
func New(st store.Store, clk clock.Clock) *Service {
	if clk == nil {
		clk = clock.Real{}
	}
	return &Service{store: st, clock: clk}
}

// RegisterParams is a whole agent record.
type RegisterParams struct {
	Name     string          `json:"name"`
	Function string          `json:"function"`
	TickCron string          `json:"tick_cron"` // standard 5-field cron, a descriptor, or ""
	Config   json.RawMessage `json:"config"`    // opaque JSON; absent is null
	// WrittenBy is the role of the writer ("operator", "agent", "read"),
	// set by the server from the request's token, never from the body: a
	// supervisor launches a record's command only when it is "operator".
	WrittenBy string `json:"-"`
}

// Register writes the record unconditionally: an existing record of that
// name is replaced, created_at, status and config reset (DESIGN R1).
func (s *Service) Register(ctx context.Context, p RegisterParams) (*vigiltype.Agent, error) {
	if err := vigiltype.CheckName("name", p.Name); err != nil {
		return nil, err
	}
	if err := checkFunction(p.Function); err != nil {
		return nil, err
	}
	if err := CheckCron(p.TickCron); err != nil {
		return nil, err
	}
	if err := checkConfig(p.Config); err != nil {
		return nil, err
	}
	a, err := s.store.AgentRegister(ctx, store.AgentRegisterParams{
		Name: p.Name, Function: p.Function, TickCron: p.TickCron, Config: p.Config, ConfigWrittenBy: p.WrittenBy,
		Now: s.clock.Now(),
	})
	if err != nil {
		return nil, fmt.Errorf("register agent %q: %w", p.Name, err)
	}
	return a, nil
}

// Get returns one record. Errors: ErrNotFound.
func (s *Service) Get(ctx context.Context, name string) (*vigiltype.Agent, error) {
	if err := vigiltype.CheckName("name", name); err != nil {
		return nil, err
	}
	a, err := s.store.AgentGet(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("agent %q: %w", name, err)
	}
	return a, nil
}

// List returns every record, stopped ones included, oldest first.
func (s *Service) List(ctx context.Context) ([]*vigiltype.Agent, error) {
	list, err := s.store.AgentList(ctx)
	if err != nil {
		return nil, fmt.Errorf("list agents: %w", err)
	}
	return list, nil
}

// UpdateParams changes the given fields of a record read at Version.
type UpdateParams struct {
	Version  int64           `json:"version"`
	Function *string         `json:"function"`
	TickCron *string         `json:"tick_cron"`
	Config   json.RawMessage `json:"config"` // absent: unchanged
	// WrittenBy is the role of the writer, stored with a new Config (see
	// RegisterParams.WrittenBy).
	WrittenBy string `json:"-"`
}

// Update changes the given fields if the record is still at p.Version
// (compare-and-swap). A lost race is ErrConflict naming the agent, never a
// silent overwrite.
func (s *Service) Update(ctx context.Context, name string, p UpdateParams) (*vigiltype.Agent, error) {
	if err := vigiltype.CheckName("name", name); err != nil {
		return nil, err
	}
	if p.Version <= 0 {
		return nil, vigiltype.Invalid("version", "is required: the version of the record you read (compare-and-swap)")
	}
	if p.Function == nil && p.TickCron == nil && p.Config == nil {
		return nil, vigiltype.Invalid("function", "nothing to update: give function, tick_cron or config")
	}
	if p.Function != nil {
		if err := checkFunction(*p.Function); err != nil {
			return nil, err
		}
	}
	if p.TickCron != nil {
		if err := CheckCron(*p.TickCron); err != nil {
			return nil, err
		}
	}
	if err := checkConfig(p.Config); err != nil {
		return nil, err
	}
	a, err := s.store.AgentUpdate(ctx, store.AgentUpdateParams{
		Name: name, Version: p.Version, Function: p.Function, TickCron: p.TickCron, Config: p.Config,
		ConfigWrittenBy: p.WrittenBy, Now: s.clock.Now(),
	})
	if err != nil {
		return nil, fmt.Errorf("update agent %q: %w", name, err)
	}
	return a, nil
}

// MarkStopped sets status stopped and stopped_at = now.
func (s *Service) MarkStopped(ctx context.Context, name string) (*vigiltype.Agent, error) {
	return s.setStatus(ctx, name, vigiltype.AgentStopped)
}

// MarkActive sets status active; call it once a replacement process is
// confirmed started.
func (s *Service) MarkActive(ctx context.Context, name string) (*vigiltype.Agent, error) {
	return s.setStatus(ctx, name, vigiltype.AgentActive)
}

func (s *Service) setStatus(ctx context.Context, name string, st vigiltype.AgentStatus) (*vigiltype.Agent, error) {
	if err := vigiltype.CheckName("name", name); err != nil {
		return nil, err
	}
	a, err := s.store.AgentSetStatus(ctx, name, st, s.clock.Now())
	if err != nil {
		return nil, fmt.Errorf("mark agent %q %s: %w", name, st, err)
	}
	return a, nil
}

// CheckCron validates a tick_cron spec: empty, a standard 5-field spec
// ("*/5 * * * *") or a descriptor ("@hourly", "@every 10m").
func CheckCron(spec string) error {
	if spec == "" {
		return nil
	}
	if err := vigiltype.CheckText("tick_cron", spec); err != nil {
		return err // before the parser, which takes a newline for a space
	}
	if _, err := cronParser.Parse(spec); err != nil {
		return vigiltype.Invalid("tick_cron", fmt.Sprintf("%q is not a cron spec (5 fields, or @hourly, @every 10m): %v", spec, err))
	}
	if every, ok := strings.CutPrefix(spec, "@every "); ok {
		if d, err := time.ParseDuration(strings.TrimSpace(every)); err != nil || d < time.Second {
			return vigiltype.Invalid("tick_cron", fmt.Sprintf("%q: @every needs a duration of at least 1s", spec))
		}
	}
	return nil
}

func checkFunction(f string) error {
	if len(f) > FunctionMaxLen {
		return vigiltype.Invalid("function", fmt.Sprintf("must be at most %d bytes", FunctionMaxLen))
	}
	return vigiltype.CheckText("function", f)
}

func checkConfig(raw json.RawMessage) error {
	if raw == nil {
		return nil
	}
	if err := vigiltype.CheckJSON("config", raw, ConfigMaxBytes); err != nil {
		return err
	}
	return checkLaunch(raw)
}

// checkLaunch validates the one part of a config vigil reads: an optional
// "launch" block that lets a supervisor on that host start the agent
// ({"launch": {"host", "command", "env", "dir"}}).
func checkLaunch(raw json.RawMessage) error {
	var c struct {
		Launch json.RawMessage `json:"launch"`
	}
	if json.Unmarshal(raw, &c) != nil || c.Launch == nil || string(c.Launch) == "null" {
		return nil // not an object, or no launch block: opaque
	}
	var l struct {
		Host    *string           `json:"host"`
		Command []string          `json:"command"`
		Env     map[string]string `json:"env"`
		Dir     string            `json:"dir"`
	}
	dec := json.NewDecoder(strings.NewReader(string(c.Launch)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return vigiltype.Invalid("config.launch", "must be {\"host\": string, \"command\": [strings], \"env\": {string: string}, \"dir\": string}: "+err.Error())
	}
	switch {
	case l.Host == nil || strings.TrimSpace(*l.Host) == "":
		return vigiltype.Invalid("config.launch.host", "is required: the hostname whose supervisor launches the agent")
	case len(l.Command) == 0 || l.Command[0] == "":
		return vigiltype.Invalid("config.launch.command", "must be a non-empty argv list, e.g. [\"/usr/bin/agent\", \"--flag\"]")
	case l.Dir != "" && !filepath.IsAbs(l.Dir):
		return vigiltype.Invalid("config.launch.dir", "must be an absolute path")
	}
	return nil
}
