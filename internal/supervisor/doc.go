// Package supervisor keeps a fleet of always-on agent processes running on
// this host: it is the `vigil supervise` half of `vigil up` (DESIGN S1–S3).
//
// A fleet file (LoadFleet) names each agent and its argv. Run launches every
// agent as a child in its own process group, with VIGIL_KIND set to the
// agent's name, and restarts it after every exit, clean ones included.
//
// Each agent goes through this cycle until the supervisor's context is
// cancelled:
//
//	          launch ok                   process exits
//	starting ───────────► running ───────────────────────► backing off
//	   ▲  │                  │  (its group's leftovers        │
//	   │  │ launch failed    │   are stopped first)           │
//	   │  └──────────────────┼──────────────────────────────► │
//	   │                     │                                │
//	   └─────────────────────┼──── delay (BackoffTracker) ────┘
//	                         │
//	     ctx cancelled       ▼
//	  (any state) ───► stopping: SIGTERM to the group and to the generation's
//	                   escaped descendants, StopGrace, SIGKILL to both, leader
//	                   and adopted orphans reaped ───► stopped
//
// The delay follows DESIGN S2: Min (5s) after a healthy run or the first
// fast failure, doubling for each further run shorter than FastFailure (30s),
// capped at Max (300s). A launch failure counts as a fast failure. Each delay
// d is then jittered, drawn from [d, d+0.2·d] (BackoffPolicy.Jitter), the band
// shifted down to end at Max at the cap, so that agents failing together (a
// server they all need goes away) do not restart in lockstep. Delays are
// decided by BackoffTracker, a plain type with no clock; its random source is
// injected (each agent has its own, randomly seeded).
//
// An agent that exits FlapPolicy.Exits times (5) within FlapPolicy.Window
// (10m) is flapping, however long each run lasted: a crash loop of 31s runs
// never backs off, yet is reported — one EventFlapping event per episode,
// decided by FlapDetector (a plain type; the caller passes the times). The
// episode ends at the first exit that finds fewer exits in the window.
//
// With Config.LogDir, each agent's stdout and stderr also go to
// <LogDir>/<agent>.log ("<UTC time> <stdout|stderr> <line>"), rotated when a
// write would pass LogMaxBytes (10 MiB) into <agent>.log.1 … .<LogKeep> (3).
// `vigil logs` reads them.
//
// Stopping (DESIGN S3) treats the generation as the unit — the process group
// and, on Linux, every descendant that escaped it (see Containment): SIGTERM
// goes to all of them; they have StopGrace (30s) for the leader to exit and
// every other process to be gone; then SIGKILL goes to all of them. Run returns
// only when every child is reaped and no process of any group is running.
// The same sequence clears processes an agent leaves in its group when it
// exits on its own, so that restarts do not pile up orphans.
//
// # One clock per comparison (DESIGN L10)
//
// The supervisor runs on its own host's clock and the server on another;
// it never compares a time of one with a time of the other. What crosses
// between them is a duration. The startup check (Agent.StartupTimeout)
// asks for the agent's instances registered within the time since the
// launch, measured here on the monotonic clock and applied by the server
// to its own, and looks among them for the launched process (its pid, or a
// descendant's carrying the generation marker, on Config.Host). A planned
// stop (Desired.PlannedStop) comes with its age on the server's clock: the
// supervisor places the write at the poll's start minus that age,
// restarts a process launched before it, and acts on each marker once, by
// its ID. Every event carries its process's launch time (Event.Launched),
// which the sink sends as an age, so that the server can tell whether a
// planned stop was written while that process ran (DESIGN E2): the crash
// of the process a restart started is not covered by the restart's marker.
//
// # Containment (Linux)
//
// No descendant survives a restart, a stop or the supervisor's shutdown,
// including one that called setsid() or double-forked out of the group:
//
//   - Each launch (generation) gets a marker in its environment,
//     EnvGeneration=<supervisor pid>.<random>.<agent>.<attempt>, which every
//     descendant inherits through fork, exec and setsid. Stopping a
//     generation signals its process group and every live process whose
//     /proc/<pid>/environ holds the marker, and waits until neither is left.
//   - Run makes the process a child subreaper (PR_SET_CHILD_SUBREAPER), so
//     orphaned descendants are reparented to it rather than to PID 1.
//   - One goroutine (reapLoop, woken by SIGCHLD and every second) reaps those
//     adopted orphans, whatever session or process group they are in, so no
//     zombies pile up (issue #12: an agent whose children setsid() and exit
//     ten times a second leaves at most a few zombies at any moment). It
//     never calls wait4(-1): the process has other children (os/exec's in
//     the daemon and the CLI, other supervisors' agents in `vigil up`, whose
//     statuses it would steal), and each agent's leader stays owned by
//     os/exec's cmd.Wait. A zombie child that is not a running agent's
//     leader is reaped when it is known to descend from an agent (seen
//     alive with the marker, in an agent's process group, or in a session
//     led by a marked process), or when the process holds no pidfd for it:
//     os.Process keeps one for each child it starts, from the clone that
//     creates it until Wait has reaped it, so a child without one is waited
//     for by nobody (read from /proc/self/fd and fdinfo, only when such a
//     zombie is there). Leaders are registered with it under its lock while
//     they start, so it never mistakes one.
//     A SIGCHLD while every child of the process is a running agent's leader
//     (read from /proc/self/task/*/children) is a leader's exit and needs no
//     scan; the tick catches any child that read missed.
//   - After a leader's exit, one scan of /proc both looks for the
//     generation's leftovers and, when there are none, reaps. As a
//     subreaper, the supervisor reads the environment only of its own
//     descendants that are not under another agent's leader (genScope): a
//     generation's processes can be nowhere else.
//
// # Waiting without a thread per agent (Linux)
//
// One goroutine (fdWatcher) blocks in epoll_wait on every running leader's
// pidfd and on every quiet agent's output pipes. A pidfd turns readable when
// its process exits; only then is cmd.Wait called, which returns at once, so
// os/exec still owns the leader's status but no OS thread sits in a blocked
// wait per agent. An output pipe's copier goroutine starts at the agent's
// first output. An idle agent thus costs its supervising goroutine and a few
// descriptors (issue #6: about 12 KiB per agent after a GC, 18 KiB of RSS
// with the collector's slack, against about 24 KiB for a blocked cmd.Wait
// per child). Without the loop (another OS, or epoll unavailable) each
// leader's goroutine parks on its pidfd, and failing that blocks in
// cmd.Wait.
//
// Limits: a descendant that both clears its environment and leaves the group
// is not found (a cgroup per agent would close this; not done, as a writable
// cgroup is rarely available to an unprivileged supervisor). Where os uses
// no pidfds (Linux before 5.4, or a seccomp filter that forbids them), only
// the known descendants are reaped, and a short-lived setsid()'ed orphan
// that dies unseen between two scans stays a zombie while the supervisor
// runs. A child of this process that is waited for by pid rather than
// through its os.Process (released, or started with syscall.ForkExec) is
// taken for an orphan and may be reaped first. A pid is checked for the
// marker before it is signalled; its reuse in between is not excluded.
// Elsewhere (macOS, BSDs) containment is by process group only; Windows has
// no supervisor (New fails).
package supervisor
