package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/vigil-fleet/vigil/internal/auth"
	"github.com/vigil-fleet/vigil/internal/registry"
	"github.com/vigil-fleet/vigil/internal/supervisor"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// supervisorFlags are the flags of the commands that supervise a fleet
// (up, supervise).
type supervisorFlags struct {
	fleetPath string
	backoff   supervisor.BackoffPolicy
	stopGrace time.Duration
	flapping  supervisor.FlapPolicy
	logDir    string
	logMax    int64
	logKeep   int
	stall     stallFlags
	control   time.Duration
	// allowRegistered lets registry records launch commands (written with
	// the operator role), besides the fleet file's agents.
	allowRegistered bool
}

func (sf *supervisorFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&sf.fleetPath, "fleet", FleetFileDefault, "fleet file (YAML) listing the agents to run")
	fs.DurationVar(&sf.backoff.Min, "backoff-min", supervisor.BackoffMinDefault, "restart delay after an exit (DESIGN S2)")
	fs.DurationVar(&sf.backoff.FastFailure, "backoff-fast-failure", supervisor.FastFailureDefault, "a run shorter than this doubles the next delay")
	fs.DurationVar(&sf.backoff.Reset, "backoff-reset", supervisor.BackoffResetDefault,
		"a run at least this long resets the delay to --backoff-min; at least --backoff-fast-failure")
	fs.DurationVar(&sf.backoff.Max, "backoff-max", supervisor.BackoffMaxDefault, "cap on the restart delay")
	fs.Float64Var(&sf.backoff.Jitter, "backoff-jitter", supervisor.JitterDefault,
		"spread each restart delay d over [d, d+jitter·d] (ending at --backoff-max at the cap), so agents failing together do not restart in lockstep (DESIGN S2); 0 to 1, 0 disables")
	fs.IntVar(&sf.flapping.Exits, "flap-exits", supervisor.FlapExitsDefault,
		"record a flapping event (DESIGN E1) when an agent exits this many times within --flap-window, however long each run; at least 2")
	fs.DurationVar(&sf.flapping.Window, "flap-window", supervisor.FlapWindowDefault, "sliding window for --flap-exits")
	fs.StringVar(&sf.logDir, "log-dir", "",
		"directory for the agents' log files <agent>.log, read by 'vigil logs'; created if missing"+logDirHelp)
	fs.Int64Var(&sf.logMax, "log-max-bytes", supervisor.LogMaxBytesDefault, "rotate an agent's log file when it would pass this size (10 MiB)")
	fs.IntVar(&sf.logKeep, "log-keep", supervisor.LogKeepDefault, "rotated log files kept per agent, besides the current one")
	fs.DurationVar(&sf.stopGrace, "stop-grace", supervisor.StopGraceDefault, "time between SIGTERM and SIGKILL when stopping an agent")
	sf.stall.register(fs)
	fs.DurationVar(&sf.control, "control-poll", supervisor.DesiredPollDefault,
		"how often to read what operators asked with vigil stop, start and restart")
	fs.BoolVar(&sf.allowRegistered, "allow-registered-launch", false,
		"also launch agents the registry asks this host to run ({\"launch\": {\"host\", \"command\", …}} in an agent's config), "+
			"when an operator token wrote that config; off: only the fleet file's agents run, and such a record gets a "+
			"launch_failure event saying why (on a server without token files every local program is the operator)")
}

// load validates the flags and reads the fleet file; defaultLogs is the log
// directory when --log-dir is not given.
func (sf *supervisorFlags) load(cmd *cobra.Command, defaultLogs string) (*supervisor.Fleet, error) {
	if err := sf.stall.check(); err != nil {
		return nil, err
	}
	if err := checkBackoff(sf.backoff); err != nil {
		return nil, err
	}
	if sf.backoff.Jitter == 0 {
		sf.backoff.Jitter = supervisor.JitterOff
	}
	switch {
	case sf.stopGrace <= 0:
		return nil, fmt.Errorf("--stop-grace must be positive, got %s", sf.stopGrace)
	case sf.flapping.Exits < 2:
		return nil, fmt.Errorf("--flap-exits must be at least 2, got %d", sf.flapping.Exits)
	case sf.flapping.Window <= 0:
		return nil, fmt.Errorf("--flap-window must be positive, got %s", sf.flapping.Window)
	case sf.logMax < 1024:
		return nil, fmt.Errorf("--log-max-bytes must be at least 1024, got %d", sf.logMax)
	case sf.logKeep < 1:
		return nil, fmt.Errorf("--log-keep must be at least 1, got %d", sf.logKeep)
	case sf.control < 10*time.Millisecond:
		return nil, fmt.Errorf("--control-poll must be at least 10ms, got %s", sf.control)
	}
	if sf.logDir == "" {
		if cmd.Flags().Changed("log-dir") {
			return nil, errors.New("--log-dir must not be empty")
		}
		sf.logDir = defaultLogs
	}
	if err := os.MkdirAll(sf.logDir, 0o755); err != nil {
		return nil, fmt.Errorf("--log-dir %s: %w", sf.logDir, err)
	}
	fleet, err := supervisor.LoadFleet(sf.fleetPath)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("--fleet %s: no such file (the bundled example is examples/fleet.yaml)", sf.fleetPath)
		}
		return nil, err // names the file and the field
	}
	return fleet, nil
}

// registeredPage bounds the startup check's read: the newest instances of
// the agent's kind on this host registered since the launch, of which one
// generation makes at most a few.
const registeredPage = 100

// config is the supervisor's configuration for fleet. registered lists the
// instances of kind on host registered within the last `within` on the
// server's clock (the startup check).
func (sf *supervisorFlags) config(cmd *cobra.Command, fleet *supervisor.Fleet, extraEnv map[string]string,
	logger *slog.Logger, events supervisor.EventSink, stall supervisor.StallSource, desired supervisor.DesiredSource,
	registered func(ctx context.Context, kind, host string, within time.Duration) ([]*vigiltype.Process, error),
	holder func(ctx context.Context, instanceID string) (*vigiltype.Process, error)) supervisor.Config {
	host := hostname()
	return supervisor.Config{
		Desired: desired, DesiredPoll: sf.control,
		Registered: func(ctx context.Context, agent string, within time.Duration) ([]*vigiltype.Process, error) {
			return registered(ctx, agent, host, within)
		},
		Host:   host,
		Agents: fleet.Agents, ExtraEnv: extraEnv, Backoff: sf.backoff, StopGrace: sf.stopGrace, Flapping: sf.flapping,
		Logger: logger, Stdout: cmd.OutOrStdout(), Stderr: cmd.ErrOrStderr(),
		Events: events,
		LogDir: sf.logDir, LogMaxBytes: sf.logMax, LogKeep: sf.logKeep,
		Stall: sf.stall.config(stall, holder),
	}
}

// registerFleet registers every agent of fleet that the registry does not
// know yet, with its command line as its function, so the registry says
// what is meant to run (DESIGN R1). Existing records are kept as they are:
// an operator's stop, config or schedule outlives a restart of the
// supervisor. exists reports whether a record exists.
func registerFleet(ctx context.Context, fleet *supervisor.Fleet,
	exists func(ctx context.Context, name string) (bool, error),
	register func(ctx context.Context, name, function string) error) error {
	for _, a := range fleet.Agents {
		known, err := exists(ctx, a.Name)
		if err != nil {
			return fmt.Errorf("look up agent %s: %w", a.Name, err)
		}
		if known {
			continue
		}
		function := strings.Join(a.Command, " ")
		if len(function) > registry.FunctionMaxLen {
			function = strings.ToValidUTF8(function[:registry.FunctionMaxLen], "")
		}
		if err := register(ctx, a.Name, function); err != nil {
			return fmt.Errorf("register agent %s: %w", a.Name, err)
		}
	}
	return nil
}

// agentTokenEnv is the environment that hands the agents a supervisor
// launches their bearer token: VIGIL_TOKEN_FILE naming the agent token file
// when one is given, else the operator's (as before roles), else nothing.
// The path is made absolute: agents may run in another directory.
func agentTokenEnv(operatorFile, agentFile string) (map[string]string, error) {
	env := map[string]string{}
	flag, file := "--agent-token-file", agentFile
	if file == "" {
		flag, file = "--token-file", operatorFile
	}
	if file == "" {
		return env, nil
	}
	abs, err := filepath.Abs(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	env["VIGIL_TOKEN_FILE"] = abs
	return env, nil
}

// checkBackoff validates the --backoff-* flags before anything starts.
func checkBackoff(b supervisor.BackoffPolicy) error {
	switch {
	case b.Min <= 0:
		return fmt.Errorf("--backoff-min must be positive, got %s", b.Min)
	case b.FastFailure <= 0:
		return fmt.Errorf("--backoff-fast-failure must be positive, got %s", b.FastFailure)
	case b.Reset < b.FastFailure:
		return fmt.Errorf("--backoff-reset (%s) must not be below --backoff-fast-failure (%s)", b.Reset, b.FastFailure)
	case b.Max < b.Min:
		return fmt.Errorf("--backoff-max (%s) must not be below --backoff-min (%s)", b.Max, b.Min)
	case b.Jitter < 0 || b.Jitter > 1:
		return fmt.Errorf("--backoff-jitter must be between 0 and 1, got %g", b.Jitter)
	}
	return nil
}

// stallFlags are the stall-detection flags (DESIGN S4).
type stallFlags struct {
	after, every    time.Duration
	pendingApproval string
	approvalTimeout time.Duration
	off             bool
	budget          int
	window          time.Duration
}

func (f *stallFlags) register(fs *pflag.FlagSet) {
	fs.DurationVar(&f.after, "stall-after", supervisor.StallAfterDefault,
		"a task running longer than this is stalled: its agent is killed and restarted, the task taken back (DESIGN S4)")
	fs.DurationVar(&f.every, "stall-check", supervisor.StallCheckDefault, "how often to look for stalled tasks")
	fs.StringVar(&f.pendingApproval, "pending-approval-cmd", "",
		"command asked before any stall kill: exit 0 = an approval is pending (kill nothing), exit 1 = none; any other exit, a signal, a missing command or one still running after --pending-approval-timeout is a failed check, which fails open (kill nothing, logged and counted in vigil_stall_approval_check_failures_total). Run directly, or through sh -c when it uses shell syntax")
	fs.DurationVar(&f.approvalTimeout, "pending-approval-timeout", supervisor.PendingApprovalTimeoutDefault,
		"how long one --pending-approval-cmd run may take before it is killed and counts as a failed check")
	fs.BoolVar(&f.off, "no-stall-kill", false, "turn stall detection off")
	fs.IntVar(&f.budget, "stall-kill-budget", supervisor.StallKillBudgetDefault,
		"at most this many stall kills per --stall-kill-window across the fleet; past it stalls are recorded as deferred")
	fs.DurationVar(&f.window, "stall-kill-window", supervisor.StallKillWindowDefault, "the window of --stall-kill-budget")
}

func (f *stallFlags) check() error {
	switch {
	case f.after < time.Second:
		return fmt.Errorf("--stall-after must be at least 1s, got %s", f.after)
	case f.every < 10*time.Millisecond:
		return fmt.Errorf("--stall-check must be at least 10ms, got %s", f.every)
	case f.budget < 1:
		return fmt.Errorf("--stall-kill-budget must be at least 1, got %d", f.budget)
	case f.window <= 0:
		return fmt.Errorf("--stall-kill-window must be positive, got %s", f.window)
	case f.approvalTimeout < 10*time.Millisecond:
		return fmt.Errorf("--pending-approval-timeout must be at least 10ms, got %s", f.approvalTimeout)
	}
	return nil
}

// config is the supervisor's stall configuration over source, nil when off.
func (f *stallFlags) config(source supervisor.StallSource,
	holder func(ctx context.Context, instanceID string) (*vigiltype.Process, error)) *supervisor.StallConfig {
	if f.off {
		return nil
	}
	c := &supervisor.StallConfig{Source: source, After: f.after, Every: f.every, Budget: f.budget, Window: f.window,
		Holder: holder, Host: hostname()}
	if f.pendingApproval != "" {
		c.PendingApproval = supervisor.PendingApprovalCommand(supervisor.ApprovalArgv(f.pendingApproval), f.approvalTimeout)
	}
	return c
}

// found turns a lookup's not-found error into false.
func found[T any](_ T, err error) (bool, error) {
	if errorsIsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// desiredFrom is a supervisor.DesiredSource over a registry lookup and a
// planned-stop lookup, in-process or over HTTP.
type desiredFrom struct {
	agent       func(ctx context.Context, name string) (*vigiltype.Agent, error)
	plannedStop func(ctx context.Context, name string) (*vigiltype.PlannedStop, error)
}

func (d desiredFrom) Desired(ctx context.Context, name string) (supervisor.Desired, error) {
	a, err := d.agent(ctx, name)
	if err != nil {
		return supervisor.Desired{}, err
	}
	out := supervisor.Desired{Status: a.Status}
	m, err := d.plannedStop(ctx, name)
	switch {
	case err == nil:
		// created_at and expires_at serve as the marker's identity only:
		// they are never compared with this host's clock (DESIGN L10).
		out.PlannedStop = &supervisor.Marker{
			ID:  m.CreatedAt.UTC().Format(time.RFC3339Nano) + "/" + m.ExpiresAt.UTC().Format(time.RFC3339Nano),
			Age: time.Duration(m.AgeMS) * time.Millisecond,
		}
	case !errorsIsNotFound(err):
		return supervisor.Desired{}, err
	}
	return out, nil
}

// launchConfig is the part of an agent's registry config that lets a
// supervisor start it without a fleet file:
//
//	{"launch": {"host": "box1", "command": ["/usr/bin/agent", "--x"], "env": {"K": "v"}, "dir": "/srv/agent"}}
//
// Only the supervisor on that host launches it, so it never runs twice.
type launchConfig struct {
	Launch *struct {
		Host    string            `json:"host"`
		Command []string          `json:"command"`
		Env     map[string]string `json:"env"`
		Dir     string            `json:"dir"`
	} `json:"launch"`
}

// registeredLaunch decides what to do with a registry record seen by a
// supervisor on host: ask is false when the record does not ask this host
// to launch anything (no launch block, or one for another host); else
// refusal says why it is not launched ("" when it is: allow is
// --allow-registered-launch, and the config must have been written with the
// operator role). Launch commands are operator data (issue #13): an agent
// or read token, or a record from before roles, never makes a host run a
// command.
func registeredLaunch(a vigiltype.Agent, host string, allow bool) (spec supervisor.Agent, ask bool, refusal string) {
	var c launchConfig
	if len(a.Config) == 0 || json.Unmarshal(a.Config, &c) != nil || c.Launch == nil || c.Launch.Host != host {
		return supervisor.Agent{}, false, ""
	}
	spec = supervisor.Agent{Name: a.Name, Command: c.Launch.Command, Env: c.Launch.Env, Dir: c.Launch.Dir}
	switch {
	case !allow:
		return spec, true, "not launched: this supervisor runs only its fleet file's agents " +
			"(start it with --allow-registered-launch to also run registry records an operator wrote)"
	case a.ConfigWrittenBy != string(auth.RoleOperator):
		by := "no known role (written before roles)"
		if a.ConfigWrittenBy != "" {
			by = "the " + a.ConfigWrittenBy + " role"
		}
		return spec, true, "not launched: the launch config was written with " + by +
			"; only a config written with the operator role is run"
	}
	return spec, true, ""
}

// fleetRunner runs a fleet's supervisor and picks up agents registered
// later through the API whose config asks this host to launch them, each
// under a supervisor of its own (vigil up and vigil supervise).
type fleetRunner struct {
	sf     *supervisorFlags
	cmd    *cobra.Command
	host   string
	logger *slog.Logger
	// config builds a supervisor configuration for a set of agents.
	config func(fleet *supervisor.Fleet) supervisor.Config
	// list reads the registry.
	list func(ctx context.Context) ([]vigiltype.Agent, error)
	// events records why a registered agent was not launched.
	events supervisor.EventSink
}

// run runs sup (the fleet file's agents, named in known) and the watch for
// later agents until ctx ends and every supervisor has stopped.
func (r *fleetRunner) run(ctx context.Context, sup *supervisor.Supervisor, known map[string]bool) error {
	var wg sync.WaitGroup
	wg.Go(func() { r.watch(ctx, known, &wg) })
	err := sup.Run(ctx)
	wg.Wait()
	return err
}

// watch polls the registry every --control-poll for agents it does not run
// yet that ask this host to launch them, and starts a supervisor for each
// it may launch (registeredLaunch). One it may not gets a launch_failure
// event saying why, once for each version of its record.
func (r *fleetRunner) watch(ctx context.Context, known map[string]bool, wg *sync.WaitGroup) {
	t := time.NewTicker(r.sf.control)
	defer t.Stop()
	refused := map[string]int64{} // agent → the record version refused
	for {
		if agents, err := r.list(ctx); err != nil {
			if ctx.Err() == nil {
				r.logger.Warn("cannot read the registry for new agents", "err", err)
			}
		} else {
			for _, a := range agents {
				if known[a.Name] {
					continue
				}
				spec, ask, refusal := registeredLaunch(a, r.host, r.sf.allowRegistered)
				if !ask {
					continue
				}
				if refusal != "" {
					if refused[a.Name] != a.Version {
						refused[a.Name] = a.Version
						r.refuse(ctx, a, spec, refusal)
					}
					continue
				}
				known[a.Name] = true
				sup, err := supervisor.New(r.config(&supervisor.Fleet{Agents: []supervisor.Agent{spec}}))
				if err != nil {
					r.logger.Error("agent registered with a launch config that cannot run", "agent", a.Name, "err", err)
					continue
				}
				r.logger.Info("supervising an agent registered through the API", "agent", a.Name, "command", spec.Command)
				wg.Go(func() {
					if err := sup.Run(ctx); err != nil {
						r.logger.Error("supervisor of a registered agent failed", "agent", a.Name, "err", err)
					}
				})
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// refuse logs and records why registry record a was not launched.
func (r *fleetRunner) refuse(ctx context.Context, a vigiltype.Agent, spec supervisor.Agent, why string) {
	r.logger.Warn("registered agent not launched", "agent", a.Name, "command", spec.Command,
		"config_written_by", a.ConfigWrittenBy, "why", why)
	if r.events == nil {
		return
	}
	e := supervisor.Event{Agent: a.Name, Kind: vigiltype.EventLaunchFailure, Detail: map[string]any{
		"error": why, "refused": true, "command": spec.Command, "config_written_by": a.ConfigWrittenBy, "host": r.host,
	}}
	if err := r.events.RecordEvent(ctx, e); err != nil && ctx.Err() == nil {
		r.logger.Warn("cannot record why a registered agent was not launched", "agent", a.Name, "err", err)
	}
}

// fleetNames is the set of a fleet's agent names.
func fleetNames(fleet *supervisor.Fleet) map[string]bool {
	known := make(map[string]bool, len(fleet.Agents))
	for _, a := range fleet.Agents {
		known[a.Name] = true
	}
	return known
}

// hostname is this host's name as agents report it.
func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return "localhost"
	}
	return h
}
