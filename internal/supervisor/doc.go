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
//	  (any state) ───► stopping: SIGTERM to the group, StopGrace,
//	                   SIGKILL to the group, leader reaped ───► stopped
//
// The delay follows DESIGN S2: Min (5s) after a healthy run or the first
// fast failure, doubling for each further run shorter than FastFailure (30s),
// capped at Max (300s). A launch failure counts as a fast failure. Delays are
// decided by BackoffTracker, a plain type with no clock.
//
// Stopping (DESIGN S3) treats the process group as the unit: SIGTERM goes to
// the whole group; the group has StopGrace (10s) for its leader to exit and
// every other member to be gone; then SIGKILL goes to the group. Run returns
// only when every child is reaped and no process of any group is running.
// The same sequence clears processes an agent leaves in its group when it
// exits on its own, so that restarts do not pile up orphans.
package supervisor
