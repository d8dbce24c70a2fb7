package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/vigil-fleet/vigil/internal/heartbeat"
	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// exitCommandNotRun is the exit code of vigil run when CMD could not be
// started (as a shell's 127).
const exitCommandNotRun = 127

func newRunCmd() *cobra.Command {
	var (
		cf      clientFlags
		lf      loopFlags
		workdir string
		claim   []string
		id      int64
		kind    string
	)
	cmd := &cobra.Command{
		Use:   "run --workdir DIR [--claim TYPE | --id ID] -- CMD [ARG…]",
		Short: "Run CMD under a heartbeat loop that is reaped on every exit path",
		Long: `Run CMD with a heartbeat loop for its task, and stop the loop whatever way
CMD ends: normally, with an error, or by SIGINT/SIGTERM to vigil run (which
are passed on to CMD) (DESIGN H4). If vigil run itself is killed with
SIGKILL, the loop sees its parent gone at its next tick and exits.

With --claim TYPE (repeatable) or --id ID, vigil run registers an instance
of --kind for itself, claims the task, and after CMD completes it (exit 0,
result {"exit_code":0}) or fails it (any other exit) and reports the
instance's exit. Without them it uses the session instance and task recorded
in DIR/.vigil/ (vigil tasks claim) and leaves finishing to the session; a
loop already running there is replaced by one bound to vigil run, and none
runs after it (vigil heartbeat spawn starts one again).

CMD runs with VIGIL_WORKDIR, VIGIL_TASK_ID and VIGIL_LEASE_EPOCH set, so
vigil touch-activity inside it finds DIR. vigil run exits with CMD's exit
code (128+N when CMD died of signal N; 127 when it could not start).`,
		Example: `  vigil run --workdir . --claim report -- ./make-report.sh
  vigil run --workdir ~/src/repo -- claude -p "fix the failing test"`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 0 {
				return errors.New("put the command after --: vigil run --workdir DIR -- CMD [ARG…]")
			}
			if err := lf.validate(); err != nil {
				return err
			}
			if id < 0 {
				return fmt.Errorf("--id %d: must be a positive task id", id)
			}
			if id > 0 && len(claim) > 0 {
				return errors.New("--claim and --id exclude each other")
			}
			if kind == "" {
				return errors.New("--kind must not be empty")
			}
			st, err := openWorkdir(workdir)
			if err != nil {
				return err
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			r := &runner{cmd: cmd, cf: &cf, lf: &lf, st: st, c: c}
			return r.run(claim, id, kind, args)
		},
	}
	cf.register(cmd)
	lf.register(cmd)
	fs := cmd.Flags()
	fs.StringVar(&workdir, "workdir", "", "work directory; state in DIR/.vigil/ (required)")
	fs.StringArrayVar(&claim, "claim", nil, "claim a task of this type first (repeatable)")
	fs.Int64Var(&id, "id", 0, "claim this scheduled task first")
	fs.StringVar(&kind, "kind", SessionKindDefault, "process kind vigil run registers under with --claim or --id")
	return cmd
}

type runner struct {
	cmd *cobra.Command
	cf  *clientFlags
	lf  *loopFlags
	st  heartbeat.State
	c   *vigilclient.Client
}

func (r *runner) run(types []string, id int64, kind string, argv []string) (err error) {
	ctx := r.cmd.Context()
	self, err := heartbeat.Capture(os.Getpid())
	if err != nil {
		return err
	}
	// The workdir is locked while its task is chosen and its loop started.
	unlock, err := r.st.Lock()
	if err != nil {
		return fmt.Errorf("--workdir: %w", err)
	}
	defer func() { unlock() }()
	claimed := len(types) > 0 || id > 0
	var lease vigilclient.Lease
	if claimed {
		if ts, err := r.st.ReadTask(); err == nil {
			return fmt.Errorf("--workdir %s already holds task %d: finish it first (vigil tasks complete|fail|release --workdir)", r.st.Workdir, ts.TaskID)
		}
		inst, err := ensureInstance(ctx, r.c, r.st, self, kind, r.lf.interval)
		if err != nil {
			return err
		}
		t, err := claimInto(ctx, r.c, r.st, inst, types, id)
		if err == nil && t == nil {
			err = &exitError{err: fmt.Errorf("--claim: no claimable task of type %v", types), code: exitNotFound}
		}
		if err != nil {
			// The instance registered for this run ends with it.
			if xerr := r.exitInstance(inst); xerr != nil {
				return errors.Join(err, xerr)
			}
			return err
		}
		lease = inst.Lease(t)
	} else {
		if lease, err = sessionLease(r.st); err != nil {
			return fmt.Errorf("%w (or pass --claim TYPE)", err)
		}
	}
	ts, err := r.st.ReadTask()
	if err != nil {
		return err
	}
	// From here on every path stops the loop; a claimed task is finished
	// and the instance vigil run registered reports its exit.
	loopArgs, err := loopArgv(r.cf, r.lf, r.st, ts, self)
	if err != nil {
		return r.finish(lease, claimed, -1, err)
	}
	// A loop already running for the workdir (the session's own, from
	// vigil tasks claim) is replaced by one bound to vigil run.
	if _, err := heartbeat.Kill(r.st, 0); err != nil {
		return r.finish(lease, claimed, -1, fmt.Errorf("stop the workdir's heartbeat loop: %w", err))
	}
	p, _, err := heartbeat.Spawn(heartbeat.SpawnParams{State: r.st, Parent: self, Argv: loopArgs})
	if err != nil {
		return r.finish(lease, claimed, -1, fmt.Errorf("start the heartbeat loop: %w", err))
	}
	loopEnded := make(chan struct{})
	go func() { _, _ = p.Wait(); close(loopEnded) }() // reap it: a zombie would hold its pid

	unlock()
	unlock = func() {}
	code, runErr := r.runCommand(argv, ts, loopEnded)
	return r.finish(lease, claimed, code, runErr)
}

// errNotStarted marks a CMD that could not be started: its task is
// released, not failed, so a typo costs no attempt.
var errNotStarted = errors.New("command not started")

// loopEndedGrace is how long CMD has, after SIGTERM, to end once its task's
// heartbeat loop has stopped.
const loopEndedGrace = 10 * time.Second

// runCommand runs argv with stdio passed through and SIGINT, SIGTERM and
// SIGHUP forwarded, and returns its exit code (128+N for signal N). If the
// heartbeat loop ends first (the lease was lost, or could not be renewed),
// CMD gets SIGTERM, then SIGKILL after loopEndedGrace: the task may already
// be someone else's. CMD also gets SIGTERM if vigil run itself dies (Linux).
func (r *runner) runCommand(argv []string, ts heartbeat.TaskState, loopEnded <-chan struct{}) (int, error) {
	// The parent-death signal is tied to the thread that starts CMD: keep
	// this goroutine on it until CMD is reaped.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	child := exec.Command(argv[0], argv[1:]...)
	child.SysProcAttr = childSysProcAttr()
	child.Stdin = readerOrFile(r.cmd.InOrStdin())
	child.Stdout, child.Stderr = r.cmd.OutOrStdout(), r.cmd.ErrOrStderr()
	child.Env = append(os.Environ(),
		"VIGIL_WORKDIR="+r.st.Workdir,
		"VIGIL_TASK_ID="+strconv.FormatInt(ts.TaskID, 10),
		"VIGIL_LEASE_EPOCH="+strconv.FormatInt(ts.LeaseEpoch, 10))
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	if err := child.Start(); err != nil {
		return exitCommandNotRun, fmt.Errorf("start %s: %w: %w", argv[0], errNotStarted, err)
	}
	done := make(chan struct{})
	go func() {
		var kill <-chan time.Time
		for {
			select {
			case s := <-sigs:
				_ = child.Process.Signal(s)
			case <-loopEnded:
				loopEnded = nil
				fmt.Fprintf(r.cmd.ErrOrStderr(), "vigil run: the heartbeat loop of task %d ended (lease lost?); stopping %s\n", ts.TaskID, argv[0])
				_ = child.Process.Signal(syscall.SIGTERM)
				t := time.NewTimer(loopEndedGrace)
				defer t.Stop()
				kill = t.C
			case <-kill:
				_ = child.Process.Kill()
			case <-done:
				return
			}
		}
	}()
	err := child.Wait()
	close(done)
	if err == nil {
		return 0, nil
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return exitFailure, fmt.Errorf("run %s: %w", argv[0], err)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), fmt.Errorf("%s was killed (%s)", argv[0], ws.Signal())
	}
	return ee.ExitCode(), fmt.Errorf("%s exited with status %d", argv[0], ee.ExitCode())
}

// finish stops the loop, finishes a task vigil run claimed (complete on
// code 0, fail otherwise; code -1: CMD never ran), and returns the error
// carrying CMD's exit code.
func (r *runner) finish(l vigilclient.Lease, claimed bool, code int, runErr error) error {
	// The command's context may be cancelled by the signal that ended CMD:
	// the last calls still go out.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.cmd.Context()), finishTimeout)
	defer cancel()
	var errs []error
	if _, err := heartbeat.Kill(r.st, 0); err != nil {
		errs = append(errs, fmt.Errorf("stop the heartbeat loop: %w", err))
	}
	if claimed {
		var err error
		switch {
		case code == 0 && runErr == nil:
			_, err = finishLease(ctx, r.c, r.st, l, "complete", map[string]int{"exit_code": 0}, "", 0)
		case errors.Is(runErr, errNotStarted):
			_, err = finishLease(ctx, r.c, r.st, l, "release", nil, "", 0)
		default:
			msg := "command did not run"
			if runErr != nil {
				msg = runErr.Error()
			}
			_, err = finishLease(ctx, r.c, r.st, l, "fail", nil, msg, 0)
		}
		if err != nil {
			errs = append(errs, err)
		}
		if err := r.exitInstance(l.Instance); err != nil {
			errs = append(errs, err)
		}
	}
	if code == -1 {
		code = exitFailure
	}
	if runErr == nil && len(errs) == 0 {
		return nil
	}
	all := errors.Join(append([]error{runErr}, errs...)...)
	if code == 0 {
		code = exitFailure // CMD succeeded but finishing did not
	}
	return &exitError{err: all, code: code}
}

// exitInstance marks the instance vigil run registered for itself exited,
// so it shows stopped at once instead of alive until its window passes.
func (r *runner) exitInstance(inst vigilclient.Instance) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.cmd.Context()), finishTimeout)
	defer cancel()
	if _, err := r.c.ProcessExit(ctx, inst); err != nil && !errors.Is(err, vigiltype.ErrInstanceExited) {
		return fmt.Errorf("mark instance %s exited: %w", inst.ID, err)
	}
	return nil
}

// readerOrFile passes *os.File through (so CMD gets the real terminal) and
// anything else as a pipe.
func readerOrFile(r io.Reader) io.Reader {
	if f, ok := r.(*os.File); ok {
		return f
	}
	if s, ok := r.(*strings.Reader); ok && s.Len() == 0 {
		return nil
	}
	return r
}
