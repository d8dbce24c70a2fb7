//go:build !linux

package supervisor

import (
	"context"
	"errors"
	"syscall"
)

// Without /proc and PR_SET_CHILD_SUBREAPER, containment is by process group
// only: a descendant that leaves its agent's group (setsid) is not tracked.

func becomeSubreaper() error                 { return errors.ErrUnsupported }
func generationPIDs(string, *genScope) []int { return nil }
func signalPIDs([]int, syscall.Signal) error { return nil }

const containSupported = false

// reaper does nothing here: orphans go to init, which reaps them.
type reaper struct{}

func newReaper(string, func(int, syscall.WaitStatus)) *reaper { return &reaper{} }

func (r *reaper) startLeader(start func() (int, error)) error {
	_, err := start()
	return err
}
func (r *reaper) leaderWaited(int)                  {}
func (r *reaper) note([]int)                        {}
func (r *reaper) pass() int                         { return 0 }
func (r *reaper) otherLeaders(int) map[int]struct{} { return nil }
func (r *reaper) exitPass(string, int, bool) []int  { return nil }

// genScope is unused here: generationPIDs finds nothing.
type genScope struct {
	self, leader int
	others       map[int]struct{}
}

func (s *Supervisor) reapLoop(ctx context.Context) { <-ctx.Done() }

func orphanedGenerationPIDs(map[string]bool, string) []int { return nil }
func selfStartTime() uint64                                { return 0 }

// ownsProcess: off Linux only the agent's leader itself is known.
func ownsProcess(pid, leader int, _ string) bool { return pid == leader }
