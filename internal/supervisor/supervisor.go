package supervisor

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// StopGraceDefault is how long a stopping agent's process group has between
// SIGTERM and SIGKILL: 30s, as Kubernetes' terminationGracePeriodSeconds
// (DESIGN S3 leaves the value open). It is longer than the Go SDK's drain
// grace (vigilclient.DrainGraceDefault, 20s), so an agent on the SDK can
// finish or release its task and record its exit before the kill.
const StopGraceDefault = 30 * time.Second

// killReapTimeout bounds the wait, after SIGKILL, for the group's other
// processes to die. SIGKILL cannot be caught, so only a process stuck in the
// kernel (uninterruptible sleep) can outlast it.
const killReapTimeout = 5 * time.Second

// groupPollInterval is how often a stopping group is checked for survivors
// once its leader has exited: those are not our children, so no wait(2)
// tells us when they are gone.
const groupPollInterval = 20 * time.Millisecond

// Config configures a Supervisor. Zero fields take the defaults given.
type Config struct {
	// Agents to launch and keep running, usually Fleet.Agents. Required,
	// validated as a fleet file is.
	Agents []Agent
	// ExtraEnv is added to every child's environment, after the supervisor's
	// own and before VIGIL_KIND and the agent's Env (e.g. VIGIL_URL).
	// Optional; may not set VIGIL_KIND.
	ExtraEnv map[string]string
	// Backoff decides restart delays (DESIGN S2); zero fields default to
	// BackoffMinDefault (5s), FastFailureDefault (30s), BackoffMaxDefault
	// (300s) and JitterDefault (0.2). Each agent draws its jitter from its
	// own randomly seeded source.
	Backoff BackoffPolicy
	// Flapping says when an agent that keeps exiting is flapping: then one
	// EventFlapping event per episode goes to Events (zero fields: 5 exits
	// within 10 minutes, FlapExitsDefault and FlapWindowDefault).
	Flapping FlapPolicy
	// StopGrace is how long a stopping agent's process group has between
	// SIGTERM and SIGKILL (DESIGN S3). Default StopGraceDefault (30s).
	StopGrace time.Duration
	// Logger receives one record per start, exit, launch failure, scheduled
	// restart and stop. Default slog.Default().
	Logger *slog.Logger
	// Stdout and Stderr receive the children's output, line by line, each
	// line prefixed with "[<agent name>] ". Writes are serialised.
	// Default os.Stdout and os.Stderr.
	Stdout, Stderr io.Writer
	// LogDir, if set, also writes each agent's stdout and stderr to
	// <LogDir>/<agent>.log (see LogFile), one "<UTC time> <stdout|stderr>
	// <line>" per line, rotated at LogMaxBytes keeping LogKeep old files.
	// Run creates the directory. Optional; empty means no log files.
	LogDir string
	// LogMaxBytes is the size at which a log file is rotated. Default
	// LogMaxBytesDefault (10 MiB).
	LogMaxBytes int64
	// LogKeep is how many rotated log files are kept per agent. Default
	// LogKeepDefault (3).
	LogKeep int
	// Events receives a process event for every unexpected exit and launch
	// failure (DESIGN E1); none for the stops of the supervisor's own
	// shutdown (S3). Optional. Recording is best effort: a failure is logged.
	Events EventSink
	// Stall, when set with a Source, turns on stall detection (DESIGN S4).
	Stall *StallConfig
	// Desired, when set, is polled every DesiredPoll (DesiredPollDefault)
	// for what operators want of each agent: a stopped agent is stopped and
	// not restarted until it is active again; a planned stop newer than the
	// running process restarts it at once (vigil stop / start / restart).
	Desired     DesiredSource
	DesiredPoll time.Duration
	// Registered lists the process instances of agent's kind that were
	// registered with the server within the last `within`, on the server's
	// clock, for the agents with a StartupTimeout. The supervisor passes
	// the time since the launch, measured on its own monotonic clock, and
	// then looks among them for one of the launched process (its pid, or a
	// descendant's, on Host): it never compares its clock with the
	// server's (DESIGN L10). Without it startup timeouts are not checked.
	Registered func(ctx context.Context, agent string, within time.Duration) ([]*vigiltype.Process, error)
	// Host is this host's name as instances report it, for the startup
	// check (os.Hostname when empty).
	Host string
	// Restarted and StallKilled, when set, are told (for metrics) of each
	// relaunch of an agent after its process ended or failed to launch —
	// never its first launch — and of each stall kill. They must not block.
	Restarted   func(agent string)
	StallKilled func(agent string)
	// ApprovalCheckFailed, when set, is told of each pending-approval
	// check that failed (and so failed open: no stall kill). Must not block.
	ApprovalCheckFailed func()
}

// EventSink records the supervisor's process events.
type EventSink interface {
	RecordEvent(ctx context.Context, e Event) error
}

// Event is one process event as the supervisor sees it.
type Event struct {
	Agent       string
	Kind        vigiltype.EventKind
	ExitCode    *int   // nil when killed by a signal, or never started
	Signal      string // e.g. "killed"; "" unless killed by a signal
	RunDuration time.Duration
	StderrTail  string // the child's last stderr lines (stderrTailLines)
	Detail      map[string]any
	// Launched is when the process the event is about was launched (or,
	// for a launch failure, tried), read from this host's clock with its
	// monotonic reading. A sink sends its age, time.Since(Launched), and
	// the server places the launch on its own clock: a planned stop covers
	// only the processes launched before it (DESIGN E2, L10). Zero: not
	// known.
	Launched time.Time
}

// eventTimeout bounds one event write, so that a slow server never holds up
// a restart.
const eventTimeout = 5 * time.Second

// AgentStatus is a point-in-time view of one supervised agent.
type AgentStatus struct {
	// Name is the agent's name.
	Name string `json:"name"`
	// PID is the current process's pid while Running, else the last one's;
	// 0 if no process was ever started.
	PID int `json:"pid"`
	// Running is true from a successful start until the process exits.
	Running bool `json:"running"`
	// StartedAt is when the current (or last) process was started.
	StartedAt time.Time `json:"started_at,omitzero"`
	// Restarts counts launch attempts after the first, failed ones included.
	Restarts int `json:"restarts"`
	// LastExit describes how the last process ended, e.g. "exit status 1
	// after 2.5s", "signal: killed after 10s" or "launch failed: …"; empty
	// until the first exit.
	LastExit string `json:"last_exit,omitempty"`
}

// Supervisor launches each agent as a child in its own process group and
// restarts it after every exit (DESIGN S1–S3). Create it with New, run it
// with Run; Status may be called at any time from any goroutine.
type Supervisor struct {
	agents    []Agent
	extraEnv  map[string]string
	backoff   BackoffPolicy
	flapping  FlapPolicy
	stopGrace time.Duration
	logger    *slog.Logger
	stdout    io.Writer
	stderr    io.Writer
	events    EventSink
	// registered and host are Config.Registered and Config.Host (startup
	// timeouts).
	registered func(ctx context.Context, agent string, within time.Duration) ([]*vigiltype.Process, error)
	host       string
	// restarted and stallKilled are Config's metrics hooks; never nil.
	restarted, stallKilled func(agent string)
	approvalFailed         func()
	stall                  StallConfig // Source nil: no stall detection
	// stallBudget and stallDeferred belong to the stall loop's goroutine.
	stallBudget   *killBudget
	stallDeferred map[int]bool // agents whose current stall was recorded deferred
	// approvalPending: the last stall check found an approval pending.
	approvalPending bool
	kills           []chan kill   // per agent: kill the current process now
	desired         *desiredState // nil without Config.Desired

	logDir      string
	logMaxBytes int64
	logKeep     int
	logFiles    []*rotatingFile // per agent while Run runs; nil entries without LogDir

	// genPrefix starts every EnvGeneration value this supervisor sets:
	// "<pid>.<random>.", so that two supervisors never claim each other's
	// processes.
	genPrefix string
	// reaper reaps orphaned descendants adopted as subreaper (Linux).
	reaper *reaper
	// watcher is the one loop that waits for every leader's exit and every
	// quiet agent's first output (Linux, while Run runs); nil: a goroutine
	// per leader and per output stream does the waiting.
	watcher *fdWatcher
	// subreaper is set once Run made this process the child subreaper of
	// its descendants: a generation's processes then all descend from it.
	subreaper bool
	// reapInterval is how often the reaper looks for adopted orphans besides
	// on SIGCHLD: an orphan seen alive is reapable by pid when it dies.
	reapInterval time.Duration
	// seed seeds each agent's jitter source (with the agent's index).
	seed uint64

	ran atomic.Bool

	mu     sync.Mutex
	status []AgentStatus // same order as agents
	gens   []string      // each agent's current generation marker ("VIGIL_GENERATION=…")

	testSignals testSignals
}

// New validates cfg, fills its defaults and returns a Supervisor that has not
// started anything yet.
func New(cfg Config) (*Supervisor, error) {
	if err := groupSupport(); err != nil {
		return nil, fmt.Errorf("new supervisor: %w", err)
	}
	var errs []error
	if len(cfg.Agents) == 0 {
		errs = append(errs, errors.New("agents: must list at least one agent"))
	}
	errs = append(errs, validateAgents(cfg.Agents)...)
	for _, k := range sortedKeys(cfg.ExtraEnv) {
		if err := checkEnvVar(k, cfg.ExtraEnv[k]); err != nil {
			errs = append(errs, fmt.Errorf("ExtraEnv: %w", err))
		}
	}
	backoff := cfg.Backoff.withDefaults()
	if err := backoff.validate("Backoff"); err != nil {
		errs = append(errs, err)
	}
	flapping := cfg.Flapping.withDefaults()
	if err := flapping.validate("Flapping"); err != nil {
		errs = append(errs, err)
	}
	if cfg.LogMaxBytes < 0 {
		errs = append(errs, fmt.Errorf("LogMaxBytes: must not be negative, got %d", cfg.LogMaxBytes))
	}
	if cfg.LogKeep < 0 {
		errs = append(errs, fmt.Errorf("LogKeep: must not be negative, got %d", cfg.LogKeep))
	}
	if cfg.StopGrace < 0 {
		errs = append(errs, fmt.Errorf("StopGrace: must not be negative, got %s", cfg.StopGrace))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("supervisor config: %w", err)
	}

	agents := make([]Agent, len(cfg.Agents))
	status := make([]AgentStatus, len(cfg.Agents))
	for i, a := range cfg.Agents {
		agents[i] = Agent{Name: a.Name, Command: slices.Clone(a.Command), Env: maps.Clone(a.Env), Dir: a.Dir,
			StartupTimeout: a.StartupTimeout}
		status[i] = AgentStatus{Name: a.Name}
	}
	stdout, stderr := cfg.Stdout, cfg.Stderr
	if stdout == nil {
		stdout = os.Stdout
	}
	if stderr == nil {
		stderr = os.Stderr
	}
	kills := make([]chan kill, len(agents))
	for i := range kills {
		kills[i] = make(chan kill, 1)
	}
	var outMu sync.Mutex
	// "<pid>-<start time>.<random>.": the supervisor that set a marker can
	// be told from a later one, and from an unrelated process that reused
	// its pid (see killOrphanedGenerations).
	genPrefix := fmt.Sprintf("%d-%d.%s.", os.Getpid(), selfStartTime(), crand.Text()[:12])
	sup := &Supervisor{
		agents:     agents,
		extraEnv:   maps.Clone(cfg.ExtraEnv),
		backoff:    backoff,
		flapping:   flapping,
		stopGrace:  cmp.Or(cfg.StopGrace, StopGraceDefault),
		logger:     cmp.Or(cfg.Logger, slog.Default()),
		stdout:     syncWriter{mu: &outMu, w: stdout},
		stderr:     syncWriter{mu: &outMu, w: stderr},
		events:     cfg.Events,
		registered: cfg.Registered,
		host:       cfg.Host,
		status:     status,
		gens:       make([]string, len(agents)),
		kills:      kills,

		logDir:      cfg.LogDir,
		logMaxBytes: cmp.Or(cfg.LogMaxBytes, LogMaxBytesDefault),
		logKeep:     cmp.Or(cfg.LogKeep, LogKeepDefault),
		logFiles:    make([]*rotatingFile, len(agents)),

		genPrefix:    genPrefix,
		reapInterval: reapIntervalDefault,
		seed:         rand.Uint64(),
	}
	if sup.host == "" {
		sup.host, _ = os.Hostname()
	}
	sup.restarted, sup.stallKilled = orNop(cfg.Restarted), orNop(cfg.StallKilled)
	sup.approvalFailed = cfg.ApprovalCheckFailed
	if sup.approvalFailed == nil {
		sup.approvalFailed = func() {}
	}
	if cfg.Stall != nil && cfg.Stall.Source != nil {
		sup.stall = cfg.Stall.withDefaults()
		sup.stallBudget = &killBudget{n: sup.stall.Budget, window: sup.stall.Window}
		sup.stallDeferred = map[int]bool{}
	}
	if cfg.Desired != nil {
		sup.desired = newDesiredState(cfg.Desired, cmp.Or(cfg.DesiredPoll, DesiredPollDefault), len(agents))
	}
	sup.reaper = newReaper(EnvGeneration+"="+genPrefix, func(pid int, ws syscall.WaitStatus) {
		sup.logger.Debug("reaped orphaned agent descendant", "pid", pid, "status", ws)
		sup.testSignals.orphanReaped.signal(reapedOrphan{pid: pid, ws: ws})
	})
	return sup, nil
}

// orNop is f, or a func that does nothing when f is nil.
func orNop(f func(agent string)) func(agent string) {
	if f == nil {
		return func(string) {}
	}
	return f
}

// Run launches every agent and keeps each running until ctx is cancelled:
// every exit, code 0 included, and every launch failure is followed by a
// restart after the BackoffPolicy delay.
//
// When ctx is cancelled, Run sends SIGTERM to each child's process group,
// waits up to StopGrace for the group to exit, SIGKILLs what is left, waits
// for the children to be reaped, and returns nil. Run may be called once.
func (s *Supervisor) Run(ctx context.Context) error {
	if !s.ran.CompareAndSwap(false, true) {
		return errors.New("supervisor: Run called more than once")
	}
	if err := s.openLogFiles(); err != nil {
		return err
	}
	defer s.closeLogFiles()
	s.logger.Info("supervisor starting", "agents", len(s.agents))
	if err := becomeSubreaper(); err != nil && containSupported {
		s.logger.Warn("cannot adopt orphaned descendants; containment is by process group only", "err", err)
	} else if err == nil {
		s.subreaper = true
	}
	if n := s.killOrphanedGenerations(ctx); n > 0 {
		s.testSignals.orphansKilled.signal(n)
	}
	if w, err := newFDWatcher(); err == nil {
		s.watcher = w
		defer w.stop() // after every agent is gone: no watch is left
	} else if !errors.Is(err, errors.ErrUnsupported) {
		s.logger.Warn("no event loop; waiting with a goroutine per agent", "err", err)
	}
	reapCtx, stopReaping := context.WithCancel(context.WithoutCancel(ctx))
	var reaperDone sync.WaitGroup
	reaperDone.Go(func() { s.reapLoop(reapCtx) })
	var wg sync.WaitGroup
	for i := range s.agents {
		wg.Go(func() { s.superviseAgent(ctx, i) })
	}
	if s.stall.Source != nil {
		wg.Go(func() { s.stallLoop(ctx) })
	}
	if s.desired != nil {
		wg.Go(func() { s.desiredLoop(ctx) })
	}
	wg.Wait()
	stopReaping()
	reaperDone.Wait()
	s.reaper.pass() // every generation is gone: reap what it left
	s.logger.Info("supervisor stopped", "agents", len(s.agents))
	return nil
}

// openLogFiles opens every agent's log file, if there is a LogDir.
func (s *Supervisor) openLogFiles() error {
	if s.logDir == "" {
		return nil
	}
	for i, a := range s.agents {
		path, err := LogFile(s.logDir, a.Name)
		if err == nil {
			s.logFiles[i], err = openRotatingFile(path, s.logMaxBytes, s.logKeep)
		}
		if err != nil {
			s.closeLogFiles()
			return fmt.Errorf("supervisor: agent %s: %w", a.Name, err)
		}
	}
	return nil
}

func (s *Supervisor) closeLogFiles() {
	for i, f := range s.logFiles {
		if f != nil {
			if err := f.Close(); err != nil {
				s.logger.Error("close agent log file", "agent", s.agents[i].Name, "err", err)
			}
			s.logFiles[i] = nil
		}
	}
}

// Status returns the state of every agent, in Config.Agents order.
func (s *Supervisor) Status() []AgentStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.status)
}

func (s *Supervisor) updateStatus(i int, f func(*AgentStatus)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.status[i])
}

// superviseAgent is agent i's start → run → backoff loop; it returns once ctx
// is cancelled and the agent's process group is gone.
func (s *Supervisor) superviseAgent(ctx context.Context, i int) {
	log := s.logger.With("agent", s.agents[i].Name)
	tracker := NewBackoffTracker(s.backoff, rand.New(rand.NewPCG(s.seed, uint64(i))))
	flap := NewFlapDetector(s.flapping)
	for attempt := 0; ctx.Err() == nil; attempt++ {
		if !s.waitActive(ctx, i, log) {
			return
		}
		if attempt > 0 {
			s.updateStatus(i, func(st *AgentStatus) { st.Restarts++ })
			s.restarted(s.agents[i].Name)
		}
		attempted := time.Now()
		runTime, launched, killed := s.runOnce(ctx, i, attempt, log)
		if ctx.Err() != nil {
			return
		}
		if killed.byOperator {
			continue // a stop waits above; a restart starts again now, without backoff
		}
		if !launched {
			runTime = 0 // a launch failure backs off like a fast failure
		}
		if starts, n := flap.Exit(time.Now()); starts {
			log.Warn("agent is flapping", "exits", n, "window", s.flapping.Window)
			s.report(log, Event{Agent: s.agents[i].Name, Kind: vigiltype.EventFlapping, Launched: attempted,
				Detail: map[string]any{"exits": n, "window_s": s.flapping.Window.Seconds()}})
			s.testSignals.flapping.signal(n)
		}
		delay := tracker.Next(runTime)
		log.Info("agent restart scheduled", "delay", delay)
		s.testSignals.restartScheduled.signal(delay)
		if !sleepCtx(ctx, delay) {
			return
		}
	}
}

// runOnce starts agent i and waits for its process group to be gone, either
// because the process exited or because ctx was cancelled. launched is false
// if the process could not be started; runTime is measured on the monotonic
// clock.
// killed is the kill request that ended the process, if one did.
func (s *Supervisor) runOnce(ctx context.Context, i, attempt int, log *slog.Logger) (runTime time.Duration, launched bool, killed kill) {
	a := s.agents[i]
	select {
	case <-s.kills[i]: // meant for the previous process, which is gone
	default:
	}
	killed = kill{}
	gen := EnvGeneration + "=" + s.genPrefix + a.Name + "." + strconv.Itoa(attempt)
	s.mu.Lock()
	s.gens[i] = gen
	s.mu.Unlock()
	cmd, pidfd, pipes, err := s.startAside(a, gen)
	if err != nil {
		log.Error("agent launch failed", "command", a.Command, "dir", a.Dir, "err", err)
		s.recordExit(i, "launch failed: "+err.Error())
		s.report(log, Event{Agent: a.Name, Kind: vigiltype.EventLaunchFailure, Launched: time.Now(),
			Detail: map[string]any{"error": err.Error(), "command": a.Command}})
		s.testSignals.launchFailed.signal(err)
		return 0, false, kill{}
	}
	started := time.Now()
	pid := cmd.Process.Pid // also the process group id
	log.Info("agent started", "pid", pid)
	s.updateStatus(i, func(st *AgentStatus) {
		st.PID, st.Running, st.StartedAt = pid, true, started
	})
	s.testSignals.started.signal(pid)
	// Copy output only now, so that a line from the child is never seen
	// before Status and the log show the child running.
	tail := newLineTail(stderrTailLines, a.Name)
	pipes[1].w = teeWriter{pipes[1].w, tail}
	if f := s.logFiles[i]; f != nil {
		prefix := len("[" + a.Name + "] ")
		pipes[0].w = teeWriter{pipes[0].w, logLineWriter{file: f, stream: "stdout", prefix: prefix, now: time.Now}}
		pipes[1].w = append(pipes[1].w.(teeWriter), logLineWriter{file: f, stream: "stderr", prefix: prefix, now: time.Now})
	}
	out := startOutputCopy(a.Name, s.watcher, pipes...)

	waited := make(chan struct{})
	reapLeader := func() {
		_ = cmd.Wait() // the outcome is in cmd.ProcessState
		s.reaper.leaderWaited(pid)
		close(waited)
	}
	s.waitExit(pidfd, reapLeader)
	if a.StartupTimeout > 0 && s.registered != nil {
		stopCheck := s.watchStartup(ctx, i, started, pid, gen, waited)
		defer stopCheck()
	}

	// Wait for the exit, a kill or the end; a kill meant for an earlier
	// process is dropped.
	for {
		select {
		case <-waited:
			runTime = time.Since(started)
			s.recordExit(i, logExit(log, slog.LevelWarn, "agent exited", pid, cmd.ProcessState, runTime))
			// The leader is gone; anything it left, in its group or escaped
			// from it, would be orphaned by the restart, so it goes too. One
			// scan of /proc looks for it and, when there is none, also reaps
			// what the generation left (exitPass).
			if groupRunning(pid) || len(s.reaper.exitPass(gen, pid, s.subreaper)) > 0 {
				log.Warn("agent left processes in its group; stopping them", "pgid", pid)
				s.stopGeneration(log, pid, gen, waited)
				s.reaper.pass()
			}
			out.finish(outputDrainTimeout)
			s.report(log, exitEvent(a.Name, cmd.ProcessState, started, runTime, tail.String()))
			s.testSignals.exited.signal(s.Status()[i].LastExit)
			return runTime, true, kill{}
		case killed = <-s.kills[i]:
			if killed.pid != 0 && killed.pid != pid {
				// Meant for an earlier process of this agent, which is gone
				// (a desired-state poll that read the status before the
				// restart): not for this one.
				if killed.done != nil {
					close(killed.done)
				}
				killed = kill{}
				continue
			}
			// Killed on purpose: a stall kill (its own event says why), or an
			// operator's stop or restart (an exit event, which their planned
			// stop marks suppressed).
			if killed.immediate {
				s.stopGenerationWithin(log, pid, gen, waited, 0)
			} else {
				s.stopGeneration(log, pid, gen, waited)
			}
			s.reaper.pass()
			if killed.done != nil {
				close(killed.done)
			}
			runTime = time.Since(started)
			s.recordExit(i, killed.reason+": "+logExit(log, slog.LevelWarn, "agent killed: "+killed.reason, pid, cmd.ProcessState, runTime))
			if killed.reportExit {
				out.finish(outputDrainTimeout)
				s.report(log, exitEvent(a.Name, cmd.ProcessState, started, runTime, tail.String()))
				s.testSignals.exited.signal(s.Status()[i].LastExit)
				return runTime, true, killed
			}
		case <-ctx.Done():
			s.stopGeneration(log, pid, gen, waited)
			s.reaper.pass()
			runTime = time.Since(started)
			s.recordExit(i, logExit(log, slog.LevelInfo, "agent stopped", pid, cmd.ProcessState, runTime))
		}
		break
	}
	out.finish(outputDrainTimeout)
	s.testSignals.exited.signal(s.Status()[i].LastExit)
	return runTime, true, killed
}

// waitExit calls reapLeader, on a goroutine of its own, once the leader
// behind pidfd has exited, and closes pidfd. The waiting is done by the
// watcher's loop when there is one (no goroutine, no thread), else by a
// goroutine parked on the pidfd (no thread), else by cmd.Wait itself.
func (s *Supervisor) waitExit(pidfd int, reapLeader func()) {
	if s.watcher != nil && pidfd >= 0 {
		_, err := s.watcher.watch(pidfd, func() {
			reapLeader()
			closePidfd(pidfd)
		})
		if err == nil {
			return
		}
	}
	go func() {
		parkUntilExited(pidfd) // closes pidfd
		reapLeader()
	}()
}

// report records e with the event sink, if there is one.
func (s *Supervisor) report(log *slog.Logger, e Event) {
	if s.events == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), eventTimeout)
	defer cancel()
	if err := s.events.RecordEvent(ctx, e); err != nil {
		log.Error("record process event", "kind", e.Kind, "err", err)
	}
}

// exitEvent describes the exit of the process launched at launched: the
// code, or the signal that killed it.
func exitEvent(agent string, state *os.ProcessState, launched time.Time, runTime time.Duration, stderrTail string) Event {
	e := Event{Agent: agent, Kind: vigiltype.EventExit, RunDuration: runTime, StderrTail: stderrTail, Launched: launched}
	if state == nil {
		return e
	}
	if sig, ok := exitSignal(state); ok {
		e.Signal = sig
	} else {
		code := state.ExitCode()
		e.ExitCode = &code
	}
	return e
}

// launched is when agent i's current (or last) process was launched.
func (s *Supervisor) launched(i int) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status[i].StartedAt
}

// recordExit marks agent i not running, desc describing how it ended.
func (s *Supervisor) recordExit(i int, desc string) {
	s.updateStatus(i, func(st *AgentStatus) {
		st.Running = false
		st.LastExit = desc
	})
}

// start launches agent a in a new process group, with gen (the generation
// marker, EnvGeneration=…) last in its environment. The returned pipes carry
// its stdout and stderr, paired with the supervisor's writers; pidfd is a
// pidfd of the process for parkUntilExited, or -1.
func (s *Supervisor) start(a Agent, gen string) (cmd *exec.Cmd, pidfd int, pipes []outputPair, err error) {
	cmd = exec.Command(a.Command[0], a.Command[1:]...)
	cmd.Dir = a.Dir
	cmd.Env = append(s.childEnv(a), gen)
	cmd.SysProcAttr = groupSysProcAttr()
	fd := pidfdAttr(cmd.SysProcAttr)
	// Own pipes rather than io.Writers: exec would copy from a goroutine that
	// Wait joins, and Wait would then block on any grandchild that still
	// holds the pipe.
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, -1, nil, fmt.Errorf("stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		_, _ = outR.Close(), outW.Close()
		return nil, -1, nil, fmt.Errorf("stderr pipe: %w", err)
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	err = s.reaper.startLeader(func() (int, error) {
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	})
	// The child has its own copies; ours would keep the pipes open forever.
	_, _ = outW.Close(), errW.Close()
	// Nor is the environment needed any more: drop it rather than keep a
	// copy per running agent.
	cmd.Env = nil
	if err != nil {
		_, _ = outR.Close(), errR.Close()
		return nil, -1, nil, err
	}
	return cmd, *fd, []outputPair{{outR, s.stdout}, {errR, s.stderr}}, nil
}

// startAside is start on a goroutine of its own. os/exec's call chain is
// deep, and the stack it grows would otherwise stay with the agent's
// goroutine for as long as the agent runs (issue #6: memory per child).
func (s *Supervisor) startAside(a Agent, gen string) (*exec.Cmd, int, []outputPair, error) {
	type started struct {
		cmd   *exec.Cmd
		pidfd int
		pipes []outputPair
		err   error
	}
	ch := make(chan started, 1)
	go func() {
		var r started
		r.cmd, r.pidfd, r.pipes, r.err = s.start(a, gen)
		ch <- r
	}()
	r := <-ch
	return r.cmd, r.pidfd, r.pipes, r.err
}

// childEnv is os.Environ() + ExtraEnv + VIGIL_KIND=<name> + the agent's Env;
// exec keeps the last value of a repeated name.
func (s *Supervisor) childEnv(a Agent) []string {
	env := os.Environ()
	for _, k := range sortedKeys(s.extraEnv) {
		env = append(env, k+"="+s.extraEnv[k])
	}
	env = append(env, EnvKind+"="+a.Name)
	for _, k := range sortedKeys(a.Env) {
		env = append(env, k+"="+a.Env[k])
	}
	return env
}

// stopGeneration stops one generation of an agent (DESIGN S3): its process
// group pgid and every process carrying its marker gen, wherever it is
// (setsid, double fork). SIGTERM; up to StopGrace for the leader to be
// reaped (waited closed) and the rest to exit; then SIGKILL, repeated for
// any process the generation still forks. It returns once the leader is
// reaped and no process of the generation is running.
func (s *Supervisor) stopGeneration(log *slog.Logger, pgid int, gen string, waited <-chan struct{}) {
	s.stopGenerationWithin(log, pgid, gen, waited, s.stopGrace)
}

// stopGenerationWithin is stopGeneration with its own grace; 0 sends
// SIGKILL at once (a stalled agent gets no time to drain: it is wedged, and
// its tasks are taken back once it is gone).
func (s *Supervisor) stopGenerationWithin(log *slog.Logger, pgid int, gen string, waited <-chan struct{}, stopGrace time.Duration) {
	if stopGrace > 0 {
		if err := terminateGroup(pgid); err != nil {
			log.Error("stop agent", "pgid", pgid, "err", err)
		}
		if err := signalPIDs(s.generationPIDs(pgid, gen), syscall.SIGTERM); err != nil {
			log.Error("stop agent's descendants", "pgid", pgid, "err", err)
		}
		grace := time.NewTimer(stopGrace)
		defer grace.Stop()
		if s.waitGenerationGone(pgid, gen, waited, grace.C, nil) {
			return
		}
		log.Warn("agent did not stop within grace; sending SIGKILL", "pgid", pgid, "grace", stopGrace)
	}
	kill := func() {
		if err := killGroup(pgid); err != nil {
			log.Error("kill agent", "pgid", pgid, "err", err)
		}
		if err := signalPIDs(s.generationPIDs(pgid, gen), syscall.SIGKILL); err != nil {
			log.Error("kill agent's descendants", "pgid", pgid, "err", err)
		}
	}
	kill()
	<-waited // SIGKILL cannot be ignored: the leader dies and Wait returns
	bound := time.NewTimer(killReapTimeout)
	defer bound.Stop()
	if !s.waitGenerationGone(pgid, gen, waited, bound.C, kill) {
		log.Error("processes of the agent still running after SIGKILL", "pgid", pgid, "waited", killReapTimeout)
	}
}

// generationRunning reports whether a process of group pgid, or one
// carrying the generation marker gen, is running.
func (s *Supervisor) generationRunning(pgid int, gen string) bool {
	return groupRunning(pgid) || len(s.generationPIDs(pgid, gen)) > 0
}

// generationPIDs lists the live processes carrying marker gen (the
// generation led by pgid), and tells the reaper about them, so that it
// reaps them once they die even if its own scans never saw them alive.
// As a subreaper, only its own descendants may carry the marker (genScope).
func (s *Supervisor) generationPIDs(pgid int, gen string) []int {
	var scope *genScope
	if s.subreaper {
		scope = &genScope{self: os.Getpid(), leader: pgid, others: s.reaper.otherLeaders(pgid)}
	}
	pids := generationPIDs(gen, scope)
	s.reaper.note(pids)
	return pids
}

// waitGenerationGone waits for the leader to be reaped (waited closed) and
// then for the generation (group pgid, marker gen) to have no running
// process, calling each (if set) on every check that finds one. It returns
// false if deadline fires first.
func (s *Supervisor) waitGenerationGone(pgid int, gen string, waited <-chan struct{}, deadline <-chan time.Time, each func()) bool {
	select {
	case <-waited:
	case <-deadline:
		return false
	}
	if !s.generationRunning(pgid, gen) {
		return true
	}
	tick := time.NewTicker(groupPollInterval)
	defer tick.Stop()
	for {
		if each != nil {
			each()
		}
		select {
		case <-tick.C:
			if !s.generationRunning(pgid, gen) {
				return true
			}
		case <-deadline:
			return false
		}
	}
}

// logExit logs how a process ended — exit code or signal, and run time —
// and returns the same as a one-line description for AgentStatus.LastExit.
func logExit(log *slog.Logger, level slog.Level, msg string, pid int, state *os.ProcessState, runTime time.Duration) string {
	rt := runTime.Round(time.Millisecond)
	attrs := []slog.Attr{slog.Int("pid", pid)}
	desc := fmt.Sprintf("unknown exit after %s", rt)
	if state != nil {
		desc = fmt.Sprintf("%s after %s", state, rt)
		if sig, ok := exitSignal(state); ok {
			attrs = append(attrs, slog.String("signal", sig))
		} else {
			attrs = append(attrs, slog.Int("code", state.ExitCode()))
		}
	}
	attrs = append(attrs, slog.Duration("run_time", rt))
	log.LogAttrs(context.Background(), level, msg, attrs...)
	return desc
}

// sleepCtx waits for d or for ctx to be cancelled; it reports whether the
// full delay passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func sortedKeys(m map[string]string) []string {
	return slices.Sorted(maps.Keys(m))
}
