package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// Stall detection defaults (DESIGN S4, seed 003).
const (
	// StallAfterDefault: a task running longer than this is stalled,
	// whatever its heartbeats say.
	StallAfterDefault = 30 * time.Minute
	// StallCheckDefault is how often the supervisor looks for stalls.
	StallCheckDefault = 60 * time.Second
	// StallKillBudgetDefault and StallKillWindowDefault: at most this many
	// stall kills per window across the fleet; past it stalls are recorded
	// as deferred, so one shared upstream hang does not take every agent
	// down at once.
	StallKillBudgetDefault = 5
	StallKillWindowDefault = 10 * time.Minute
)

// StallSource is where the supervisor reads its agents' stalled tasks and
// takes them back: the server's lease service, in-process or over HTTP.
type StallSource interface {
	// Stalled lists the running tasks held by instances of kind that
	// started more than after ago.
	Stalled(ctx context.Context, kind string, after time.Duration) ([]*vigiltype.Task, error)
	// ReclaimStalled takes a task back if it still runs at epoch
	// (compare-and-swap; vigiltype.ErrStaleEpoch when it moved on).
	ReclaimStalled(ctx context.Context, taskID, epoch int64, reason string) (*vigiltype.Task, error)
}

// StallConfig turns on stall detection (DESIGN S4). Zero durations take the
// defaults above.
type StallConfig struct {
	Source StallSource
	After  time.Duration
	Every  time.Duration
	// PendingApproval, when set, is asked before any stall kill: while it
	// reports true (an approval is pending somewhere, so work may be
	// waiting on a person) no agent is stall-killed. An error fails open:
	// nothing is killed.
	PendingApproval func(ctx context.Context) (bool, error)
	// Budget stall kills at most per Window, fleet-wide
	// (StallKillBudgetDefault per StallKillWindowDefault when zero).
	Budget int
	Window time.Duration
	// Holder looks up the instance holding a task. When set, only tasks
	// held by this supervisor's own current process of the agent count —
	// same host, and a process carrying the current generation's marker
	// (DESIGN S4: "tasks of the agent's current instance") — so a process
	// of the same kind elsewhere is never blamed. A failed lookup fails
	// open: the task does not count.
	Holder func(ctx context.Context, instanceID string) (*vigiltype.Process, error)
	// Host is this host's name as instances report it (os.Hostname when empty).
	Host string
}

func (c StallConfig) withDefaults() StallConfig {
	if c.After == 0 {
		c.After = StallAfterDefault
	}
	if c.Every == 0 {
		c.Every = StallCheckDefault
	}
	if c.Budget == 0 {
		c.Budget = StallKillBudgetDefault
	}
	if c.Window == 0 {
		c.Window = StallKillWindowDefault
	}
	if c.Host == "" {
		c.Host, _ = os.Hostname()
	}
	return c
}

// ours keeps the tasks held by agent i's current process on this host.
func (s *Supervisor) ours(ctx context.Context, i int, tasks []*vigiltype.Task) []*vigiltype.Task {
	if s.stall.Holder == nil {
		return tasks
	}
	s.mu.Lock()
	gen, leader := s.gens[i], s.status[i].PID
	s.mu.Unlock()
	var kept []*vigiltype.Task
	for _, t := range tasks {
		if t.LeaseOwner == nil {
			continue
		}
		p, err := s.stall.Holder(ctx, *t.LeaseOwner)
		if err != nil {
			s.logger.Warn("stall check: cannot look up the task's holder; not counting it", "task_id", t.TaskID, "err", err)
			continue
		}
		if p.Hostname == s.stall.Host && ownsProcess(p.PID, leader, gen) {
			kept = append(kept, t)
		}
	}
	return kept
}

// killBudget allows at most n kills in any window (a sliding log of the
// kills' times). A plain value: no clock, no goroutines.
type killBudget struct {
	n      int
	window time.Duration
	kills  []time.Time
}

// take reports whether a kill at now is within budget, and if so counts it.
func (b *killBudget) take(now time.Time) bool {
	kept := b.kills[:0]
	for _, k := range b.kills {
		if now.Sub(k) < b.window {
			kept = append(kept, k)
		}
	}
	b.kills = kept
	if len(b.kills) >= b.n {
		return false
	}
	b.kills = append(b.kills, now)
	return true
}

// PendingApprovalTimeoutDefault bounds one run of the pending-approval
// command; a command still running then is a read failure (fail open).
const PendingApprovalTimeoutDefault = 10 * time.Second

// PendingApprovalCommand returns a PendingApproval check that runs argv,
// killed after timeout (PendingApprovalTimeoutDefault when 0): exit 0 means
// an approval is pending, exit 1 that none is; anything else — another exit
// code (127: command not found), a signal, a command that cannot start or
// outlives the timeout — is a read failure, returned as an error, which
// fails open: no stall kill (DESIGN S4, issue #14).
func PendingApprovalCommand(argv []string, timeout time.Duration) func(ctx context.Context) (bool, error) {
	if timeout <= 0 {
		timeout = PendingApprovalTimeoutDefault
	}
	return func(ctx context.Context) (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.WaitDelay = time.Second // a grandchild holding its output open does not hold the check
		err := cmd.Run()
		var exit *exec.ExitError
		switch {
		case err == nil:
			return true, nil
		case ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
			return false, fmt.Errorf("pending-approval command %q: still running after %s", argv[0], timeout)
		case errors.As(err, &exit) && exit.Exited() && exit.ExitCode() == 1:
			return false, nil
		case errors.As(err, &exit) && exit.Exited():
			return false, fmt.Errorf("pending-approval command %q: exit status %d (0 = pending, 1 = not pending)", argv[0], exit.ExitCode())
		}
		return false, fmt.Errorf("pending-approval command %q: %w", argv[0], err)
	}
}

// ApprovalArgv is the argv that runs the pending-approval command line:
// its words, executed directly, when it is a plain command with arguments;
// `sh -c LINE` only when it needs a shell (quotes, pipes, redirections,
// variables, globs and the like), so a missing program is reported as such
// (exec's error) rather than as the shell's exit 127.
func ApprovalArgv(line string) []string {
	if strings.ContainsAny(line, shellChars) {
		return []string{"sh", "-c", line}
	}
	return strings.Fields(line)
}

// shellChars are the characters that make a command line need a shell.
const shellChars = "|&;<>()$`\\\"'*?[]#~=%{}!\n"

// stallLoop checks for stalls every StallConfig.Every until ctx ends.
func (s *Supervisor) stallLoop(ctx context.Context) {
	t := time.NewTicker(s.stall.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.checkStalls(ctx)
		}
	}
}

// checkStalls is one stall check (DESIGN S4): for each running agent with a
// task running past StallConfig.After, kill its process group (the
// supervise loop restarts it with backoff), record a stall_kill event, and
// take back every such task by compare-and-swap — a lost race leaves that
// task alone. Read failures fail open: not stalled.
func (s *Supervisor) checkStalls(ctx context.Context) {
	stalled := map[int][]*vigiltype.Task{}
	for i, st := range s.Status() {
		if !st.Running {
			continue
		}
		tasks, err := s.stall.Source.Stalled(ctx, s.agents[i].Name, s.stall.After)
		if err != nil {
			s.logger.Warn("stall check: cannot read tasks; treating as not stalled", "agent", s.agents[i].Name, "err", err)
			continue
		}
		if tasks = s.ours(ctx, i, tasks); len(tasks) > 0 {
			stalled[i] = tasks
		}
	}
	if len(stalled) == 0 {
		s.testSignals.stallChecked.signal(0)
		return
	}
	if s.stall.PendingApproval != nil {
		pending, err := s.stall.PendingApproval(ctx)
		if err != nil {
			s.approvalFailed()
			s.logger.Warn("stall check: pending-approval check failed; failing open, killing nothing", "err", err)
			s.testSignals.stallChecked.signal(0)
			return
		}
		if pending {
			// Said once per pending spell at Info, then at Debug: the check
			// runs every --stall-check.
			level := slog.LevelDebug
			if !s.approvalPending {
				level = slog.LevelInfo
			}
			s.approvalPending = true
			s.logger.Log(ctx, level, "stall check: an approval is pending; killing nothing", "stalled_agents", len(stalled))
			s.testSignals.stallChecked.signal(0)
			return
		}
		s.approvalPending = false
	}
	killed := 0
	for i := range s.agents {
		tasks, ok := stalled[i]
		if !ok {
			delete(s.stallDeferred, i)
			continue
		}
		if !s.stallBudget.take(time.Now()) {
			s.deferStall(i, tasks)
			continue
		}
		delete(s.stallDeferred, i)
		s.stallKill(ctx, i, tasks)
		killed++
	}
	s.testSignals.stallChecked.signal(killed)
}

// deferStall records, once per stall episode, that agent i's stall was not
// killed because the fleet-wide budget is spent.
func (s *Supervisor) deferStall(i int, tasks []*vigiltype.Task) {
	if s.stallDeferred[i] {
		return
	}
	s.stallDeferred[i] = true
	ids := make([]int64, len(tasks))
	for j, t := range tasks {
		ids[j] = t.TaskID
	}
	log := s.logger.With("agent", s.agents[i].Name)
	log.Warn("stall kill deferred: the fleet-wide stall-kill budget is spent",
		"tasks", ids, "budget", s.stall.Budget, "window", s.stall.Window)
	s.report(log, Event{Agent: s.agents[i].Name, Kind: vigiltype.EventStallKill, Launched: s.launched(i), Detail: map[string]any{
		"deferred": true, "task_ids": ids, "budget": s.stall.Budget, "window_s": s.stall.Window.Seconds(),
	}})
}

// stallKill kills agent i's current process for tasks, records the event
// and takes the tasks back.
func (s *Supervisor) stallKill(ctx context.Context, i int, tasks []*vigiltype.Task) {
	a := s.agents[i]
	log := s.logger.With("agent", a.Name)
	ids := make([]int64, len(tasks))
	for j, t := range tasks {
		ids[j] = t.TaskID
	}
	oldest := time.Since(*tasks[0].StartedAt).Round(time.Second)
	log.Warn("stall kill: tasks running past stall_after", "tasks", ids, "oldest_running", oldest, "stall_after", s.stall.After)
	gone := make(chan struct{})
	if !s.requestKill(i, kill{reason: "stall kill", done: gone, immediate: true}) {
		log.Info("stall kill: a kill is already on its way; taking the tasks back on a later check")
		return
	}
	s.stallKilled(a.Name)
	s.report(log, Event{Agent: a.Name, Kind: vigiltype.EventStallKill, Launched: s.launched(i), Detail: map[string]any{
		"task_ids": ids, "stall_after_s": s.stall.After.Seconds(), "oldest_running_s": oldest.Seconds(),
	}})
	// The tasks go back only once the process is gone: until then it may
	// still be working on them.
	wait := time.NewTimer(s.stopGrace + killReapTimeout + time.Second)
	defer wait.Stop()
	select {
	case <-gone:
	case <-wait.C: // it had exited by itself before the kill was taken up
	case <-ctx.Done():
		return
	}
	for _, t := range tasks {
		reason := fmt.Sprintf("stall kill: running since %s, past stall_after %s; the supervisor killed agent %s",
			t.StartedAt.Format(time.RFC3339), s.stall.After, a.Name)
		_, err := s.stall.Source.ReclaimStalled(ctx, t.TaskID, t.LeaseEpoch, reason)
		switch {
		case errors.Is(err, vigiltype.ErrStaleEpoch):
			log.Info("stall kill: task moved on meanwhile; left as it is", "task_id", t.TaskID)
		case err != nil:
			log.Error("stall kill: cannot take the task back", "task_id", t.TaskID, "err", err)
		default:
			log.Info("stall kill: task back to scheduled", "task_id", t.TaskID)
		}
	}
}
