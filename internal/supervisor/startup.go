package supervisor

import (
	"context"
	"time"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// registrationSlack widens the startup check's window, the time since the
// launch, by the network delay between measuring it here and the server
// applying it to its own clock. It is not for clock skew: no clock is
// compared with another (DESIGN L10).
const registrationSlack = time.Second

// watchStartup checks, once agent i's StartupTimeout after the launch at
// started (a monotonic reading) of leader pid with generation marker gen,
// that the process registered an instance: the server lists the agent's
// instances registered within the time since the launch (a duration on
// this host's monotonic clock, applied by the server to its own), and one
// of them must be this host's and belong to the launched process (the
// leader, or a descendant in its process group or carrying gen: the program
// a wrapper such as `go run` or `sh -c` starts). If none does, it records a startup_timeout event and asks
// runOnce to kill the process (the supervise loop then restarts it with
// backoff). A failed check fails open: nothing is killed. The returned
// func stops the watch.
func (s *Supervisor) watchStartup(ctx context.Context, i int, started time.Time, pid int, gen string, exited <-chan struct{}) func() {
	a := s.agents[i]
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTimer(a.StartupTimeout)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return
		case <-exited:
			return
		case <-t.C:
		}
		log := s.logger.With("agent", a.Name)
		procs, err := s.registered(ctx, a.Name, time.Since(started)+registrationSlack)
		ok := false
		for _, p := range procs {
			if p.Hostname == s.host && (ownsProcess(p.PID, pid, gen) || inGroup(p.PID, pid)) {
				ok = true
				break
			}
		}
		switch {
		case err != nil:
			log.Warn("startup check failed; leaving the agent running", "err", err)
		case ok:
			log.Debug("agent registered within its startup timeout", "pid", pid)
			s.testSignals.startupChecked.signal(true)
		default:
			log.Warn("agent did not register within its startup timeout; killing it", "startup_timeout", a.StartupTimeout, "pid", pid)
			s.report(log, Event{Agent: a.Name, Kind: vigiltype.EventStartupTimeout, Launched: started,
				Detail: map[string]any{"startup_timeout_s": a.StartupTimeout.Seconds()}})
			s.requestKill(i, kill{reason: "startup timeout", pid: pid})
			s.testSignals.startupChecked.signal(false)
		}
	}()
	return func() { cancel(); <-done }
}
