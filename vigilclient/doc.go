// Package vigilclient is vigil's Go SDK: a typed client for the HTTP API
// (docs/api.md) and an agent runtime in which an agent is a handler
// function (DESIGN §7).
//
// It depends only on the standard library and vigiltype, never on the
// server's internal packages.
//
// # Client
//
// New returns a Client for one or more server URLs; NewFromEnv reads them
// from VIGIL_URL (comma-separated, default http://127.0.0.1:7711), the
// server token from the file named by VIGIL_TOKEN_FILE and, for an https://
// server whose certificate a private CA signed, the CA certificates from
// the file named by VIGIL_CA_FILE (LoadCAFile and WithTLSConfig in code).
// There is one method per endpoint. Durations are time.Duration and go over the wire in seconds.
// An error answer is an *APIError; errors.Is matches it against vigiltype's
// sentinels:
//
//	_, err := c.Complete(ctx, lease, result)
//	if errors.Is(err, vigiltype.ErrStaleEpoch) {
//		// the lease was reclaimed: the completion changed nothing
//	}
//
// # Agent lifecycle
//
// Agent.Run keeps three signals on three separate timers, each from its own
// setting (DESIGN §1, L5):
//
//	liveness heartbeat   every LivenessInterval   "this OS process is up"
//	lease heartbeat      every HeartbeatInterval  "I still hold this task" (only while one is held)
//	claim                every PollInterval       while idle; at once again after a task
//
// Run proceeds as follows.
//
//  1. Register: POST /v1/processes with the kind, hostname, pid and the
//     liveness interval. Retried while the server is unreachable.
//  2. Liveness: every LivenessInterval a heartbeat, each in its own
//     goroutine with a timeout under the interval, so a hung call never
//     delays the next.
//  3. Poll: claim one task of the Handlers' types; none → wait
//     PollInterval; one → run its handler, then claim again at once.
//     With Agent.Concurrency n > 1, one request claims up to the free
//     slots (Client.ClaimBatch) and each task runs in its own goroutine,
//     steps 4 and 5 per task; a finished task frees a slot and the agent
//     claims again at once, a short batch (the queue is empty) waits
//     PollInterval.
//  4. Lease: while a handler runs, a lease heartbeat every HeartbeatInterval
//     carrying the epoch. The handler's context is cancelled with cause
//     ErrLeaseLost when the server answers 409 stale_epoch, or when the
//     lease deadline passes without an accepted renewal. The deadline is
//     kept on the local monotonic clock: the local time the last accepted
//     renewal (or the claim) was sent plus the lease window the server
//     granted in its answer (lease_expires_at - last_heartbeat_at, both
//     server times), so clock skew between hosts does not matter.
//  5. Outcome: a nil error completes the task with the result marshalled to
//     JSON; an error fails it with the error's text. The outcome is sent
//     even after the lease was lost: the server arbitrates, and refuses a
//     stale one with 409, logged as "complete refused: lease lost (stale
//     epoch)" and not retried. A finished result is kept until the server
//     accepts or refuses it (DESIGN T8): while the server cannot be reached
//     or answers 5xx (503 unavailable: its store is down) the call is sent
//     again, 250ms doubling to 4s apart, for as long as the lease may still
//     be valid — until the lease window has surely passed since the answer
//     to the last accepted renewal (then "complete not delivered: gave up"
//     says why), or, once the agent is stopping, for 5 more seconds.
//     Complete and fail are idempotent for the holder, so a retry whose
//     first try landed (its answer was lost) is answered 200; another
//     result for the same lease is refused with 409 outcome_conflict. The
//     server sets and clears the instance's current task itself (DESIGN
//     L6).
//  6. Stop (ctx cancelled, e.g. by signal.NotifyContext or RunWithSignals):
//     no more claims; the liveness and lease heartbeats go on while the
//     running handler gets DrainGrace to finish. If it does not, its context
//     is cancelled with ErrDraining, it gets a few more seconds to return,
//     and the task is released (back to scheduled, no attempt counted).
//     Then POST exit, so the instance shows stopped at once, and Run returns.
//
// # Fencing
//
// The server shows an instance stopped once 3 × its liveness interval (the
// alive window) passes without a heartbeat, and then reclaims its task
// (DESIGN L3, docs/api.md Reclaim). An agent that cannot reach the server
// must therefore not go on working unseen: when no liveness heartbeat was
// accepted for the alive window (counted from when the last accepted one
// was sent, so the agent stops no later than the server gives up on it),
// or when the server no longer accepts the instance at all (not_found,
// invalid_token, instance_exited), the agent is fenced: it stops claiming
// and cancels its running handler with cause ErrFenced.
//
// While fenced it keeps trying, once every liveness interval, and the way
// back is a new instance: it registers a fresh instance_id (the old row may
// already show stopped and its task may be in other hands, so reviving it
// would misreport history), marks the old instance exited (best effort) —
// once the outcomes of the leases it still holds were sent, so that a
// fenced agent still delivers results for leases the server has not moved
// on — and resumes claiming. Agent.InstanceID reports the new id; the switch is
// logged as "re-registered after fence; resuming".
//
// # Settings
//
// SettingsFromEnv(kind) reads VIGIL_<KIND>_LIVENESS_INTERVAL (default 30s),
// VIGIL_<KIND>_HEARTBEAT_INTERVAL (default 60s) and
// VIGIL_<KIND>_POLL_INTERVAL (default 5s), KIND upper-cased with '-' and '.'
// turned into '_' (DESIGN L5). A value is a Go duration ("30s") or a plain
// number of seconds ("30", "0.5"); anything else, zero, negative, NaN or
// infinite is an error naming the variable.
package vigilclient
