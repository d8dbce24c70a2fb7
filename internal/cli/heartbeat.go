package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/vigil-fleet/vigil/internal/heartbeat"
	"github.com/vigil-fleet/vigil/vigilclient"
)

func newHeartbeatCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "heartbeat",
		Short: "Activity-gated heartbeat loop for sessions not written against the SDK",
		Long: `A detached loop that holds one task's lease for a program not written
against the Go SDK — a shell script, an interactive coding agent, a CI job
(DESIGN H1–H3, docs/heartbeats.md). Each tick (default 240s) it exits if the
parent process is gone (pid reuse included), keeps the session instance's
liveness row fresh, and sends a v2 lease heartbeat only when
DIR/.vigil/last-activity is fresher than --staleness (default 900s).`,
	}
	cmd.AddCommand(newHeartbeatSpawnCmd(), newHeartbeatLoopCmd(), newHeartbeatKillCmd(),
		newHeartbeatStatusCmd(), newHeartbeatVersionsCmd())
	return cmd
}

func newHeartbeatSpawnCmd() *cobra.Command {
	var (
		cf        clientFlags
		lf        loopFlags
		workdir   string
		taskID    int64
		epoch     int64
		parentPID int
	)
	cmd := &cobra.Command{
		Use:   "spawn --workdir DIR [--task ID --epoch N]",
		Short: "Start the detached heartbeat loop for the task held in DIR",
		Long: `Start the heartbeat loop detached (new session, stdio closed, output to
DIR/.vigil/heartbeat.log), so it survives its caller's terminal. It writes
DIR/.vigil/heartbeat.pid and heartbeat.parent.pid (the parent's pid and start
time) and ends when the parent goes, the lease is lost, or writes keep failing
past --lease-window (exit status 1). The instance comes from
DIR/.vigil/instance.json (vigil tasks claim); --task and --epoch default to
DIR/.vigil/task.json. Stop it with vigil heartbeat kill --workdir DIR.`,
		Example: `  vigil heartbeat spawn --workdir . --task 42 --epoch 3
  vigil heartbeat spawn --workdir ~/src/repo --parent-pid $$ --interval 60s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := lf.validate(); err != nil {
				return err
			}
			st, err := openWorkdir(workdir)
			if err != nil {
				return err
			}
			if _, err := st.ReadInstance(); err != nil {
				if errors.Is(err, heartbeat.ErrNoState) {
					return fmt.Errorf("--workdir %s: no session instance in .vigil/instance.json: claim with vigil tasks claim --workdir first", st.Workdir)
				}
				return fmt.Errorf("--workdir: %w", err)
			}
			ts, err := st.ReadTask()
			if err != nil && !errors.Is(err, heartbeat.ErrNoState) {
				return fmt.Errorf("--workdir: %w", err)
			}
			if cmd.Flags().Changed("task") {
				if taskID <= 0 {
					return fmt.Errorf("--task %d: must be a positive task id", taskID)
				}
				if ts.TaskID != taskID {
					ts = heartbeat.TaskState{TaskID: taskID}
				}
			}
			if cmd.Flags().Changed("epoch") {
				if epoch <= 0 {
					return fmt.Errorf("--epoch %d: must be a positive lease epoch", epoch)
				}
				ts.LeaseEpoch = epoch
			}
			switch {
			case ts.TaskID <= 0:
				return errors.New("--task is required (no task recorded in DIR/.vigil/task.json)")
			case ts.LeaseEpoch <= 0:
				return errors.New("--epoch is required (no epoch recorded for that task in DIR/.vigil/task.json)")
			}
			flag := "--parent-pid"
			if !cmd.Flags().Changed("parent-pid") {
				flag, parentPID = "parent process", os.Getppid()
			}
			parent, err := capturePID(flag, parentPID)
			if err != nil {
				return err
			}
			argv, err := loopArgv(&cf, &lf, st, ts, parent)
			if err != nil {
				return err
			}
			p, ref, err := heartbeat.Spawn(heartbeat.SpawnParams{State: st, Parent: parent, Argv: argv})
			if err != nil {
				if errors.Is(err, heartbeat.ErrLoopRunning) {
					return fmt.Errorf("--workdir %s: %w: stop it with vigil heartbeat kill --workdir first", st.Workdir, err)
				}
				return err
			}
			_ = p.Release()
			if cf.json {
				return printJSON(cmd.OutOrStdout(), map[string]any{
					"pid": ref.PID, "parent_pid": parent.PID, "task_id": ts.TaskID, "lease_epoch": ts.LeaseEpoch,
					"workdir": st.Workdir, "log": st.Path(heartbeat.LogFile),
				})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "heartbeat loop %d started for task %d (epoch %d), bound to pid %d; log %s\n",
				ref.PID, ts.TaskID, ts.LeaseEpoch, parent.PID, st.Path(heartbeat.LogFile))
			return nil
		},
	}
	cf.register(cmd)
	lf.register(cmd)
	fs := cmd.Flags()
	fs.StringVar(&workdir, "workdir", "", "the session's work directory; state in DIR/.vigil/ (required)")
	fs.Int64Var(&taskID, "task", 0, "task id (default: DIR/.vigil/task.json)")
	fs.Int64Var(&epoch, "epoch", 0, "lease epoch (default: DIR/.vigil/task.json)")
	fs.IntVar(&parentPID, "parent-pid", 0, "the process whose life bounds the loop (default: the calling shell)")
	return cmd
}

// newHeartbeatLoopCmd is the detached loop itself, started by spawn, claim
// and run; hidden. The watchdog recognises it by "heartbeat loop" and reads
// --workdir, --parent-pid and --parent-start from its command line.
func newHeartbeatLoopCmd() *cobra.Command {
	var (
		cf          clientFlags
		lf          loopFlags
		workdir     string
		taskID      int64
		epoch       int64
		parentPID   int
		parentStart uint64
		notBefore   string
	)
	cmd := &cobra.Command{
		Use:    "loop",
		Short:  "Run the heartbeat loop in the foreground (started by spawn)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := lf.validate(); err != nil {
				return err
			}
			st, err := openWorkdir(workdir)
			if err != nil {
				return err
			}
			if taskID <= 0 || epoch <= 0 || parentPID <= 0 {
				return errors.New("--task, --epoch and --parent-pid are required")
			}
			var nb time.Time
			if notBefore != "" {
				if nb, err = time.Parse(time.RFC3339Nano, notBefore); err != nil {
					return fmt.Errorf("--not-before: %w", err)
				}
			}
			is, err := st.ReadInstance()
			if err != nil {
				return fmt.Errorf("--workdir: %w", err)
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			logger := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil)).With("pid", os.Getpid())
			loop, err := heartbeat.NewLoop(heartbeat.Config{
				State:  st,
				Client: c,
				Lease: vigilclient.Lease{
					Instance: vigilclient.Instance{ID: is.InstanceID, Token: is.InstanceToken},
					TaskID:   taskID, Epoch: epoch,
				},
				Liveness:    true,
				NotBefore:   nb,
				Parent:      heartbeat.ProcRef{PID: parentPID, StartTime: parentStart},
				Interval:    lf.interval,
				Staleness:   lf.staleness,
				LeaseWindow: lf.leaseWindow,
				Logger:      logger,
			})
			if err != nil {
				return err
			}
			logger.Info("heartbeat loop started", "task_id", taskID, "epoch", epoch, "parent_pid", parentPID, "interval", lf.interval, "staleness", lf.staleness)
			if err := loop.Run(cmd.Context()); err != nil {
				logger.Error("heartbeat loop failed", "err", err)
				return err
			}
			logger.Info("heartbeat loop stopped")
			return nil
		},
	}
	cf.register(cmd)
	lf.register(cmd)
	fs := cmd.Flags()
	fs.StringVar(&workdir, "workdir", "", "work directory")
	fs.Int64Var(&taskID, "task", 0, "task id")
	fs.Int64Var(&epoch, "epoch", 0, "lease epoch")
	fs.IntVar(&parentPID, "parent-pid", 0, "parent pid")
	fs.Uint64Var(&parentStart, "parent-start", 0, "parent start time (/proc/PID/stat field 22; 0: not compared)")
	fs.StringVar(&notBefore, "not-before", "", "the lease's start (RFC 3339): activity_at is never sent earlier")
	return cmd
}

func newHeartbeatKillCmd() *cobra.Command {
	var (
		workdir string
		grace   time.Duration
		asJSON  bool
	)
	cmd := &cobra.Command{
		Use:   "kill --workdir DIR",
		Short: "Stop the heartbeat loop of DIR",
		Long: `Stop the heartbeat loop recorded in DIR/.vigil/heartbeat.pid: SIGTERM, then
SIGKILL after --grace, and remove the pid file. A pid file naming a process
that is gone, or a pid now held by another process, is removed without a
signal. No loop is not an error: kill is safe on every exit path.`,
		Example: `  trap 'vigil heartbeat kill --workdir "$PWD"' EXIT`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if grace <= 0 {
				return fmt.Errorf("--grace must be positive, got %s", grace)
			}
			st, err := openWorkdir(workdir)
			if err != nil {
				return err
			}
			res, err := heartbeat.Kill(st, grace)
			if err != nil {
				return err
			}
			if asJSON {
				var pid *int
				if res.Loop != nil {
					pid = &res.Loop.PID
				}
				return printJSON(cmd.OutOrStdout(), map[string]any{"pid": pid, "was_running": res.Running, "sigkill": res.Killed})
			}
			switch {
			case res.Loop == nil:
				fmt.Fprintln(cmd.OutOrStdout(), "no heartbeat loop recorded")
			case !res.Running:
				fmt.Fprintf(cmd.OutOrStdout(), "heartbeat loop %d was not running; removed its pid file\n", res.Loop.PID)
			case res.Killed:
				fmt.Fprintf(cmd.OutOrStdout(), "heartbeat loop %d ignored SIGTERM for %s; killed\n", res.Loop.PID, grace)
			default:
				fmt.Fprintf(cmd.OutOrStdout(), "heartbeat loop %d stopped\n", res.Loop.PID)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&workdir, "workdir", "", "the session's work directory (required)")
	fs.DurationVar(&grace, "grace", heartbeat.KillGraceDefault, "wait this long after SIGTERM before SIGKILL")
	fs.BoolVar(&asJSON, "json", false, "print JSON for scripts")
	return cmd
}

// heartbeatStatus is what `heartbeat status --json` prints.
type heartbeatStatus struct {
	Workdir        string     `json:"workdir"`
	Running        bool       `json:"running"`
	PID            *int       `json:"pid"`
	ParentPID      *int       `json:"parent_pid"`
	ParentAlive    bool       `json:"parent_alive"`
	InstanceID     *string    `json:"instance_id"`
	TaskID         *int64     `json:"task_id"`
	LeaseEpoch     *int64     `json:"lease_epoch"`
	LastActivityAt *time.Time `json:"last_activity_at"`
	ActivityAgeS   *float64   `json:"activity_age_s"`
}

func newHeartbeatStatusCmd() *cobra.Command {
	var (
		workdir string
		asJSON  bool
	)
	cmd := &cobra.Command{
		Use:   "status --workdir DIR",
		Short: "Show the heartbeat loop, parent, task and activity of DIR",
		Long: `Show what DIR/.vigil/ says: whether the heartbeat loop runs (its pid names
the same live process), whether its parent lives, the instance and task it
holds, and how old the last activity is. Exits 3 when no loop runs.`,
		Example: `  vigil heartbeat status --workdir .
  vigil heartbeat status --workdir . --json | jq .activity_age_s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := openWorkdir(workdir)
			if err != nil {
				return err
			}
			ls, err := st.Status()
			if err != nil {
				return err
			}
			out := heartbeatStatus{Workdir: st.Workdir, Running: ls.Running, ParentAlive: ls.ParentAlive}
			if ls.Loop != nil {
				out.PID = &ls.Loop.PID
			}
			if ls.Parent != nil {
				out.ParentPID = &ls.Parent.PID
			}
			if is, err := st.ReadInstance(); err == nil {
				out.InstanceID = &is.InstanceID
			}
			if ts, err := st.ReadTask(); err == nil {
				out.TaskID, out.LeaseEpoch = &ts.TaskID, &ts.LeaseEpoch
			}
			now := time.Now()
			if mt, ok, err := st.Activity(); err == nil && ok {
				age := now.Sub(mt).Seconds()
				mt = mt.UTC()
				out.LastActivityAt, out.ActivityAgeS = &mt, &age
			}
			if asJSON {
				if err := printJSON(cmd.OutOrStdout(), out); err != nil {
					return err
				}
			} else {
				yes := func(b bool) string { return strconv.FormatBool(b) }
				i64 := func(v int64) string { return strconv.FormatInt(v, 10) }
				if err := table(cmd.OutOrStdout(), []string{"FIELD", "VALUE"}, [][]string{
					{"workdir", out.Workdir},
					{"running", yes(out.Running)},
					{"pid", orDash(out.PID, strconv.Itoa)},
					{"parent_pid", orDash(out.ParentPID, strconv.Itoa)},
					{"parent_alive", yes(out.ParentAlive)},
					{"instance_id", orDash(out.InstanceID, func(s string) string { return s })},
					{"task_id", orDash(out.TaskID, i64)},
					{"lease_epoch", orDash(out.LeaseEpoch, i64)},
					{"last_activity", ago(out.LastActivityAt, now)},
				}); err != nil {
					return err
				}
			}
			if !out.Running {
				return &exitError{err: fmt.Errorf("no heartbeat loop runs for %s", st.Workdir), code: exitNotFound}
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&workdir, "workdir", "", "the session's work directory (required)")
	fs.BoolVar(&asJSON, "json", false, "print JSON for scripts instead of a table")
	return cmd
}

func newHeartbeatVersionsCmd() *cobra.Command {
	var (
		cf     clientFlags
		window time.Duration
	)
	cmd := &cobra.Command{
		Use:   "versions",
		Short: "Per host, which lease heartbeat schema versions it sent recently",
		Long: `Per host and schema version, how many lease heartbeats it sent within
--window and when it last sent one (DESIGN T4), then a verdict line: whether
the cutover to --lease-expiry activity-only (v1 heartbeats no longer extend
a lease; DESIGN T6) is safe — every host that sent heartbeats in the window
sent v2 only — or which hosts still send v1. With --json the verdict is the
"verdict" object (safe_to_cut_over, hosts, v1_hosts, message).`,
		Example: `  vigil heartbeat versions
  vigil heartbeat versions --window 24h --json | jq '.hosts[] | select(.schema_version==1)'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if window < time.Second || window > 366*24*time.Hour {
				return fmt.Errorf("--window must be between 1s and 8784h, got %s", window)
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			v, err := c.HeartbeatVersions(cmd.Context(), window)
			if err != nil {
				return err
			}
			if cf.json {
				hosts := v.Hosts
				if hosts == nil {
					hosts = []vigilclient.HostHeartbeatVersion{}
				}
				return printJSON(cmd.OutOrStdout(), map[string]any{"window_s": v.WindowS, "hosts": hosts, "verdict": v.Verdict()})
			}
			now := time.Now()
			rows := make([][]string, 0, len(v.Hosts))
			for _, h := range v.Hosts {
				last := h.LastSentAt
				rows = append(rows, []string{h.Hostname, "v" + strconv.Itoa(h.SchemaVersion),
					strconv.FormatInt(h.Heartbeats, 10), ago(&last, now)})
			}
			if err := table(cmd.OutOrStdout(), []string{"HOST", "SCHEMA", "HEARTBEATS", "LAST SENT"}, rows); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), v.Verdict().Message)
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().DurationVar(&window, "window", 24*time.Hour, "how far back to look (the verdict covers this window)")
	return cmd
}
