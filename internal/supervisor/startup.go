package supervisor

import (
	"context"
	"time"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// registrationSlack allows for the supervisor's and the server's clocks
// when asking whether an instance registered since a launch.
const registrationSlack = 2 * time.Second

// watchStartup checks, once agent i's StartupTimeout after the launch at
// started, that the process registered an instance; if not, it records a
// startup_timeout event and asks runOnce to kill it (the supervise loop then
// restarts it with backoff). A failed check fails open: nothing is killed.
// The returned func stops the watch.
func (s *Supervisor) watchStartup(ctx context.Context, i int, started time.Time, exited <-chan struct{}) func() {
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
		ok, err := s.registered(ctx, a.Name, started.Add(-registrationSlack))
		switch {
		case err != nil:
			log.Warn("startup check failed; leaving the agent running", "err", err)
		case ok:
			s.testSignals.startupChecked.signal(true)
		default:
			log.Warn("agent did not register within its startup timeout; killing it", "startup_timeout", a.StartupTimeout)
			s.report(log, Event{Agent: a.Name, Kind: vigiltype.EventStartupTimeout,
				Detail: map[string]any{"startup_timeout_s": a.StartupTimeout.Seconds()}})
			s.requestKill(i, kill{reason: "startup timeout"})
			s.testSignals.startupChecked.signal(false)
		}
	}()
	return func() { cancel(); <-done }
}
