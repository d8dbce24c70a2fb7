package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
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
}

func (c StallConfig) withDefaults() StallConfig {
	if c.After == 0 {
		c.After = StallAfterDefault
	}
	if c.Every == 0 {
		c.Every = StallCheckDefault
	}
	return c
}

// PendingApprovalCommand returns a PendingApproval check that runs argv:
// exit 0 means an approval is pending, any other exit code means none, and
// a command that cannot run (or is killed) is an error — which fails open.
func PendingApprovalCommand(argv []string) func(ctx context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		err := exec.CommandContext(ctx, argv[0], argv[1:]...).Run()
		var exit *exec.ExitError
		switch {
		case err == nil:
			return true, nil
		case errors.As(err, &exit) && exit.Exited():
			return false, nil
		}
		return false, fmt.Errorf("pending-approval command %q: %w", argv[0], err)
	}
}

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
		if len(tasks) > 0 {
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
			s.logger.Warn("stall check: pending-approval check failed; killing nothing", "err", err)
			s.testSignals.stallChecked.signal(0)
			return
		}
		if pending {
			s.logger.Info("stall check: an approval is pending; killing nothing", "stalled_agents", len(stalled))
			s.testSignals.stallChecked.signal(0)
			return
		}
	}
	for i, tasks := range stalled {
		s.stallKill(ctx, i, tasks)
	}
	s.testSignals.stallChecked.signal(len(stalled))
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
	select {
	case s.kills[i] <- kill{reason: "stall kill"}:
	default: // a kill is already on its way
	}
	s.report(log, Event{Agent: a.Name, Kind: vigiltype.EventStallKill, Detail: map[string]any{
		"task_ids": ids, "stall_after_s": s.stall.After.Seconds(), "oldest_running_s": oldest.Seconds(),
	}})
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
