package supervisor

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// DesiredPollDefault is how often the supervisor asks what operators want
// of its agents (Config.Desired).
const DesiredPollDefault = 2 * time.Second

// DesiredSource tells the supervisor what operators want of each agent:
// the registry's declared status and planned stops (vigil stop, start,
// restart), in-process or over HTTP.
type DesiredSource interface {
	Desired(ctx context.Context, agent string) (Desired, error)
}

// Desired is what an operator wants of one agent.
type Desired struct {
	// Status is the declared status: stopped means stop the agent and keep
	// it down. An agent missing from the registry counts as active.
	Status vigiltype.AgentStatus
	// PlannedStop is the planned stop covering now, nil when none. A
	// running process launched before it was written is restarted, once
	// per marker (its exit is suppressed by the marker, DESIGN E2).
	PlannedStop *Marker
}

// Marker is a planned stop as the supervisor sees it. Nothing in it is a
// time of the server's clock to be compared with the supervisor's (DESIGN
// L10): an identity, and an age.
type Marker struct {
	// ID identifies the marker, opaquely: the same marker read twice has
	// the same ID, a new one (another vigil restart) another. It is never
	// compared with a time.
	ID string
	// Age is how long before the read the server wrote the marker,
	// measured by the server's clock. A duration: the supervisor places the
	// write on its own monotonic clock as (the poll's start − Age), earlier
	// than the true write by the network delay at most.
	Age time.Duration
}

// kill asks runOnce to end the current process now.
type kill struct {
	reason     string
	reportExit bool          // record an exit event (an operator's stop or restart: suppressed by its marker)
	byOperator bool          // no backoff and no flap count; a stop then waits for start
	done       chan struct{} // closed once the process and its generation are gone (optional)
	immediate  bool          // SIGKILL without the stop grace (a stall kill: the agent is wedged)
	pid        int           // the process it is meant for; 0: whichever runs
}

// desiredState is the last known desired status of every agent.
type desiredState struct {
	source  DesiredSource
	every   time.Duration
	mu      sync.Mutex
	stopped []bool
	wake    []chan struct{} // per agent: closed and replaced when it turns active
	// restartSeen is, per agent, the ID of the planned stop that asked for
	// a restart on the previous poll ("": none). `vigil stop` writes a
	// planned stop and then marks the agent stopped, two writes: a poll
	// between them must not read the stop as a restart. A restart
	// therefore acts when the same marker, on an agent still declared
	// active, is seen on two polls in a row (one poll interval later than
	// the first sight).
	restartSeen []string
	// restarted is, per agent, the ID of the last marker a restart was
	// asked for: a marker is acted on once.
	restarted []string
}

func newDesiredState(source DesiredSource, every time.Duration, agents int) *desiredState {
	d := &desiredState{source: source, every: every, stopped: make([]bool, agents), wake: make([]chan struct{}, agents),
		restartSeen: make([]string, agents), restarted: make([]string, agents)}
	for i := range d.wake {
		d.wake[i] = make(chan struct{})
	}
	return d
}

// set records agent i's desired status and wakes a waiting launch.
func (d *desiredState) set(i int, stopped bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped[i] && !stopped {
		close(d.wake[i])
		d.wake[i] = make(chan struct{})
	}
	d.stopped[i] = stopped
}

func (d *desiredState) get(i int) (stopped bool, wake <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stopped[i], d.wake[i]
}

// waitActive blocks while agent i is meant to be stopped; it reports false
// when ctx ends first.
func (s *Supervisor) waitActive(ctx context.Context, i int, log *slog.Logger) bool {
	if s.desired == nil {
		return true
	}
	logged := false
	for {
		stopped, wake := s.desired.get(i)
		if !stopped {
			if logged {
				log.Info("agent is active again; starting it")
			}
			return true
		}
		if !logged {
			log.Info("agent is stopped by an operator; not starting it until it is active")
			s.testSignals.heldStopped.signal(s.agents[i].Name)
			logged = true
		}
		select {
		case <-ctx.Done():
			return false
		case <-wake:
		}
	}
}

// desiredLoop polls the desired state of every agent until ctx ends.
func (s *Supervisor) desiredLoop(ctx context.Context) {
	t := time.NewTicker(s.desired.every)
	defer t.Stop()
	for {
		s.applyDesired(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// applyDesired reads each agent's desired state once and acts on it. A read
// failure changes nothing: a running agent keeps running.
func (s *Supervisor) applyDesired(ctx context.Context) {
	status := s.Status()
	for i, a := range s.agents {
		polled := time.Now() // before the read: the marker's write is placed no later than it was
		d, err := s.desired.source.Desired(ctx, a.Name)
		if errors.Is(err, vigiltype.ErrNotFound) {
			d, err = Desired{Status: vigiltype.AgentActive}, nil
		}
		if err != nil {
			if ctx.Err() == nil {
				s.logger.Warn("cannot read the desired state; leaving the agent as it is", "agent", a.Name, "err", err)
			}
			continue
		}
		stopped := d.Status == vigiltype.AgentStopped
		s.desired.set(i, stopped)
		st := status[i]
		restartWanted := st.Running && !stopped && restartAsked(d.PlannedStop, s.desired.restarted[i], st.StartedAt, polled)
		confirmed := restartWanted && s.desired.restartSeen[i] == d.PlannedStop.ID
		s.desired.restartSeen[i] = ""
		switch {
		case !st.Running:
		case stopped:
			s.requestKill(i, kill{reason: "stopped by an operator", reportExit: true, byOperator: true, pid: st.PID})
		case confirmed:
			s.desired.restarted[i] = d.PlannedStop.ID
			s.requestKill(i, kill{reason: "restarted by an operator", reportExit: true, byOperator: true, pid: st.PID})
		case restartWanted:
			s.desired.restartSeen[i] = d.PlannedStop.ID // act on the next poll if it still holds
		}
	}
	s.testSignals.desiredApplied.signal(struct{}{})
}

// restartAsked reports whether marker m asks for a restart of a process
// launched at launched (a reading of this host's monotonic clock), read by
// a poll that started at polled: m was not acted on yet (restarted is the
// ID of the last one that was), and the process was already running when
// m was written, placed on this clock as polled − m.Age. No time of the
// server's clock is compared with one of this host's (DESIGN L10).
func restartAsked(m *Marker, restarted string, launched, polled time.Time) bool {
	if m == nil || m.ID == restarted {
		return false
	}
	return launched.Before(polled.Add(-m.Age))
}

// requestKill asks agent i's current process to end, unless a kill is
// already on its way; it reports whether k was queued.
func (s *Supervisor) requestKill(i int, k kill) bool {
	select {
	case s.kills[i] <- k:
		return true
	default:
		return false
	}
}
