package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/vigil-fleet/vigil/internal/heartbeat"
	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// SessionKindDefault is the process kind a shell session registers under.
const SessionKindDefault = "session"

// finishTimeout bounds the server calls made while finishing a task after
// a signal cancelled the command's context.
const finishTimeout = 30 * time.Second

// withSessionCmds adds the shell-session lifecycle (DESIGN H4) to the tasks
// command: claim, complete, fail, release, all keyed by --workdir.
func withSessionCmds(tasks *cobra.Command) *cobra.Command {
	tasks.AddCommand(newTasksClaimCmd(), newTasksFinishCmd("complete"), newTasksFinishCmd("fail"), newTasksFinishCmd("release"))
	return tasks
}

// loopFlags are the heartbeat loop knobs shared by spawn, claim and run.
type loopFlags struct {
	interval    time.Duration
	staleness   time.Duration
	leaseWindow time.Duration
}

func (f *loopFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.DurationVar(&f.interval, "interval", heartbeat.IntervalDefault, "heartbeat loop tick; also the session instance's liveness interval")
	fs.DurationVar(&f.staleness, "staleness", heartbeat.StalenessDefault, "skip the lease heartbeat while DIR/.vigil/last-activity is older than this")
	fs.DurationVar(&f.leaseWindow, "lease-window", heartbeat.LeaseWindowDefault, "end the loop with an error when writes keep failing this long")
}

func (f *loopFlags) validate() error {
	for _, c := range []struct {
		name string
		d    time.Duration
	}{{"--interval", f.interval}, {"--staleness", f.staleness}, {"--lease-window", f.leaseWindow}} {
		if c.d < 10*time.Millisecond || c.d > 24*time.Hour {
			return fmt.Errorf("%s must be between 10ms and 24h, got %s", c.name, c.d)
		}
	}
	return nil
}

// openWorkdir validates a --workdir value.
func openWorkdir(dir string) (heartbeat.State, error) {
	if dir == "" {
		return heartbeat.State{}, errors.New("--workdir is required")
	}
	st, err := heartbeat.Open(dir)
	if err != nil {
		return heartbeat.State{}, fmt.Errorf("--workdir: %w", err)
	}
	return st, nil
}

// capturePID captures pid (a --parent-pid value, or the default) with its
// start time.
func capturePID(flag string, pid int) (heartbeat.ProcRef, error) {
	ref, err := heartbeat.Capture(pid)
	if err != nil {
		return ref, fmt.Errorf("%s: %w", flag, err)
	}
	return ref, nil
}

// ensureInstance returns the session instance recorded under st if it
// belongs to owner and the server still takes its heartbeats; otherwise it
// registers a new one (pid = owner) and records it.
func ensureInstance(ctx context.Context, c *vigilclient.Client, st heartbeat.State, owner heartbeat.ProcRef, kind string, interval time.Duration) (vigilclient.Instance, error) {
	if is, err := st.ReadInstance(); err == nil && is.Owner() == owner && is.ProcessKind == kind {
		inst := vigilclient.Instance{ID: is.InstanceID, Token: is.InstanceToken}
		if _, err := c.ProcessHeartbeat(ctx, inst); err == nil {
			return inst, nil
		}
	}
	host, err := os.Hostname()
	if err != nil {
		return vigilclient.Instance{}, fmt.Errorf("hostname: %w", err)
	}
	reg, err := c.RegisterProcess(ctx, vigilclient.RegisterParams{
		ProcessKind: kind, Hostname: host, PID: owner.PID, LivenessInterval: interval,
	})
	if err != nil {
		return vigilclient.Instance{}, err
	}
	is := heartbeat.InstanceState{
		InstanceID: reg.InstanceID, InstanceToken: reg.InstanceToken, ProcessKind: kind, Hostname: host,
		OwnerPID: owner.PID, OwnerStartTime: owner.StartTime, LivenessIntervalS: interval.Seconds(),
	}
	if err := st.WriteInstance(is); err != nil {
		return vigilclient.Instance{}, err
	}
	return reg.Instance(), nil
}

// claimInto claims a task (by id when id > 0, else of one of types) for
// inst and records it in task.json. It returns a nil task when nothing of
// types is claimable.
func claimInto(ctx context.Context, c *vigilclient.Client, st heartbeat.State, inst vigilclient.Instance, types []string, id int64) (*vigiltype.Task, error) {
	var (
		t   *vigiltype.Task
		err error
	)
	if id > 0 {
		t, err = c.ClaimByID(ctx, inst, id)
		var ae *vigilclient.APIError
		if errors.As(err, &ae) && ae.Code == vigilclient.CodeNotClaimable {
			return nil, &exitError{err: fmt.Errorf("--id %d: the task is not claimable now (running, finished or not yet due)", id), code: exitFailure}
		}
		if errorsIsNotFound(err) {
			return nil, &exitError{err: fmt.Errorf("--id %d: no such task", id), code: exitNotFound}
		}
	} else {
		t, err = c.Claim(ctx, inst, types)
		if errors.Is(err, vigiltype.ErrInstanceStopped) {
			// A short --interval on a slow machine: the instance's alive
			// window ended between its registration and this claim. One
			// liveness heartbeat makes it alive again; claim once more.
			if _, herr := c.ProcessHeartbeat(ctx, inst); herr == nil {
				t, err = c.Claim(ctx, inst, types)
			}
		}
	}
	if err != nil || t == nil {
		return nil, err
	}
	ts := heartbeat.TaskState{TaskID: t.TaskID, TaskType: t.TaskType, LeaseEpoch: t.LeaseEpoch, InstanceID: inst.ID}
	if t.StartedAt != nil {
		ts.ClaimedAt = *t.StartedAt
	}
	if err := st.WriteTask(ts); err != nil {
		return nil, err
	}
	// The claim is activity: the server starts last_activity_at there too.
	if err := st.TouchActivity(time.Now()); err != nil {
		return nil, err
	}
	return t, nil
}

// loopArgv is the command line of the detached loop for task ts.
func loopArgv(cf *clientFlags, lf *loopFlags, st heartbeat.State, ts heartbeat.TaskState, parent heartbeat.ProcRef) ([]string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find the vigil executable: %w", err)
	}
	argv := []string{exe, "heartbeat", "loop",
		"--workdir=" + st.Workdir,
		"--task=" + strconv.FormatInt(ts.TaskID, 10),
		"--epoch=" + strconv.FormatInt(ts.LeaseEpoch, 10),
		"--parent-pid=" + strconv.Itoa(parent.PID),
		"--parent-start=" + strconv.FormatUint(parent.StartTime, 10),
		"--interval=" + lf.interval.String(),
		"--staleness=" + lf.staleness.String(),
		"--lease-window=" + lf.leaseWindow.String(),
		"--server=" + cf.server,
	}
	if !ts.ClaimedAt.IsZero() {
		argv = append(argv, "--not-before="+ts.ClaimedAt.UTC().Format(time.RFC3339Nano))
	}
	if cf.tokenFile != "" {
		argv = append(argv, "--token-file="+cf.tokenFile)
	}
	if cf.caFile != "" {
		abs, err := filepath.Abs(cf.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		argv = append(argv, "--ca-file="+abs)
	}
	return argv, nil
}

// sessionClaim is what `tasks claim` prints.
type sessionClaim struct {
	InstanceID   string          `json:"instance_id"`
	InstanceFile string          `json:"instance_file"`
	TaskID       int64           `json:"task_id"`
	TaskType     string          `json:"task_type"`
	LeaseEpoch   int64           `json:"lease_epoch"`
	Workdir      string          `json:"workdir"`
	HeartbeatPID *int            `json:"heartbeat_pid"`
	Task         *vigiltype.Task `json:"task"`
}

func newTasksClaimCmd() *cobra.Command {
	var (
		cf          clientFlags
		lf          loopFlags
		workdir     string
		kind        string
		id          int64
		parentPID   int
		noHeartbeat bool
	)
	cmd := &cobra.Command{
		Use:   "claim [TYPE…] --workdir DIR",
		Short: "Claim a task for the calling shell session (no SDK needed)",
		Long: `Claim a task for the session that runs this command (DESIGN H4): register a
process instance for it (pid = the calling shell, or --parent-pid), claim the
oldest claimable task of one of TYPE… (or the task --id), record the instance
(id and token, mode 0600) and the task (id, epoch) under DIR/.vigil/, and
spawn the detached heartbeat loop bound to that shell (unless --no-heartbeat).

The loop keeps the instance's liveness row fresh every tick while the shell
lives, and sends the lease heartbeat only while DIR/.vigil/last-activity is
fresh (vigil touch-activity). Finish with vigil tasks complete|fail|release
--workdir DIR. Exits 3 when nothing is claimable.`,
		Example: `  vigil tasks claim review --workdir ~/src/repo
  vigil tasks claim --id 42 --workdir . --json | jq .task_id
  TOKEN=$(jq -r .instance_token .vigil/instance.json)   # for raw API calls`,
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case id == 0 && len(args) == 0:
				return errors.New("give a task TYPE to claim, or --id ID")
			case id != 0 && len(args) > 0:
				return errors.New("--id claims one task: give no TYPE with it")
			case id < 0:
				return fmt.Errorf("--id %d: must be a positive task id", id)
			case kind == "":
				return errors.New("--kind must not be empty")
			}
			if err := lf.validate(); err != nil {
				return err
			}
			st, err := openWorkdir(workdir)
			if err != nil {
				return err
			}
			unlock, err := st.Lock()
			if err != nil {
				return fmt.Errorf("--workdir: %w", err)
			}
			defer unlock()
			if ts, err := st.ReadTask(); err == nil {
				return fmt.Errorf("--workdir %s already holds task %d (epoch %d): finish it with vigil tasks complete|fail|release --workdir %s",
					st.Workdir, ts.TaskID, ts.LeaseEpoch, workdir)
			}
			flag := "--parent-pid"
			if !cmd.Flags().Changed("parent-pid") {
				flag, parentPID = "parent process", os.Getppid()
			}
			owner, err := capturePID(flag, parentPID)
			if err != nil {
				return err
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			inst, err := ensureInstance(ctx, c, st, owner, kind, lf.interval)
			if err != nil {
				return err
			}
			t, err := claimInto(ctx, c, st, inst, args, id)
			if err == nil && t == nil {
				err = &exitError{err: fmt.Errorf("no claimable task of type %v", args), code: exitNotFound}
			}
			if err != nil {
				// Nothing keeps a session instance without a task alive:
				// it ends here rather than show alive for its window (the
				// next claim registers a fresh one).
				if _, xerr := c.ProcessExit(context.WithoutCancel(ctx), inst); xerr != nil && !errors.Is(xerr, vigiltype.ErrInstanceExited) {
					return errors.Join(err, fmt.Errorf("mark instance %s exited: %w", inst.ID, xerr))
				}
				return err
			}
			out := sessionClaim{
				InstanceID: inst.ID, InstanceFile: st.Path(heartbeat.InstanceFile), TaskID: t.TaskID,
				TaskType: t.TaskType, LeaseEpoch: t.LeaseEpoch, Workdir: st.Workdir, Task: t,
			}
			if !noHeartbeat {
				ts, err := st.ReadTask()
				if err != nil {
					return err
				}
				argv, err := loopArgv(&cf, &lf, st, ts, owner)
				if err != nil {
					return err
				}
				p, ref, err := heartbeat.Spawn(heartbeat.SpawnParams{State: st, Parent: owner, Argv: argv})
				if err != nil {
					// Nobody would keep the lease: give the task back now.
					_, rerr := finishLease(ctx, c, st, inst.Lease(t), "release", nil, "", 0)
					return errors.Join(fmt.Errorf("claimed task %d but could not start its heartbeat loop, so released it: %w", t.TaskID, err), rerr)
				}
				_ = p.Release()
				out.HeartbeatPID = &ref.PID
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), out)
			}
			return table(cmd.OutOrStdout(), []string{"FIELD", "VALUE"}, [][]string{
				{"instance_id", out.InstanceID},
				{"instance_file", out.InstanceFile},
				{"task_id", strconv.FormatInt(out.TaskID, 10)},
				{"task_type", out.TaskType},
				{"lease_epoch", strconv.FormatInt(out.LeaseEpoch, 10)},
				{"workdir", out.Workdir},
				{"heartbeat_pid", orDash(out.HeartbeatPID, strconv.Itoa)},
			})
		},
	}
	cf.register(cmd)
	lf.register(cmd)
	fs := cmd.Flags()
	fs.StringVar(&workdir, "workdir", "", "the session's work directory; state goes to DIR/.vigil/ (required)")
	fs.StringVar(&kind, "kind", SessionKindDefault, "process kind the session instance registers under")
	fs.Int64Var(&id, "id", 0, "claim this scheduled task instead of one of TYPE…")
	fs.IntVar(&parentPID, "parent-pid", 0, "the process the session is (default: the calling shell)")
	fs.BoolVar(&noHeartbeat, "no-heartbeat", false, "do not spawn the heartbeat loop (start one with vigil heartbeat spawn)")
	return cmd
}

// sessionLease reads the instance and task recorded under st.
func sessionLease(st heartbeat.State) (vigilclient.Lease, error) {
	is, err := st.ReadInstance()
	if err != nil {
		if errors.Is(err, heartbeat.ErrNoState) {
			return vigilclient.Lease{}, fmt.Errorf("--workdir %s: no session instance: claim with vigil tasks claim --workdir first", st.Workdir)
		}
		return vigilclient.Lease{}, fmt.Errorf("--workdir: %w", err)
	}
	ts, err := st.ReadTask()
	if err != nil {
		if errors.Is(err, heartbeat.ErrNoState) {
			return vigilclient.Lease{}, fmt.Errorf("--workdir %s: holds no task (no .vigil/task.json)", st.Workdir)
		}
		return vigilclient.Lease{}, fmt.Errorf("--workdir: %w", err)
	}
	return vigilclient.Lease{Instance: vigilclient.Instance{ID: is.InstanceID, Token: is.InstanceToken}, TaskID: ts.TaskID, Epoch: ts.LeaseEpoch}, nil
}

// finishLease stops the heartbeat loop, then completes, fails or releases
// l, and forgets the task. A lease already lost is forgotten too.
func finishLease(ctx context.Context, c *vigilclient.Client, st heartbeat.State, l vigilclient.Lease, verb string, result any, msg string, retryAfter time.Duration) (*vigiltype.Task, error) {
	if _, err := heartbeat.Kill(st, 0); err != nil {
		return nil, fmt.Errorf("stop the heartbeat loop: %w", err)
	}
	var (
		t   *vigiltype.Task
		err error
	)
	switch verb {
	case "complete":
		t, err = c.Complete(ctx, l, result)
	case "fail":
		t, err = c.Fail(ctx, l, msg, retryAfter)
	default:
		t, err = c.Release(ctx, l)
	}
	if err == nil || errors.Is(err, vigiltype.ErrStaleEpoch) || errors.Is(err, vigiltype.ErrNotFound) {
		if rerr := st.Remove(heartbeat.TaskFile); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}
	return t, err
}

func newTasksFinishCmd(verb string) *cobra.Command {
	var (
		cf         clientFlags
		workdir    string
		result     string
		message    string
		retryAfter time.Duration
	)
	short := map[string]string{
		"complete": "Complete the task the session in --workdir holds",
		"fail":     "Record a failure of the task the session in --workdir holds",
		"release":  "Give back the task the session in --workdir holds",
	}[verb]
	cmd := &cobra.Command{
		Use:   verb + " --workdir DIR",
		Short: short,
		Long: short + ` (claimed with vigil tasks claim
--workdir DIR): stop its heartbeat loop, send the call with the recorded
instance token and lease epoch, and forget the task (DIR/.vigil/task.json).
A lease already lost (409 stale_epoch) is forgotten too, and reported.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := openWorkdir(workdir)
			if err != nil {
				return err
			}
			unlock, err := st.Lock()
			if err != nil {
				return fmt.Errorf("--workdir: %w", err)
			}
			defer unlock()
			var res any
			switch verb {
			case "complete":
				raw, err := readJSONFlag(cmd, "--result", result)
				if err != nil {
					return err
				}
				if raw != nil {
					res = raw
				}
			case "fail":
				if message == "" {
					return errors.New("--error is required: say why the task failed")
				}
				if retryAfter < 0 || retryAfter > 24*time.Hour {
					return fmt.Errorf("--retry-after must be between 0 and 24h, got %s", retryAfter)
				}
			}
			l, err := sessionLease(st)
			if err != nil {
				return err
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			t, err := finishLease(cmd.Context(), c, st, l, verb, res, message, retryAfter)
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(cmd.OutOrStdout(), t)
			}
			status := "-"
			if t != nil {
				status = string(t.Status)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s task %d (epoch %d): now %s\n", pastTense(verb), l.TaskID, l.Epoch, status)
			return nil
		},
	}
	cf.register(cmd)
	fs := cmd.Flags()
	fs.StringVar(&workdir, "workdir", "", "the session's work directory (required)")
	switch verb {
	case "complete":
		fs.StringVar(&result, "result", "", "result as JSON (default null); @FILE reads a file, - standard input")
	case "fail":
		fs.StringVar(&message, "error", "", "why the task failed (required)")
		fs.DurationVar(&retryAfter, "retry-after", 0, "retry after this long instead of the server's backoff")
	}
	return cmd
}

func pastTense(verb string) string {
	switch verb {
	case "complete":
		return "completed"
	case "fail":
		return "failed"
	}
	return "released"
}

// readJSONFlag reads a JSON flag value like --payload: inline, @FILE or -.
func readJSONFlag(cmd *cobra.Command, name, v string) (json.RawMessage, error) {
	raw, err := readPayload(cmd, v)
	if err != nil {
		// readPayload names --payload; name the real flag.
		return nil, fmt.Errorf("%s%s", name, trimFlagPrefix(err.Error()))
	}
	return raw, nil
}

func trimFlagPrefix(s string) string {
	const p = "--payload"
	if len(s) >= len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return ": " + s
}
