package heartbeat

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// ErrLoopRunning is returned by Spawn when the workdir already has a live
// heartbeat loop.
var ErrLoopRunning = errors.New("a heartbeat loop already runs for this workdir")

// KillGraceDefault is how long Kill waits after SIGTERM before SIGKILL.
const KillGraceDefault = 5 * time.Second

// SpawnParams says what to spawn.
type SpawnParams struct {
	State State
	// Parent is the process whose life bounds the loop; written to
	// heartbeat.parent.pid.
	Parent ProcRef
	// Argv is the loop's command line, Argv[0] the executable (the vigil
	// binary), e.g. [vigil heartbeat loop --workdir …].
	Argv []string
	// Env is the loop's environment; nil: this process's.
	Env []string
}

// Spawn starts the loop detached: a new session (no controlling terminal,
// so it outlives its caller's terminal), cwd = the workdir (the watchdog
// relies on it), stdin from /dev/null, stdout and stderr appended to
// heartbeat.log. It writes heartbeat.parent.pid before and heartbeat.pid
// after the start, and returns the started process: a caller that lives on
// should Wait for it (or Release it) so it does not linger as a zombie.
func Spawn(p SpawnParams) (*os.Process, ProcRef, error) {
	if len(p.Argv) == 0 {
		return nil, ProcRef{}, errors.New("spawn heartbeat loop: empty command")
	}
	st := p.State
	if err := st.Init(); err != nil {
		return nil, ProcRef{}, err
	}
	if ref, err := st.ReadProcRef(PIDFile); err == nil && Alive(ref) {
		return nil, ref, fmt.Errorf("%w (pid %d)", ErrLoopRunning, ref.PID)
	}
	if err := st.WriteProcRef(ParentPIDFile, p.Parent); err != nil {
		return nil, ProcRef{}, err
	}
	logf, err := os.OpenFile(st.Path(LogFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, ProcRef{}, fmt.Errorf("open heartbeat log: %w", err)
	}
	defer logf.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, ProcRef{}, err
	}
	defer devnull.Close()
	cmd := &exec.Cmd{
		Path:        p.Argv[0],
		Args:        p.Argv,
		Dir:         st.Workdir,
		Env:         p.Env,
		Stdin:       devnull,
		Stdout:      logf,
		Stderr:      logf,
		SysProcAttr: detachAttr(),
	}
	if err := cmd.Start(); err != nil {
		return nil, ProcRef{}, fmt.Errorf("spawn heartbeat loop: %w", err)
	}
	start, _ := ProcStartTime(cmd.Process.Pid)
	ref := ProcRef{PID: cmd.Process.Pid, StartTime: start}
	if err := st.WriteProcRef(PIDFile, ref); err != nil {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
		return nil, ProcRef{}, err
	}
	return cmd.Process, ref, nil
}

// KillResult says what Kill found and did.
type KillResult struct {
	Loop    *ProcRef // nil: no pid file
	Running bool     // the loop was running
	Killed  bool     // it needed SIGKILL after the grace period
}

// Kill stops the workdir's heartbeat loop: SIGTERM, then SIGKILL after
// grace (0: KillGraceDefault), and removes its pid file. A pid file naming
// a process that is gone or is another process is removed without a
// signal. No pid file is not an error.
func Kill(st State, grace time.Duration) (KillResult, error) {
	var res KillResult
	if grace <= 0 {
		grace = KillGraceDefault
	}
	ref, err := st.ReadProcRef(PIDFile)
	if errors.Is(err, ErrNoState) {
		return res, nil
	}
	if err != nil {
		return res, err
	}
	res.Loop = &ref
	if Alive(ref) {
		res.Running = true
		if err := sendSignal(ref.PID, syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return res, fmt.Errorf("SIGTERM heartbeat loop %d: %w", ref.PID, err)
		}
		if !waitGone(ref, grace) {
			res.Killed = true
			_ = sendSignal(ref.PID, syscall.SIGKILL)
			if !waitGone(ref, grace) {
				return res, fmt.Errorf("heartbeat loop %d survived SIGKILL", ref.PID)
			}
		}
	}
	if err := removeIfOwned(st.Path(PIDFile), ref.PID); err != nil {
		return res, err
	}
	return res, nil
}

// waitGone polls until ref is no longer alive or timeout passes.
func waitGone(ref ProcRef, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if !Alive(ref) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func sendSignal(pid int, sig os.Signal) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Signal(sig)
}
