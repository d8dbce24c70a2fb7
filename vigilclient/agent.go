package vigilclient

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// DrainGraceDefault is how long a stopping Agent lets its running handler
// finish before cancelling it and releasing the task: 20s, so that drain,
// release and exit fit inside the 30s a supervisor (vigil's, or Kubernetes')
// gives between SIGTERM and SIGKILL.
const DrainGraceDefault = 20 * time.Second

// abandonWait is how long a stopping Agent waits for a handler it cancelled
// to return before it releases the task anyway and abandons the handler.
const abandonWait = 5 * time.Second

// Causes of a handler's context cancellation, read with context.Cause.
var (
	// ErrLeaseLost: the task's lease is no longer held. Either the server
	// refused a lease heartbeat with 409 stale_epoch (the task was reclaimed
	// or finished), or no renewal was accepted before the lease's own
	// deadline, after which the server may reclaim it at any moment. The
	// cause wraps ErrLeaseLost with which of the two it was.
	ErrLeaseLost = errors.New("lease lost")
	// ErrFenced: no liveness heartbeat was accepted for the alive window
	// (3 × the liveness interval, DESIGN L3), so the server may show this
	// instance stopped and reclaim its task; the agent must not keep
	// working unseen. Also the cause when the server no longer accepts the
	// instance (not_found, invalid_token, instance_exited).
	ErrFenced = errors.New("instance fenced")
	// ErrDraining: the agent is stopping and the handler did not finish
	// within DrainGrace; the task is released.
	ErrDraining = errors.New("agent stopping: drain grace passed")
)

// Handler runs one claimed task and returns its result, which is marshalled
// to JSON and stored with the completion, or an error, whose text is
// recorded as a failure (the server retries the task after a backoff, or
// dead-letters it at max_attempts).
//
// ctx is cancelled when the handler must stop: context.Cause(ctx) is then
// ErrLeaseLost (wrapped), ErrFenced (wrapped) or ErrDraining. A handler
// should return promptly then; whatever it returns is still sent and the
// server decides (a lost lease is refused with 409 and changes nothing).
// A panic is recovered and recorded as a failure.
type Handler func(ctx context.Context, t *Task) (result any, err error)

// Task is a claimed task as a Handler sees it: every vigiltype.Task field
// as the claim returned it, and the id of the instance holding the lease.
type Task struct {
	vigiltype.Task
	// InstanceID is the agent's instance that holds the lease.
	InstanceID string

	activity *activityMark
}

// Activity records evidence that the work is progressing (a tool call, a
// file written) at this moment. From then on the runtime's lease
// heartbeats are schema version 2 and carry the latest such time as
// activity_at, which the server keeps as last_activity_at (DESIGN T4):
// under the activity expiry policy a lease then lasts only while the
// handler keeps reporting progress. Cheap; call it as often as you like.
func (t *Task) Activity() {
	if t.activity != nil {
		t.activity.mark(time.Now())
	}
}

// activityMark is the latest time a handler reported activity, kept on the
// monotonic clock: what is sent is its age (DESIGN T7), which a wall-clock
// step cannot change.
type activityMark struct {
	base  time.Time    // the mark's origin, with its monotonic reading
	since atomic.Int64 // 1 + nanoseconds from base to the latest activity; 0 before the first
}

func newActivityMark() *activityMark { return &activityMark{base: time.Now()} }

func (m *activityMark) mark(t time.Time) { m.since.Store(int64(t.Sub(m.base)) + 1) }

// last returns the latest reported activity, false before the first.
func (m *activityMark) last() (time.Time, bool) {
	n := m.since.Load()
	return m.base.Add(time.Duration(n - 1)), n != 0
}

// age returns how long ago the latest activity was reported, false before
// the first.
func (m *activityMark) age() (time.Duration, bool) {
	at, ok := m.last()
	if !ok {
		return 0, false
	}
	return max(time.Since(at), 0), true
}

// DecodePayload unmarshals the task's JSON payload into v.
func (t *Task) DecodePayload(v any) error {
	if err := json.Unmarshal(t.Payload, v); err != nil {
		return fmt.Errorf("decode payload of %s task %d: %w", t.TaskType, t.TaskID, err)
	}
	return nil
}

// Agent is an always-on worker process of one kind: it registers a process
// instance, keeps it alive with liveness heartbeats, and runs Handlers on
// the tasks it claims, holding each under a lease. See the package
// documentation for its lifecycle. Set the fields, then call Run once; do
// not change them while it runs.
type Agent struct {
	// Kind is the process kind the instance reports under; it also names
	// the VIGIL_<KIND>_* settings (DESIGN L5). Required.
	Kind string
	// Handlers maps each task type the agent claims to its handler. With
	// none, the agent only keeps its liveness row (a producer, say).
	Handlers map[string]Handler
	// Settings are the three intervals; zero fields take their defaults
	// (LivenessIntervalDefault, HeartbeatIntervalDefault,
	// PollIntervalDefault). SettingsFromEnv reads them from the environment.
	Settings Settings
	// Client talks to the server; nil means NewFromEnv().
	Client *Client
	// Logger receives the agent's structured logs; nil means slog.Default().
	Logger *slog.Logger
	// DrainGrace is how long a stopping agent lets a running handler finish
	// (DrainGraceDefault when zero).
	DrainGrace time.Duration
	// Hostname and PID are what the instance registers with; empty means
	// os.Hostname() and os.Getpid().
	Hostname string
	PID      int
	// Concurrency is how many tasks the agent runs at once (0 means 1).
	// With 1 it claims and runs one task at a time. With more it claims up
	// to its free slots in one request (Client.ClaimBatch, at most
	// ClaimBatchMax a request) and runs each task in its own goroutine,
	// each under its own lease with its own heartbeats, cancellation and
	// outcome, exactly as a lone task. Needs a server that knows max_tasks.
	Concurrency int

	mu      sync.Mutex
	inst    string // current instance id
	running bool
}

// AgentFromEnv returns an Agent of kind running handlers, with its Settings
// from SettingsFromEnv(kind) and its Client from NewFromEnv: the
// configuration a deployed agent reads (DESIGN L5). Every bad variable is
// reported.
func AgentFromEnv(kind string, handlers map[string]Handler) (*Agent, error) {
	settings, errS := SettingsFromEnv(kind)
	client, errC := NewFromEnv()
	if err := errors.Join(errS, errC); err != nil {
		return nil, err
	}
	return &Agent{Kind: kind, Handlers: handlers, Settings: settings, Client: client}, nil
}

// InstanceID returns the id of the agent's current process instance, or ""
// before it has registered. It changes when the agent re-registers after
// being fenced.
func (a *Agent) InstanceID() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inst
}

// RunWithSignals is Run stopped by SIGINT or SIGTERM as well as by ctx.
func (a *Agent) RunWithSignals(ctx context.Context) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	return a.Run(ctx)
}

// Run registers the instance and works until ctx is cancelled, then drains
// and records the exit; see the package documentation for every step.
//
// Registration is retried while the server cannot be reached or answers
// 5xx (waiting 1s doubling, up to the liveness interval); a 4xx answer (a
// bad kind, a wrong server token) is returned as an error. Run returns nil
// once it has stopped because ctx was cancelled, also when that happened
// before it could register.
func (a *Agent) Run(ctx context.Context) error {
	r, err := a.newRunner()
	if err != nil {
		return err
	}
	a.mu.Lock()
	if a.running {
		a.mu.Unlock()
		return errors.New("vigilclient: Agent.Run called while it is running")
	}
	a.running = true
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.running = false
		a.mu.Unlock()
	}()

	inst, sent, err := r.register(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	r.resume(inst)
	r.log.Info("registered", "instance_id", inst, "liveness_interval", r.set.LivenessInterval,
		"heartbeat_interval", r.set.HeartbeatInterval, "poll_interval", r.set.PollInterval, "task_types", r.types)

	liveCtx, stopLive := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { r.livenessLoop(liveCtx, sent) })
	if r.slots > 1 {
		r.pollLoopBatch(ctx)
	} else {
		r.pollLoop(ctx)
	}
	stopLive()
	wg.Wait()

	inst, _ = r.current()
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeoutMax)
	defer cancel()
	if _, err := r.client.ProcessExit(ectx, inst); err != nil {
		r.log.Warn("exit not recorded; the instance will show stopped after its alive window", "instance_id", inst, "err", err)
	} else {
		r.log.Info("exited", "instance_id", inst)
	}
	return nil
}

// runner is the state of one Run.
type runner struct {
	a      *Agent
	client *Client
	set    Settings
	grace  time.Duration
	log    *slog.Logger
	types  []string
	host   string
	pid    int
	slots  int // Agent.Concurrency, at least 1

	mu       sync.Mutex
	inst     Instance
	held     map[string]int      // leases being worked or reported, by instance id
	exitLate map[string]Instance // fenced instances to mark exited once they hold none
	fenced   bool
	fenceErr error
	fenceCh  chan struct{} // closed when the current instance is fenced
	resumeCh chan struct{} // closed when a fenced runner resumes under a new instance
}

func (a *Agent) newRunner() (*runner, error) {
	if a.Kind == "" {
		return nil, vigiltype.Invalid("Agent.Kind", "required")
	}
	set := a.Settings.withDefaults()
	if err := set.validate(); err != nil {
		return nil, err
	}
	if a.DrainGrace < 0 {
		return nil, vigiltype.Invalid("Agent.DrainGrace", "must not be negative")
	}
	if a.Concurrency < 0 {
		return nil, vigiltype.Invalid("Agent.Concurrency", "must not be negative")
	}
	client := a.Client
	if client == nil {
		var err error
		if client, err = NewFromEnv(); err != nil {
			return nil, err
		}
	}
	types := make([]string, 0, len(a.Handlers))
	for typ, h := range a.Handlers {
		if h == nil {
			return nil, vigiltype.Invalid("Agent.Handlers["+typ+"]", "must not be nil")
		}
		types = append(types, typ)
	}
	slices.Sort(types)
	host, pid := a.Hostname, a.PID
	if host == "" {
		if h, err := os.Hostname(); err == nil {
			host = h
		} else {
			host = "unknown"
		}
	}
	if pid == 0 {
		pid = os.Getpid()
	}
	return &runner{
		a:        a,
		client:   client,
		set:      set,
		grace:    cmp.Or(a.DrainGrace, DrainGraceDefault),
		log:      cmp.Or(a.Logger, slog.Default()).With("kind", a.Kind),
		types:    types,
		host:     host,
		pid:      pid,
		slots:    max(a.Concurrency, 1),
		fenceCh:  make(chan struct{}),
		resumeCh: make(chan struct{}),
		held:     map[string]int{},
		exitLate: map[string]Instance{},
		fenced:   true, // until the first registration
	}, nil
}

// current returns the instance the runner works as and whether it is fenced.
func (r *runner) current() (Instance, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inst, r.fenced
}

// state is current plus the channels that signal a change of it.
func (r *runner) state() (inst Instance, fenceCh, resumeCh <-chan struct{}, fenced bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inst, r.fenceCh, r.resumeCh, r.fenced
}

// fence stops work under the current instance: no more claims, and the
// running handler's context is cancelled with cause. It reports whether
// this call fenced (false when already fenced).
func (r *runner) fence(cause error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fenced {
		return false
	}
	r.fenced, r.fenceErr = true, cause
	close(r.fenceCh)
	r.resumeCh = make(chan struct{})
	return true
}

// fenceCause is why the runner was last fenced.
func (r *runner) fenceCause() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fenceErr
}

// resume makes inst the current instance and lets work go on.
func (r *runner) resume(inst Instance) {
	r.mu.Lock()
	r.inst, r.fenced, r.fenceErr = inst, false, nil
	r.fenceCh = make(chan struct{})
	close(r.resumeCh)
	r.mu.Unlock()

	r.a.mu.Lock()
	r.a.inst = inst.ID
	r.a.mu.Unlock()
}

func (r *runner) registerParams() RegisterParams {
	return RegisterParams{ProcessKind: r.a.Kind, Hostname: r.host, PID: r.pid, LivenessInterval: r.set.LivenessInterval}
}

// register registers the first instance, retrying transient failures. It
// returns the instance and the local time the accepted request was sent.
func (r *runner) register(ctx context.Context) (Instance, time.Time, error) {
	for n := 1; ; n++ {
		cctx, cancel := context.WithTimeout(ctx, callTimeoutMax)
		sent := time.Now()
		reg, err := r.client.RegisterProcess(cctx, r.registerParams())
		cancel()
		if err == nil {
			return reg.Instance(), sent, nil
		}
		if ctx.Err() != nil {
			return Instance{}, time.Time{}, ctx.Err()
		}
		if !isTransient(err) {
			return Instance{}, time.Time{}, err
		}
		wait := registerBackoff(n, r.set.LivenessInterval)
		r.log.Warn("register failed; retrying", "err", err, "retry_in", wait)
		if !sleepCtx(ctx, wait) {
			return Instance{}, time.Time{}, ctx.Err()
		}
	}
}

// sleepCtx waits d; it reports false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// storeUnavailable reports whether err is the server's 503 unavailable:
// the server answered, and its store could not be reached. Heartbeats so
// answered count toward neither fencing nor losing a lease, because the
// server gives every instance and lease a full window once its store is
// back (DESIGN L8).
func storeUnavailable(err error) bool { return errors.Is(err, vigiltype.ErrUnavailable) }

// instanceGone reports whether err means the server will never again accept
// work from the instance: it was pruned, exited, or the token is not its.
func instanceGone(err error) bool {
	return errors.Is(err, vigiltype.ErrNotFound) || errors.Is(err, vigiltype.ErrInvalidToken) ||
		errors.Is(err, vigiltype.ErrInstanceExited)
}

// beatResult is the answer to one liveness call.
type beatResult struct {
	inst       Instance  // the instance the call was for (the new one for a re-registration)
	old        Instance  // for a re-registration: the fenced instance it replaces
	reregister bool      // the call was a re-registration
	sent       time.Time // local time the request was sent
	err        error
}

// livenessLoop sends a liveness heartbeat every liveness interval until ctx
// ends (DESIGN L2). Each heartbeat runs in its own goroutine with a timeout
// under the interval, so a slow or failed one never delays the next. It
// fences the runner when none was accepted for the alive window, and while
// fenced it tries, once a tick, to register a new instance to resume under.
func (r *runner) livenessLoop(ctx context.Context, registeredSent time.Time) {
	interval := r.set.LivenessInterval
	window := aliveWindow(interval)
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	fenceTimer := time.NewTimer(time.Until(registeredSent.Add(window)))
	defer fenceTimer.Stop()

	results := make(chan beatResult)
	var wg sync.WaitGroup
	defer wg.Wait() // in-flight calls end with ctx
	deliver := func(res beatResult) {
		select {
		case results <- res:
		case <-ctx.Done():
		}
	}

	lastAccepted := registeredSent
	registering := false
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return

		case <-ticker.C:
			inst, fenced := r.current()
			if !fenced {
				wg.Go(func() { deliver(r.beat(ctx, inst)) })
			} else if !registering {
				registering = true
				wg.Go(func() { deliver(r.reregister(ctx, inst)) })
			}

		case res := <-results:
			if res.reregister {
				registering = false
				if res.err != nil {
					r.log.Warn("re-register failed; still fenced", "instance_id", res.old, "err", res.err)
					continue
				}
				lastAccepted, failures = res.sent, 0
				fenceTimer.Reset(time.Until(lastAccepted.Add(window)))
				r.resume(res.inst)
				r.log.Warn("re-registered after fence; resuming", "old_instance_id", res.old, "instance_id", res.inst)
				continue
			}
			cur, fenced := r.current()
			if fenced || res.inst.ID != cur.ID {
				continue // a late answer for an instance already fenced
			}
			if res.err == nil || storeUnavailable(res.err) {
				// A 503 unavailable is as good as an accepted heartbeat for
				// the fence: the server is up and its store is away, so no
				// one can judge this instance until the store is back, and
				// then the server gives it a full alive window (DESIGN L8).
				if res.err != nil {
					r.log.Warn("liveness heartbeat not recorded: the server's store is unavailable; not fenced, the server gives a full window once it is back",
						"instance_id", cur, "err", res.err)
				} else {
					failures = 0
				}
				if res.sent.After(lastAccepted) {
					lastAccepted = res.sent
					fenceTimer.Reset(time.Until(lastAccepted.Add(window)))
				}
				continue
			}
			failures++
			if instanceGone(res.err) {
				r.fenceAndLog(fmt.Errorf("%w: the server no longer accepts instance %s: %w", ErrFenced, cur.ID, res.err))
				continue
			}
			r.log.Warn("liveness heartbeat failed", "instance_id", cur, "failures", failures,
				"fence_in", time.Until(lastAccepted.Add(window)).Round(time.Millisecond), "err", res.err)

		case <-fenceTimer.C:
			if _, fenced := r.current(); fenced {
				continue
			}
			if fenceNeeded(time.Now(), lastAccepted, window) {
				r.fenceAndLog(fmt.Errorf("%w: no liveness heartbeat accepted within the alive window of %s", ErrFenced, window))
			} else {
				fenceTimer.Reset(time.Until(lastAccepted.Add(window)))
			}
		}
	}
}

func (r *runner) fenceAndLog(cause error) {
	inst, _ := r.current()
	if r.fence(cause) {
		r.log.Error("fenced: stopped claiming and cancelled the running handler; will re-register when the server answers",
			"instance_id", inst, "reason", cause)
	}
}

// beat sends one liveness heartbeat for inst.
func (r *runner) beat(ctx context.Context, inst Instance) beatResult {
	ctx, cancel := context.WithTimeout(ctx, callTimeout(r.set.LivenessInterval))
	defer cancel()
	sent := time.Now()
	_, err := r.client.ProcessHeartbeat(ctx, inst)
	return beatResult{inst: inst, sent: sent, err: err}
}

// reregister registers a fresh instance to replace the fenced old one, then
// marks old exited (best effort) so it shows stopped at once and any task
// it still holds is reclaimed without waiting out its lease.
func (r *runner) reregister(ctx context.Context, old Instance) beatResult {
	ctx, cancel := context.WithTimeout(ctx, callTimeout(r.set.LivenessInterval))
	defer cancel()
	sent := time.Now()
	reg, err := r.client.RegisterProcess(ctx, r.registerParams())
	if err != nil {
		return beatResult{old: old, reregister: true, sent: sent, err: err}
	}
	if n := r.exitWhenDone(old); n > 0 {
		// Marking it exited now would let the server reclaim its tasks at
		// once, while their results are still on their way: a fenced agent
		// still delivers results for leases the server has not moved on.
		r.log.Info("fenced instance still holds leases; it is marked exited once their outcomes are sent",
			"instance_id", old, "leases", n)
		return beatResult{inst: reg.Instance(), old: old, reregister: true, sent: sent}
	}
	r.markExited(ctx, old)
	return beatResult{inst: reg.Instance(), old: old, reregister: true, sent: sent}
}

// markExited marks a fenced instance exited (best effort), so it shows
// stopped at once and any task it still holds is reclaimed without waiting
// out its lease. The exit has a budget of its own: a slow registration must
// not leave the old instance showing alive until its TTL.
func (r *runner) markExited(ctx context.Context, old Instance) {
	exitCtx, cancelExit := context.WithTimeout(context.WithoutCancel(ctx), callTimeout(r.set.LivenessInterval))
	defer cancelExit()
	if _, err := r.client.ProcessExit(exitCtx, old); err != nil {
		r.log.Debug("could not mark the fenced instance exited", "instance_id", old, "err", err)
	}
}

// exitWhenDone returns how many leases inst still holds; when it holds
// any, inst is marked exited when the last one's outcome has been sent
// (release).
func (r *runner) exitWhenDone(inst Instance) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.held[inst.ID]
	if n > 0 {
		r.exitLate[inst.ID] = inst
	}
	return n
}

// hold counts a lease of inst from its claim until its outcome was sent;
// the returned func ends it, and marks inst exited if it was fenced and
// replaced meanwhile and this was its last lease.
func (r *runner) hold(inst Instance) (done func()) {
	r.mu.Lock()
	r.held[inst.ID]++
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		r.held[inst.ID]--
		n := r.held[inst.ID]
		old, late := r.exitLate[inst.ID]
		if n == 0 {
			delete(r.held, inst.ID)
			delete(r.exitLate, inst.ID)
		}
		r.mu.Unlock()
		if n == 0 && late {
			r.markExited(context.Background(), old)
		}
	}
}

// pollLoop claims and runs one task at a time until stop ends; it returns
// once the last task is finished or released.
func (r *runner) pollLoop(stop context.Context) {
	if len(r.types) == 0 {
		<-stop.Done()
		return
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-stop.Done():
			return
		case <-timer.C:
		}
		if stop.Err() != nil {
			return // both were ready and select chose the timer: claim nothing more
		}
		inst, fenceCh, resumeCh, fenced := r.state()
		if fenced {
			select {
			case <-stop.Done():
				return
			case <-resumeCh:
			}
			timer.Reset(0)
			continue
		}
		// The claim is not cancelled by stop: a claim the server made but
		// whose answer was dropped would leave the task to the reclaimer.
		// A task claimed after stop is released at once instead.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(stop), callTimeoutMax)
		sent := time.Now()
		task, err := r.client.Claim(cctx, inst, r.types)
		cancel()
		switch {
		case err != nil:
			if instanceGone(err) {
				r.fenceAndLog(fmt.Errorf("%w: the server no longer accepts instance %s: %w", ErrFenced, inst.ID, err))
			} else if stop.Err() == nil {
				r.log.Warn("claim failed", "instance_id", inst, "err", err)
			}
			timer.Reset(r.set.PollInterval)
		case task == nil:
			timer.Reset(r.set.PollInterval)
		case stop.Err() != nil:
			r.release(stop, r.taskLog(inst, task), inst.Lease(task))
			return
		default:
			r.runTask(stop, inst, fenceCh, task, sent, r.completeOne)
			timer.Reset(0) // look for more work at once
		}
	}
}

func (r *runner) taskLog(inst Instance, t *vigiltype.Task) *slog.Logger {
	return r.log.With("task_id", t.TaskID, "task_type", t.TaskType, "lease_epoch", t.LeaseEpoch, "instance_id", inst)
}

// outcome is what a handler returned.
type outcome struct {
	result any
	err    error
	stack  []byte // set when the handler panicked
}

func callHandler(ctx context.Context, h Handler, t *Task) (o outcome) {
	defer func() {
		if p := recover(); p != nil {
			o = outcome{err: fmt.Errorf("handler panicked: %v", p), stack: debug.Stack()}
		}
	}()
	res, err := h(ctx, t)
	return outcome{result: res, err: err}
}

// runTask runs the handler for a claimed task while a lease keeper renews
// the lease, then reports the outcome. If stop ends meanwhile it drains:
// the handler gets DrainGrace to finish; after that it is cancelled with
// ErrDraining and the task is released.
func (r *runner) runTask(stop context.Context, inst Instance, fenceCh <-chan struct{}, task *vigiltype.Task, claimSent time.Time, complete completeFunc) {
	claimReceived := time.Now() // no earlier than the claim's answer arrived
	defer r.hold(inst)()
	lease := inst.Lease(task)
	log := r.taskLog(inst, task)
	window, known := leaseWindow(task)
	log.Info("claimed", "attempts", task.Attempts, "reclaims", task.Reclaims, "lease_window", window)
	if known && r.set.HeartbeatInterval >= window {
		log.Warn("lease heartbeat interval is not shorter than the lease window: the lease will lapse",
			"heartbeat_interval", r.set.HeartbeatInterval, "lease_window", window)
	}

	hctx, cancelHandler := context.WithCancelCause(context.WithoutCancel(stop))
	defer cancelHandler(nil)
	done := make(chan outcome, 1)
	activity := newActivityMark()
	go func() {
		done <- callHandler(hctx, r.a.Handlers[task.TaskType], &Task{Task: *task, InstanceID: inst.ID, activity: activity})
	}()

	keepCtx, stopKeeper := context.WithCancel(context.WithoutCancel(stop))
	var keeper sync.WaitGroup
	var keepUntil time.Time // read after keeper.Wait
	keeper.Go(func() {
		keepUntil = r.keepLease(keepCtx, lease, window, known, claimSent, claimReceived, fenceCh, cancelHandler, activity, log)
	})
	defer func() { stopKeeper(); keeper.Wait() }()

	stopCh := stop.Done()
	var graceC <-chan time.Time
	for {
		select {
		case o := <-done:
			stopKeeper()
			keeper.Wait() // no lease heartbeat races the outcome
			if o.err != nil && errors.Is(context.Cause(hctx), ErrFenced) {
				// The runtime stopped the handler because it could not
				// reach the server, not because the work failed: hand the
				// task back without counting an attempt (a server restart
				// must never dead-letter healthy work).
				log.Warn("handler stopped by the fence: releasing the task, no attempt counted", "err", o.err)
				r.sendOutcome(stop, log, "release", keepUntil, func(ctx context.Context) error {
					_, err := r.client.Release(ctx, lease)
					return err
				})
				return
			}
			r.report(stop, log, lease, o, complete, keepUntil)
			return

		case <-stopCh:
			stopCh = nil
			log.Info("draining: waiting for the handler to finish", "grace", r.grace)
			grace := time.NewTimer(r.grace)
			defer grace.Stop()
			graceC = grace.C

		case <-graceC:
			log.Warn("drain grace passed: cancelling the handler and releasing the task", "grace", r.grace)
			cancelHandler(ErrDraining)
			abandon := time.NewTimer(abandonWait)
			select {
			case <-done:
			case <-abandon.C:
				log.Error("handler ignored cancellation; abandoning it", "waited", abandonWait)
			}
			abandon.Stop()
			stopKeeper()
			keeper.Wait()
			r.release(stop, log, lease)
			return
		}
	}
}

// leaseHeartbeat sends one lease heartbeat: v2 with the age of the
// handler's latest activity once it reported any (activity_age_ms, so this
// host's clock cannot make the server refuse it or shorten the lease,
// DESIGN T7), else v1. A server that predates activity_age_ms refuses it as
// invalid: the activity is then sent as activity_at, and if that is refused
// too (the clocks disagree) the heartbeat goes as v1, so the lease is kept.
func (r *runner) leaseHeartbeat(ctx context.Context, lease Lease, activity *activityMark, log *slog.Logger) (*vigiltype.Task, error) {
	age, ok := activity.age()
	if !ok {
		return r.client.TaskHeartbeat(ctx, lease)
	}
	t, err := r.client.TaskHeartbeatAge(ctx, lease, age)
	if !errors.Is(err, vigiltype.ErrInvalid) {
		return t, err
	}
	at, _ := activity.last()
	t, err = r.client.TaskHeartbeatV2(ctx, lease, at)
	if errors.Is(err, vigiltype.ErrInvalid) {
		log.Warn("activity heartbeat refused; sent without activity", "activity_at", at, "err", err)
		return r.client.TaskHeartbeat(ctx, lease)
	}
	return t, err
}

// leaseBeat is the answer to one lease heartbeat.
type leaseBeat struct {
	task     *vigiltype.Task
	sent     time.Time // local time the request was sent
	received time.Time // local time its answer arrived
	err      error
}

// keepLease renews lease every heartbeat interval until ctx ends (DESIGN
// T3), each renewal in its own goroutine with a timeout under the interval.
//
// It cancels the handler when the server refuses the lease (409 stale
// epoch, or the task or instance is gone) and then stops. It also cancels
// the handler when the agent itself can no longer vouch for the lease — no
// renewal accepted before the local lease deadline, or the instance fenced —
// but then keeps asking the server until the handler returns or the server
// gives its verdict: the server arbitrates, and a holder that was frozen
// learns from the 409 that its task was handed on.
//
// It returns the instant the lease is surely over on the server
// (leaseSurelyOver of the last accepted renewal, or of the claim): until
// then a finished result is worth sending.
func (r *runner) keepLease(ctx context.Context, lease Lease, window time.Duration, known bool, claimSent, claimReceived time.Time,
	fenceCh <-chan struct{}, cancelHandler context.CancelCauseFunc, activity *activityMark, log *slog.Logger) (keepUntil time.Time) {
	keepUntil = leaseSurelyOver(claimReceived, leaseWindowUnknown)
	if known {
		keepUntil = leaseSurelyOver(claimReceived, window)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends in-flight renewals before wg.Wait

	interval := r.set.HeartbeatInterval
	ticker := time.NewTicker(interval)
	defer ticker.Stop()

	var deadline time.Time
	var deadlineC <-chan time.Time
	var deadlineTimer *time.Timer
	setDeadline := func(d time.Time) {
		deadline = d
		if deadlineTimer == nil {
			deadlineTimer = time.NewTimer(time.Until(d))
			deadlineC = deadlineTimer.C
		} else {
			deadlineTimer.Reset(time.Until(d))
		}
	}
	defer func() {
		if deadlineTimer != nil {
			deadlineTimer.Stop()
		}
	}()
	if known {
		setDeadline(leaseDeadline(claimSent, window))
	}

	lost := func(cause error) {
		cancelHandler(cause)
		log.Warn("lease lost", "reason", cause.Error())
	}
	results := make(chan leaseBeat)
	for {
		select {
		case <-ctx.Done():
			return

		case <-fenceCh:
			cause := r.fenceCause()
			cancelHandler(cause)
			log.Warn("handler cancelled: instance fenced", "reason", cause.Error())
			fenceCh = nil // asked and answered; keep renewing for the verdict

		case <-ticker.C:
			wg.Go(func() {
				cctx, cancel := context.WithTimeout(ctx, callTimeout(interval))
				defer cancel()
				sent := time.Now()
				t, err := r.leaseHeartbeat(cctx, lease, activity, log)
				select {
				case results <- leaseBeat{task: t, sent: sent, received: time.Now(), err: err}:
				case <-ctx.Done():
				}
			})

		case b := <-results:
			switch {
			case b.err == nil || storeUnavailable(b.err):
				// A 503 unavailable keeps the lease as an accepted renewal
				// does: the server renews every lease alive before the
				// outage for a full window once its store is back (DESIGN L8).
				if b.err != nil {
					log.Warn("lease heartbeat not recorded: the server's store is unavailable; the lease is kept, the server renews it once the store is back", "err", b.err)
				}
				if w, ok := leaseWindow(b.task); ok {
					window, known = w, true
				}
				if d := leaseDeadline(b.sent, window); known && d.After(deadline) {
					setDeadline(d)
				}
				if u := leaseSurelyOver(b.received, window); known && u.After(keepUntil) {
					keepUntil = u
				}
			case errors.Is(b.err, vigiltype.ErrStaleEpoch):
				log.Warn("lease heartbeat refused: stale epoch (the task was reclaimed or finished)")
				lost(fmt.Errorf("%w: stale epoch (the task was reclaimed or finished)", ErrLeaseLost))
				return
			case errors.Is(b.err, vigiltype.ErrInvalidToken) || errors.Is(b.err, vigiltype.ErrInstanceExited):
				r.fenceAndLog(fmt.Errorf("%w: the server no longer accepts instance %s: %w", ErrFenced, lease.Instance.ID, b.err))
				lost(fmt.Errorf("%w: %w", ErrLeaseLost, b.err))
				return
			case errors.Is(b.err, vigiltype.ErrNotFound):
				lost(fmt.Errorf("%w: task not found", ErrLeaseLost))
				return
			case ctx.Err() == nil:
				log.Warn("lease heartbeat failed", "err", b.err, "deadline_in", time.Until(deadline).Round(time.Millisecond))
			}

		case <-deadlineC:
			if leaseExpired(time.Now(), deadline) {
				lost(fmt.Errorf("%w: no renewal accepted within the lease window of %s", ErrLeaseLost, window))
				deadlineC = nil // keep renewing for the server's verdict
				continue
			}
			deadlineTimer.Reset(time.Until(deadline))
		}
	}
}

// report sends the handler's outcome: complete with the result, or fail
// with the error text. A result that does not marshal is a failure. The
// outcome is kept until the server accepts or refuses it, or until
// keepUntil, when the lease is surely over (sendOutcome).
func (r *runner) report(stop context.Context, log *slog.Logger, lease Lease, o outcome, complete completeFunc, keepUntil time.Time) {
	if o.err == nil {
		raw, err := json.Marshal(o.result)
		if err == nil {
			r.sendOutcome(stop, log, "complete", keepUntil, func(ctx context.Context) error {
				return complete(ctx, lease, json.RawMessage(raw))
			})
			return
		}
		o.err = fmt.Errorf("marshal result: %w", err)
	}
	if o.stack != nil {
		log.Error("handler panicked", "err", o.err, "stack", string(o.stack))
	}
	msg := o.err.Error()
	r.sendOutcome(stop, log.With("error", msg), "fail", keepUntil, func(ctx context.Context) error {
		_, err := r.client.Fail(ctx, lease, msg, 0)
		return err
	})
}

// completeFunc sends one task's completion: r.completeOne, or a batcher's
// complete that joins completions finishing together (Concurrency > 1).
type completeFunc func(ctx context.Context, lease Lease, result json.RawMessage) error

// completeOne completes one task in a request of its own.
func (r *runner) completeOne(ctx context.Context, lease Lease, result json.RawMessage) error {
	_, err := r.client.Complete(ctx, lease, result)
	return err
}

var outcomeLogs = map[string]string{"complete": "completed", "fail": "failure recorded", "release": "released"}

// release gives a held task back (drain, or a task claimed after stop),
// retrying for releaseRetryBudget: the lease lapses anyway.
func (r *runner) release(stop context.Context, log *slog.Logger, lease Lease) {
	r.sendOutcome(stop, log, "release", time.Now().Add(releaseRetryBudget), func(ctx context.Context) error {
		_, err := r.client.Release(ctx, lease)
		return err
	})
}

// outcomeStopBudget is how long a stopping agent keeps retrying an outcome
// the server cannot take, so that Run returns within a supervisor's stop
// grace.
const outcomeStopBudget = 5 * time.Second

// sendOutcome sends one outcome call (verb: complete, fail or release) and
// keeps it until the server answers (DESIGN T8): while the server cannot be
// reached or answers 5xx (503 unavailable included) it is sent again,
// waiting outcomeBackoff, until keepUntil — for a complete or fail, the
// instant the lease is surely over — or, once stop has ended, for at most
// outcomeStopBudget more. complete and fail are idempotent for the holder,
// so a retry whose first try landed gets 200. 409 stale_epoch is final: the
// server, which arbitrates, says the lease was lost, and the call changed
// nothing; 409 outcome_conflict and other 4xx are final too.
func (r *runner) sendOutcome(stop context.Context, log *slog.Logger, verb string, keepUntil time.Time, call func(context.Context) error) {
	var stopBy time.Time
	for n := 1; ; n++ {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeoutMax)
		err := call(ctx)
		cancel()
		switch {
		case err == nil:
			if n > 1 {
				log.Info(outcomeLogs[verb], "attempts", n)
			} else {
				log.Info(outcomeLogs[verb])
			}
			return
		case errors.Is(err, vigiltype.ErrStaleEpoch):
			log.Warn(verb + " refused: lease lost (stale epoch)")
			return
		case errors.Is(err, vigiltype.ErrOutcomeConflict):
			log.Error(verb+" refused: the task already holds a different outcome from this lease", "err", err)
			return
		case !isTransient(err):
			log.Error(verb+" failed", "err", err, "attempts", n)
			return
		}
		now := time.Now()
		if stopBy.IsZero() && stop.Err() != nil {
			stopBy = now.Add(outcomeStopBudget)
		}
		if outcomeGiveUp(now, keepUntil, stopBy) {
			reason := "the lease window has passed since the last accepted renewal: the server may hand the task on"
			switch {
			case verb == "release":
				reason = "the lease lapses on its own"
			case now.Before(keepUntil):
				reason = "the agent is stopping"
			}
			log.Error(verb+" not delivered: gave up", "reason", reason, "attempts", n, "err", err)
			return
		}
		wait := outcomeBackoff(n)
		if until := keepUntil.Sub(now); until < wait {
			wait = max(until, 0) // one last try when the lease is surely over
		}
		log.Warn(verb+" failed; retrying", "err", err, "retry_in", wait, "keep_until", keepUntil.Format(time.RFC3339Nano))
		time.Sleep(wait)
	}
}
