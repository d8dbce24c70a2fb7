package supervisor

import (
	"context"
	"strings"
	"syscall"
	"time"
)

// EnvGeneration marks every process of one agent generation (one launch):
// the supervisor sets it in the leader's environment to
// "<supervisor pid>-<its start time>.<random>.<agent>.<attempt>", and
// descendants inherit it
// through fork, exec and setsid. On Linux the supervisor finds the
// generation's processes by this marker in /proc/<pid>/environ, so that a
// descendant that left the process group is stopped with it (DESIGN S3).
// A descendant that clears its environment before escaping the group is not
// found (see doc.go).
const EnvGeneration = "VIGIL_GENERATION"

// reapIntervalDefault is how often the reaper scans for adopted orphans
// besides on SIGCHLD.
const reapIntervalDefault = time.Second

// parseGeneration splits an EnvGeneration value into the supervisor that set
// it ("pid-starttime") and the agent's name.
func parseGeneration(gen string) (sup, agent string, ok bool) {
	sup, rest, ok := strings.Cut(gen, ".")
	if !ok {
		return "", "", false
	}
	_, rest, ok = strings.Cut(rest, ".") // the random part
	if !ok {
		return "", "", false
	}
	i := strings.LastIndexByte(rest, '.') // before the attempt number
	if i <= 0 {
		return "", "", false
	}
	return sup, rest[:i], true
}

// orphanPollInterval is how often a stopping orphaned generation is checked.
const orphanPollInterval = 20 * time.Millisecond

// killOrphanedGenerations stops what a previous supervisor of these agents
// left running when it died without stopping them (SIGKILL, a crash): on
// start, every live process whose generation marker names one of our agents
// and a supervisor that no longer runs gets SIGTERM, then SIGKILL after
// StopGrace. The old generation is killed, not adopted — the new one is
// launched fresh — so an agent never runs twice. It returns how many
// processes it found. Linux only (elsewhere it finds none).
func (s *Supervisor) killOrphanedGenerations(ctx context.Context) int {
	agents := make(map[string]bool, len(s.agents))
	for _, a := range s.agents {
		agents[a.Name] = true
	}
	pids := orphanedGenerationPIDs(agents, s.genPrefix)
	if len(pids) == 0 {
		return 0
	}
	s.logger.Warn("stopping agent processes left by a supervisor that is gone", "pids", pids)
	_ = signalPIDs(pids, syscall.SIGTERM)
	if !s.waitOrphansGone(ctx, agents, s.stopGrace) {
		left := orphanedGenerationPIDs(agents, s.genPrefix)
		s.logger.Warn("left-over agent processes did not stop within grace; sending SIGKILL", "pids", left)
		_ = signalPIDs(left, syscall.SIGKILL)
		if !s.waitOrphansGone(ctx, agents, killReapTimeout) {
			s.logger.Error("left-over agent processes still running after SIGKILL",
				"pids", orphanedGenerationPIDs(agents, s.genPrefix))
		}
	}
	return len(pids)
}

// waitOrphansGone polls until no orphaned generation process is left, for
// at most d.
func (s *Supervisor) waitOrphansGone(ctx context.Context, agents map[string]bool, d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(orphanPollInterval)
	defer tick.Stop()
	for len(orphanedGenerationPIDs(agents, s.genPrefix)) > 0 {
		select {
		case <-ctx.Done():
			return false
		case <-deadline.C:
			return false
		case <-tick.C:
		}
	}
	return true
}
