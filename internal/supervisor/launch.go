package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// Defaults of the rollback waits of RegisterAndLaunch (DESIGN R2).
const (
	// DefaultTerminateWait is how long the rollback waits for the process
	// to exit after SIGTERM before it sends SIGKILL.
	DefaultTerminateWait = 10 * time.Second
	// DefaultKillWait is how long the rollback waits for the process to
	// exit after SIGKILL before it gives up.
	DefaultKillWait = 10 * time.Second
)

// exitPoll bounds the interval at which the rollback checks whether the
// process has exited; checks start at exitPollMin and double up to it.
const (
	exitPollMin = 2 * time.Millisecond
	exitPoll    = 100 * time.Millisecond
)

// LaunchOption configures RegisterAndLaunch.
type LaunchOption func(*launchConfig)

type launchConfig struct {
	terminateWait, killWait time.Duration
}

// WithTerminateWait sets how long the rollback waits for the process to exit
// after SIGTERM before escalating to SIGKILL (DefaultTerminateWait). A
// duration <= 0 escalates at once.
func WithTerminateWait(d time.Duration) LaunchOption {
	return func(c *launchConfig) { c.terminateWait = d }
}

// WithKillWait sets how long the rollback waits for the process to exit after
// SIGKILL (DefaultKillWait). A duration <= 0 does not wait.
func WithKillWait(d time.Duration) LaunchOption {
	return func(c *launchConfig) { c.killWait = d }
}

// RegisterAndLaunch starts a process and records it, in that order (DESIGN
// R2), so that a failed launch never leaves a record of a process that does
// not exist:
//
//  1. If ctx is already done, it returns ctx.Err() and does nothing else.
//  2. It calls spawn. If spawn fails, its error is returned as is and
//     register is not called.
//  3. It calls register with ctx and the new process (to write the registry
//     record). If that succeeds, it returns the process and nil.
//  4. If register fails, it rolls the launch back, best effort: SIGTERM to
//     the process (on Linux, to its process group if it leads one, so that
//     the processes it started go too), a wait of up to TerminateWait for it
//     (and every process of that group) to exit, then SIGKILL the same way
//     and a wait of up to KillWait. It then returns the process and the
//     registration error, wrapped (errors.Is finds it). A process still
//     running after the kill wait is not reported; any other rollback
//     failure (a signal that could not be sent) is joined to the
//     registration error rather than masking it.
//
// The rollback is not cut short by ctx, which register may have failed
// because of: it is bounded by TerminateWait + KillWait instead.
//
// RegisterAndLaunch never waits (reaps) the process: its status stays the
// caller's, who, as its parent, must still Wait it (cmd.Wait) in every case,
// a rolled-back launch included, to release it. The caller may do so at any
// time, even concurrently with the rollback (a goroutine started by spawn).
// The rollback sees the process as exited once it is a zombie or reaped: it
// polls p.Signal(0), which fails with os.ErrProcessDone once the process was
// waited (and, on Linux, uses a pidfd, so never reaches a process that
// reused the pid), and, on Linux, the state in /proc/<pid>/stat. Elsewhere a
// zombie cannot be told from a running process, so the waits last until the
// caller has waited the process or the wait expires; on Windows, which has
// no SIGTERM, both steps use p.Kill.
//
// Like the seed's register_and_launch, this closes the common case, not
// every one: a process that survives SIGKILL (uninterruptible sleep) or a
// register that commits its write and then fails can still leave the
// registry and the process table disagreeing.
func RegisterAndLaunch(
	ctx context.Context,
	spawn func() (*os.Process, error),
	register func(ctx context.Context, p *os.Process) error,
	opts ...LaunchOption,
) (*os.Process, error) {
	cfg := launchConfig{terminateWait: DefaultTerminateWait, killWait: DefaultKillWait}
	for _, o := range opts {
		o(&cfg)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p, err := spawn()
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, errors.New("launch: spawn returned no process and no error")
	}
	pid := p.Pid // register might Release p, which resets p.Pid
	regErr := register(ctx, p)
	if regErr == nil {
		return p, nil
	}
	err = fmt.Errorf("register launched process %d: %w", pid, regErr)
	if rbErr := rollbackLaunch(p, cfg); rbErr != nil {
		err = errors.Join(err, fmt.Errorf("roll back launch of process %d: %w", pid, rbErr))
	}
	return p, err
}

// rollbackLaunch terminates p and waits for it to exit, escalating to
// SIGKILL after cfg.terminateWait. It reports signalling failures only; a
// process still running after cfg.killWait is not an error here.
func rollbackLaunch(p *os.Process, cfg launchConfig) error {
	if runtime.GOOS == "windows" {
		err := p.Kill()
		if errors.Is(err, os.ErrProcessDone) {
			return nil
		}
		return err
	}

	// Decided once, while p is known not to be reaped: its pid (the group
	// id) cannot be reused while the group has members.
	pgid := 0
	if st, ok := readLaunchProcStat(p.Pid); ok && st.pgid == p.Pid && processAlive(p) {
		pgid = p.Pid
	}

	var errs []error
	if err := signalLaunched(p, pgid, syscall.SIGTERM); err != nil {
		errs = append(errs, err)
	}
	if !waitLaunchedExit(p, pgid, cfg.terminateWait) {
		if err := signalLaunched(p, pgid, syscall.SIGKILL); err != nil {
			errs = append(errs, err)
		}
		waitLaunchedExit(p, pgid, cfg.killWait) // still running: best effort, not reported
	}
	return errors.Join(errs...)
}

// signalLaunched sends sig to group pgid if it is not 0, else to p alone. A
// process that is already gone is not an error.
func signalLaunched(p *os.Process, pgid int, sig syscall.Signal) error {
	if pgid != 0 {
		return signalGroupOf(pgid, sig)
	}
	if err := p.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal process %d with %s: %w", p.Pid, sig, err)
	}
	return nil
}

// signalGroupOf uses the platform's group helpers.
func signalGroupOf(pgid int, sig syscall.Signal) error {
	if sig == syscall.SIGKILL {
		return killGroup(pgid)
	}
	return terminateGroup(pgid)
}

// waitLaunchedExit waits up to d for p to have exited and, if pgid is not 0,
// for group pgid to have no running member. It reports whether that
// happened.
func waitLaunchedExit(p *os.Process, pgid int, d time.Duration) bool {
	done := func() bool { return !processAlive(p) && (pgid == 0 || !groupRunning(pgid)) }
	if done() {
		return true
	}
	if d <= 0 {
		return false
	}
	deadline := time.Now().Add(d)
	interval := exitPollMin
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		<-timer.C
		if done() {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		interval = min(2*interval, exitPoll, left)
		timer.Reset(interval)
	}
}

// processAlive reports whether p is running: not waited, and, where /proc
// tells, not a zombie.
func processAlive(p *os.Process) bool {
	if err := p.Signal(syscall.Signal(0)); errors.Is(err, os.ErrProcessDone) {
		return false // waited (by the caller), or reaped
	}
	// Not reaped at the check above, so /proc/<pid> is p's, unless it was
	// reaped and its pid reused since; the next poll then sees
	// ErrProcessDone.
	if st, ok := readLaunchProcStat(p.Pid); ok {
		return st.live()
	}
	if _, err := os.Stat("/proc/self/stat"); err == nil {
		return false // /proc, but no such process: reaped meanwhile
	}
	return true // no /proc: a zombie cannot be told from a running process
}

// readLaunchProcStat reads the state and process group of pid from
// /proc/<pid>/stat (parseProcStatFull). It reports false where there is no
// such file (no /proc, or no such process).
func readLaunchProcStat(pid int) (procInfo, bool) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procInfo{}, false
	}
	p, ok := parseProcStatFull(stat)
	p.pid = pid
	return p, ok
}
