package supervisor

import (
	"syscall"
	"time"
)

// testSignal lets a test wait for something that happens inside the
// supervisor's goroutines instead of sleeping (after river's
// rivershared/testsignal). It does nothing until a test calls init.
type testSignal[T any] struct {
	ch chan T
}

// testSignalBuffer is how many unread signals are kept; later ones are
// dropped rather than blocking the supervisor.
const testSignalBuffer = 100

func (s *testSignal[T]) init() { s.ch = make(chan T, testSignalBuffer) }

func (s *testSignal[T]) signal(v T) {
	if s.ch == nil {
		return
	}
	select {
	case s.ch <- v:
	default:
	}
}

// testSignals are the supervisor's observable steps. A test initialises them
// between New and Run.
type testSignals struct {
	started          testSignal[int]           // pid of a started process
	launchFailed     testSignal[error]         // a launch failure
	exited           testSignal[string]        // exit description, stops included
	restartScheduled testSignal[time.Duration] // the backoff delay chosen
	orphanReaped     testSignal[reapedOrphan]  // an adopted descendant reaped
	flapping         testSignal[int]           // a flapping episode began after this many exits
	stallChecked     testSignal[int]           // a stall check ended, killing this many agents
	heldStopped      testSignal[string]        // an agent is held down by its desired state
	desiredApplied   testSignal[struct{}]      // a desired-state poll ended
	orphansKilled    testSignal[int]           // processes left by a dead supervisor were stopped
	startupChecked   testSignal[bool]          // a startup check found the agent registered (or not)
}

// reapedOrphan is an adopted descendant the reaper reaped, and its status.
type reapedOrphan struct {
	pid int
	ws  syscall.WaitStatus
}

func (s *testSignals) init() {
	s.started.init()
	s.launchFailed.init()
	s.exited.init()
	s.restartScheduled.init()
	s.stallChecked.init()
	s.heldStopped.init()
	s.desiredApplied.init()
	s.orphansKilled.init()
	s.startupChecked.init()
	s.orphanReaped.init()
	s.flapping.init()
}
