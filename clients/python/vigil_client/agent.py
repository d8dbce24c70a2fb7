"""The agent runtime: the Go SDK's Agent, in Python threads.

An agent is a dict of handlers, one per task type. ``Agent.run()`` keeps
three signals on three separate timers, each from its own setting (DESIGN
§1, L5):

====================  ====================  ======================================
liveness heartbeat    liveness_interval     "this OS process is up" (own thread)
lease heartbeat       heartbeat_interval    "I still hold this task" (only while held)
claim                 poll_interval         while idle; at once again after a task
====================  ====================  ======================================

1. Register: ``POST /v1/processes`` with kind, hostname, pid and the
   liveness interval; retried while the server is unreachable or answers
   5xx (1s doubling, up to the liveness interval); a 4xx answer is raised.
2. Liveness: every liveness interval a heartbeat, each in its own thread
   with a timeout under the interval, so a hung call never delays the next.
3. Poll: claim one task of the handlers' types; none → wait poll_interval;
   one → run its handler in a thread, then claim again at once.
4. Lease: while a handler runs, a lease heartbeat thread renews the lease
   every heartbeat interval carrying the epoch. The handler's
   ``task.cancelled`` event is set, with ``task.cancel_cause`` a
   LeaseLostError, when the server answers 409 stale_epoch or when the
   lease deadline passes without an accepted renewal. The deadline is kept
   on the local monotonic clock: when the last accepted renewal (or the
   claim) was sent plus the window the server granted
   (lease_expires_at - last_heartbeat_at, both server times).
5. Outcome: a returned value completes the task (JSON-encoded); a raised
   exception fails it with the exception's text. The outcome is sent even
   after the lease was lost: the server arbitrates and refuses a stale one
   with 409, logged as "complete refused: lease lost (stale epoch)" and not
   retried. Unreachable server or 5xx: retried a few times.
6. Stop (``agent.stop()``, or SIGTERM/SIGINT under ``run_with_signals``):
   no more claims; liveness and lease heartbeats go on while the running
   handler gets ``drain_grace`` (20s) to finish. If it does not, it is
   cancelled with DrainingError, gets 5 more seconds, and the task is
   released. Then the instance is marked exited, so it shows stopped at once.

Fencing: when no liveness heartbeat was accepted for the alive window (3 ×
the liveness interval, counted from when the last accepted one was sent), or
the server no longer accepts the instance (not_found, invalid_token,
instance_exited), the agent stops claiming and cancels its handler with
FencedError. While fenced it tries once a liveness interval to register a
fresh instance, marks the old one exited (best effort) and resumes.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import socket
import threading
import time
import traceback
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from . import _decide as decide
from .client import Client, Instance, Lease, Row
from .errors import (
    CODE_INSTANCE_EXITED,
    CODE_INVALID_TOKEN,
    BadRequestError,
    DrainingError,
    FencedError,
    LeaseLostError,
    NotFoundError,
    OutcomeConflictError,
    VigilError,
    is_instance_gone,
    is_store_unavailable,
)
from .settings import Settings, SettingsError, settings_from_env

DRAIN_GRACE_DEFAULT = 20.0
"""Seconds a stopping agent lets its running handler finish before cancelling
it and releasing the task: drain, release and exit fit inside the 30s a
supervisor gives between SIGTERM and SIGKILL."""

ABANDON_WAIT = 5.0
"""Seconds a stopping agent waits for a handler it cancelled to return
before releasing the task anyway and abandoning the handler."""

Handler = Callable[["Task"], Any]
"""A handler runs one claimed task and returns its result (any JSON value),
or raises to record a failure."""

_STOP = object()


class Task:
    """A claimed task as a handler sees it.

    Attributes:
        id, type, payload, epoch, attempts, reclaims: from the claim's answer.
        row: the whole task row as the claim returned it.
        instance_id: the agent's instance holding the lease.
        lease: the Lease, for direct Client calls.
        cancelled: a threading.Event set when the handler must stop; then
            ``cancel_cause`` says why (LeaseLostError, FencedError or
            DrainingError). Whatever the handler returns afterwards is still
            sent, and the server decides.
    """

    def __init__(self, row: Row, instance: Instance, runner: "_Runner") -> None:
        self.row = row
        self.id: int = int(row["task_id"])
        self.type: str = row.get("task_type", "")
        self.payload: Any = row.get("payload")
        self.epoch: int = int(row["lease_epoch"])
        self.attempts: int = int(row.get("attempts") or 0)
        self.reclaims: int = int(row.get("reclaims") or 0)
        self.instance_id: str = instance.id
        self.lease: Lease = instance.lease(row)
        self.cancelled = threading.Event()
        self._cause: Optional[BaseException] = None
        self._activity_at: Optional[datetime] = None  # last activity the server accepted
        self._activity_mono: Optional[float] = None  # the same on the monotonic clock
        self._lock = threading.Lock()
        self._runner = runner
        self._keep_until = 0.0  # monotonic: until when a finished result is sent (runtime)

    def __repr__(self) -> str:
        return f"Task(id={self.id}, type={self.type!r}, epoch={self.epoch}, instance_id={self.instance_id!r})"

    @property
    def cancel_cause(self) -> Optional[BaseException]:
        """Why the handler was cancelled (the first cause wins), or None."""
        with self._lock:
            return self._cause

    def sleep(self, seconds: float) -> bool:
        """Waits seconds unless cancelled first; True if the full time passed."""
        return not self.cancelled.wait(seconds)

    def check_cancelled(self) -> None:
        """Raises the cancellation cause if the handler was cancelled."""
        cause = self.cancel_cause
        if cause is not None:
            raise cause

    def activity(self) -> Optional[Row]:
        """Reports progress now: a v2 lease heartbeat with activity_at = the
        current time (DESIGN T4), sent at once from the calling thread. It
        also renews the lease. Returns the task row the server sent back.

        Once the server has accepted one, the runtime's periodic lease
        heartbeats are v2 as well and carry the time of the last activity
        reported, never their own: under the server's ``--lease-expiry
        activity`` a handler that stops reporting progress lets its lease
        lapse, however alive the process is. Until then they are v1.

        Raises what the server answered: LeaseLostError (the lease is gone;
        the handler is cancelled with it), BadRequestError (e.g. a server
        without v2 heartbeats), or another VigilError. Call it at points of
        real progress, not in a tight loop: each call is one request."""
        return self._runner.activity(self)

    @property
    def last_activity(self) -> Optional[datetime]:
        """The time of the last activity() the server accepted, or None."""
        with self._lock:
            return self._activity_at

    @property
    def _activity_age(self) -> Optional[float]:
        """Seconds since the last accepted activity, on the monotonic clock."""
        with self._lock:
            if self._activity_mono is None:
                return None
            return max(0.0, time.monotonic() - self._activity_mono)

    def _set_activity(self, at: datetime, mono: float) -> None:
        with self._lock:
            if self._activity_at is None or at > self._activity_at:
                self._activity_at = at
            if self._activity_mono is None or mono > self._activity_mono:
                self._activity_mono = mono

    def _cancel(self, cause: BaseException) -> bool:
        with self._lock:
            if self._cause is not None:
                return False
            self._cause = cause
        self.cancelled.set()
        return True


class Agent:
    """An always-on worker process of one kind.

    ``Agent(kind, handlers)`` reads its settings from the environment
    (``VIGIL_<KIND>_LIVENESS_INTERVAL``, ``_HEARTBEAT_INTERVAL``,
    ``_POLL_INTERVAL``) and its client from ``VIGIL_URL``,
    ``VIGIL_TOKEN_FILE`` and ``VIGIL_CA_FILE``, unless settings or client are given; every bad
    variable is reported at once as a SettingsError naming it. With no
    handlers the agent only keeps its liveness row (a producer, say).

    Run it once with ``run()`` (stopped by ``stop()`` from another thread) or
    ``run_with_signals()`` (also stopped by SIGTERM and SIGINT).
    """

    def __init__(
        self,
        kind: str,
        handlers: Optional[Mapping[str, Handler]] = None,
        *,
        settings: Optional[Settings] = None,
        client: Optional[Client] = None,
        logger: Optional[logging.Logger] = None,
        drain_grace: float = DRAIN_GRACE_DEFAULT,
        hostname: Optional[str] = None,
        pid: Optional[int] = None,
    ) -> None:
        if not kind:
            raise ValueError("Agent.kind: required")
        handlers = dict(handlers or {})
        for typ, h in handlers.items():
            if not callable(h):
                raise ValueError(f"Agent.handlers[{typ!r}]: must be callable")
        if drain_grace < 0:
            raise ValueError("Agent.drain_grace: must not be negative")
        errs: List[ValueError] = []
        if settings is None:
            try:
                settings = settings_from_env(kind)
            except SettingsError as e:
                errs.extend(e.errors)
        else:
            settings.validate()
        if client is None:
            try:
                client = Client.from_env()
            except SettingsError as e:
                errs.extend(e.errors)
        if errs:
            raise SettingsError(errs)
        assert settings is not None and client is not None
        self.kind = kind
        self.handlers: Dict[str, Handler] = handlers
        self.settings = settings
        self.client = client
        self.logger = logger or logging.getLogger("vigil_client")
        self.drain_grace = drain_grace or DRAIN_GRACE_DEFAULT
        self.hostname = hostname or socket.gethostname() or "unknown"
        self.pid = pid or os.getpid()

        self._cv = threading.Condition()
        self._stopping = False
        self._running = False
        self._runner: Optional[_Runner] = None
        self._signalled: Optional[int] = None

    @property
    def instance_id(self) -> Optional[str]:
        """The current instance's id; None before registering. It changes when
        the agent re-registers after being fenced."""
        with self._cv:
            r = self._runner
        return r.instance_id() if r else None

    def stop(self) -> None:
        """Asks the agent to stop: no more claims, drain the running handler,
        mark the instance exited. Returns at once; run() returns when done.
        Final: a stopped Agent does not run again."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()

    def activity(self) -> Optional[Row]:
        """Task.activity() for the task the agent is running; None when it
        holds none."""
        with self._cv:
            r = self._runner
        task = r.current_task() if r else None
        return task.activity() if task else None

    def run(self) -> None:
        """Registers the instance and works until stop(), then drains and
        records the exit. Raises VigilError when registration is refused
        with a 4xx (a bad kind, a wrong server token)."""
        with self._cv:
            if self._running:
                raise RuntimeError("vigil_client: Agent.run called while it is running")
            self._running = True
            runner = _Runner(self)
            self._runner = runner
        try:
            runner.run()
        finally:
            with self._cv:
                self._running = False

    def run_with_signals(self) -> None:
        """run(), also stopped by SIGTERM or SIGINT. Call it from the main
        thread. A signal starts the drain; further signals are ignored until
        run returns (a supervisor's SIGKILL after its grace still ends it)."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("vigil_client: run_with_signals must be called from the main thread")

        def on_signal(signum: int, _frame: Any) -> None:
            # No locks here: the handler may interrupt the main thread while
            # it holds one. The main loop below acts on the flag.
            if self._signalled is None:
                self._signalled = signum

        sigs = [signal.SIGINT, signal.SIGTERM]
        previous = {s: signal.signal(s, on_signal) for s in sigs}
        failure: List[BaseException] = []

        def target() -> None:
            try:
                self.run()
            except BaseException as e:  # re-raised in the main thread
                failure.append(e)

        t = threading.Thread(target=target, name=f"vigil-agent-{self.kind}")
        try:
            t.start()
            acted = False
            while t.is_alive():
                t.join(0.1)
                if self._signalled is not None and not acted:
                    acted = True
                    self.logger.info(
                        _fmt("stopping: draining", kind=self.kind, signal=signal.Signals(self._signalled).name)
                    )
                    self.stop()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
        if failure:
            raise failure[0]


class _Runner:
    """The state of one Agent.run."""

    def __init__(self, agent: Agent) -> None:
        self.a = agent
        self.cv = agent._cv  # guards everything below and agent._stopping
        self.client = agent.client
        self.set = agent.settings
        self.types = sorted(agent.handlers)
        self.log = agent.logger
        self.kind = agent.kind

        self.inst: Optional[Instance] = None
        self.fenced = True  # until the first registration
        self.fence_cause: Optional[BaseException] = None
        self.gen = 0  # bumped at every (re-)registration
        self.task: Optional[Task] = None
        self.keeper_q: Optional["queue.Queue[Any]"] = None
        self.exit_late: Optional[Instance] = None  # fenced instance to mark exited once its task's outcome is sent
        self.live_q: "queue.Queue[Any]" = queue.Queue()
        self.inflight: List[threading.Thread] = []
        self.spawn_lock = threading.Lock()

    # --- state ------------------------------------------------------------------

    def stopping(self) -> bool:
        with self.cv:
            return self.a._stopping

    def instance_id(self) -> Optional[str]:
        with self.cv:
            return self.inst.id if self.inst else None

    def current(self) -> Tuple[Instance, bool]:
        with self.cv:
            assert self.inst is not None
            return self.inst, self.fenced

    def current_task(self) -> Optional[Task]:
        with self.cv:
            return self.task

    def fence(self, cause: BaseException) -> bool:
        """Stops work under the current instance: no more claims, and the
        running handler is cancelled with cause. False when already fenced."""
        with self.cv:
            if self.fenced:
                return False
            self.fenced, self.fence_cause = True, cause
            if self.keeper_q is not None:
                self.keeper_q.put(("fenced", cause))
            self.cv.notify_all()
            return True

    def resume(self, inst: Instance) -> None:
        with self.cv:
            self.inst, self.fenced, self.fence_cause = inst, False, None
            self.gen += 1
            self.cv.notify_all()

    def fence_and_log(self, cause: BaseException) -> None:
        with self.cv:
            inst = self.inst
        if self.fence(cause):
            self.log.error(
                _fmt(
                    "fenced: stopped claiming and cancelled the running handler; "
                    "will re-register when the server answers",
                    kind=self.kind,
                    instance_id=inst,
                    reason=cause,
                )
            )

    def wait_stop(self, timeout: float) -> bool:
        """Waits timeout seconds or until the agent is stopping; True if stopping."""
        with self.cv:
            return self.cv.wait_for(lambda: self.a._stopping, timeout)

    def spawn(self, name: str, fn: Callable[[], None]) -> None:
        """Runs one call in its own daemon thread, so a hung call never delays
        the loop that started it."""
        t = threading.Thread(target=fn, name=name, daemon=True)
        with self.spawn_lock:
            self.inflight = [x for x in self.inflight if x.is_alive()]
            self.inflight.append(t)
        t.start()

    # --- run ----------------------------------------------------------------

    def run(self) -> None:
        reg = self.register()
        if reg is None:
            return
        inst, sent = reg
        self.resume(inst)
        s = self.set
        self.log.info(
            _fmt(
                "registered",
                kind=self.kind,
                instance_id=inst,
                liveness_interval=decide.format_duration(s.liveness_interval),
                heartbeat_interval=decide.format_duration(s.heartbeat_interval),
                poll_interval=decide.format_duration(s.poll_interval),
                task_types=",".join(self.types),
            )
        )
        live = threading.Thread(target=self.liveness_loop, args=(sent,), name="vigil-liveness", daemon=True)
        live.start()
        try:
            self.poll_loop()
        finally:
            self.live_q.put(_STOP)
            live.join()
            # In-flight heartbeats end within their own timeouts; a late one
            # after the exit is refused and changes nothing.
            deadline = time.monotonic() + 2.0
            with self.spawn_lock:
                inflight = list(self.inflight)
            for t in inflight:
                t.join(max(0.0, deadline - time.monotonic()))
            with self.cv:
                inst = self.inst
            assert inst is not None
            try:
                self.client.process_exit(inst, timeout=decide.CALL_TIMEOUT_MAX)
                self.log.info(_fmt("exited", kind=self.kind, instance_id=inst))
            except VigilError as e:
                self.log.warning(
                    _fmt(
                        "exit not recorded; the instance will show stopped after its alive window",
                        kind=self.kind,
                        instance_id=inst,
                        err=e,
                    )
                )

    def register_once(self, timeout: float) -> Instance:
        reg = self.client.register_process(
            self.kind, self.set.liveness_interval, hostname=self.a.hostname, pid=self.a.pid, timeout=timeout
        )
        return reg.instance

    def register(self) -> Optional[Tuple[Instance, float]]:
        """Registers the first instance, retrying transient failures; None if
        the agent was stopped first."""
        n = 0
        while True:
            if self.stopping():
                return None
            n += 1
            sent = time.monotonic()
            try:
                return self.register_once(decide.CALL_TIMEOUT_MAX), sent
            except VigilError as e:
                if not e.transient:
                    raise
                wait = decide.register_backoff(n, self.set.liveness_interval)
                self.log.warning(
                    _fmt("register failed; retrying", kind=self.kind, err=e, retry_in=decide.format_duration(wait))
                )
                if self.wait_stop(wait):
                    return None

    # --- liveness -----------------------------------------------------------

    def liveness_loop(self, registered_sent: float) -> None:
        """A liveness heartbeat every liveness interval, each in its own thread.
        Fences when none was accepted for the alive window; while fenced,
        tries once a tick to register a new instance to resume under."""
        interval = self.set.liveness_interval
        window = decide.alive_window(interval)
        q = self.live_q
        next_tick = time.monotonic() + interval
        fence_at: Optional[float] = registered_sent + window
        last_accepted = registered_sent
        registering = False
        failures = 0
        while True:
            now = time.monotonic()
            wake = next_tick if fence_at is None else min(next_tick, fence_at)
            try:
                item = q.get(timeout=max(0.0, wake - now))
            except queue.Empty:
                item = None
            if item is _STOP:
                return
            if item is not None:
                kind = item[0]
                if kind == "rereg":
                    _, new, old, sent, err = item
                    registering = False
                    if err is not None:
                        self.log.warning(_fmt("re-register failed; still fenced", kind=self.kind, instance_id=old, err=err))
                    else:
                        last_accepted, failures = sent, 0
                        fence_at = last_accepted + window
                        self.resume(new)
                        self.log.warning(
                            _fmt("re-registered after fence; resuming", kind=self.kind, old_instance_id=old, instance_id=new)
                        )
                else:
                    _, inst, sent, err = item
                    cur, fenced = self.current()
                    if not fenced and inst.id == cur.id:  # else a late answer for a fenced instance
                        if err is None or is_store_unavailable(err):
                            # A 503 unavailable is as good as an accepted
                            # heartbeat for the fence: nobody can judge this
                            # instance while the store is away, and the
                            # server gives it a full window once it is back.
                            if err is None:
                                failures = 0
                            else:
                                self.log.warning(
                                    _fmt(
                                        "liveness heartbeat not recorded: the server's store is unavailable; not fenced",
                                        kind=self.kind,
                                        instance_id=cur,
                                        err=err,
                                    )
                                )
                            if sent > last_accepted:
                                last_accepted = sent
                                fence_at = last_accepted + window
                        else:
                            failures += 1
                            if is_instance_gone(err):
                                self.fence_and_log(
                                    FencedError(f"instance fenced: the server no longer accepts instance {cur.id}: {err}")
                                )
                            else:
                                self.log.warning(
                                    _fmt(
                                        "liveness heartbeat failed",
                                        kind=self.kind,
                                        instance_id=cur,
                                        failures=failures,
                                        fence_in=decide.format_duration(max(0.0, last_accepted + window - time.monotonic())),
                                        err=err,
                                    )
                                )
            now = time.monotonic()
            if now >= next_tick:
                next_tick += interval
                if next_tick <= now:  # missed ticks (a slow machine, SIGSTOP) are dropped
                    next_tick = now + interval
                cur, fenced = self.current()
                if not fenced:
                    self.spawn("vigil-liveness-beat", lambda inst=cur: q.put(self.beat(inst)))
                elif not registering:
                    registering = True
                    self.spawn("vigil-reregister", lambda old=cur: q.put(self.reregister(old)))
            if fence_at is not None and now >= fence_at:
                fence_at = None
                _, fenced = self.current()
                if not fenced:
                    if decide.fence_needed(now, last_accepted, window):
                        self.fence_and_log(
                            FencedError(
                                "instance fenced: no liveness heartbeat accepted within the alive window of "
                                + decide.format_duration(window)
                            )
                        )
                    else:
                        fence_at = last_accepted + window

    def beat(self, inst: Instance) -> Tuple[Any, ...]:
        sent = time.monotonic()
        err: Optional[BaseException] = None
        try:
            self.client.process_heartbeat(inst, timeout=decide.call_timeout(self.set.liveness_interval))
        except Exception as e:  # noqa: BLE001 - every failure is reported to the loop
            err = e
        return ("beat", inst, sent, err)

    def reregister(self, old: Instance) -> Tuple[Any, ...]:
        """Registers a fresh instance to replace the fenced old one, then marks
        old exited (best effort) so any task it still holds is reclaimed --
        unless its task is still being worked or reported: a fenced agent
        still delivers results for leases the server has not moved on, so
        old is then marked exited once that outcome was sent."""
        timeout = decide.call_timeout(self.set.liveness_interval)
        sent = time.monotonic()
        try:
            new = self.register_once(timeout)
        except Exception as e:  # noqa: BLE001
            return ("rereg", None, old, sent, e)
        with self.cv:
            held = self.task is not None and self.task.lease.instance.id == old.id
            if held:
                self.exit_late = old
        if held:
            self.log.info(
                _fmt("fenced instance still holds leases; it is marked exited once their outcomes are sent", kind=self.kind, instance_id=old, leases=1)
            )
        else:
            self.mark_exited(old)
        return ("rereg", new, old, sent, None)

    def mark_exited(self, old: Instance) -> None:
        """Marks a fenced instance exited (best effort)."""
        try:
            self.client.process_exit(old, timeout=decide.call_timeout(self.set.liveness_interval))
        except Exception as e:  # noqa: BLE001
            self.log.debug(_fmt("could not mark the fenced instance exited", kind=self.kind, instance_id=old, err=e))

    # --- poll -----------------------------------------------------------------

    def poll_loop(self) -> None:
        """Claims and runs one task at a time until stopping; returns once the
        last task is finished or released."""
        if not self.types:
            with self.cv:
                self.cv.wait_for(lambda: self.a._stopping)
            return
        while True:
            with self.cv:
                self.cv.wait_for(lambda: self.a._stopping or not self.fenced)
                if self.a._stopping:
                    return
                inst, gen = self.inst, self.gen
            assert inst is not None
            # The claim is not abandoned on stop: a claim the server made but
            # whose answer was dropped would leave the task to the reclaimer.
            # A task claimed after stop is released at once instead.
            sent = time.monotonic()
            try:
                row = self.client.claim(inst, self.types, timeout=decide.CALL_TIMEOUT_MAX)
            except VigilError as e:
                if is_instance_gone(e):
                    self.fence_and_log(FencedError(f"instance fenced: the server no longer accepts instance {inst.id}: {e}"))
                elif not self.stopping():
                    self.log.warning(_fmt("claim failed", kind=self.kind, instance_id=inst, err=e))
                if self.wait_stop(self.set.poll_interval):
                    return
                continue
            if row is None:
                if self.wait_stop(self.set.poll_interval):
                    return
                continue
            if self.stopping():
                lease = inst.lease(row)
                self.send_outcome(self.task_fields(inst, row), "release", lambda: self.client.release(lease), _release_until())
                return
            self.run_task(inst, gen, row, sent)

    def task_fields(self, inst: Instance, row: Row) -> Dict[str, Any]:
        return {
            "kind": self.kind,
            "task_id": row.get("task_id"),
            "task_type": row.get("task_type"),
            "lease_epoch": row.get("lease_epoch"),
            "instance_id": inst.id,
        }

    def run_task(self, inst: Instance, gen: int, row: Row, claim_sent: float) -> None:
        """Runs the handler for a claimed task while a keeper thread renews the
        lease, then reports the outcome. On stop it drains: the handler gets
        drain_grace, then is cancelled with DrainingError and the task released."""
        claim_received = time.monotonic()  # no earlier than the claim's answer arrived
        lease = inst.lease(row)
        f = self.task_fields(inst, row)
        window, known = decide.lease_window(row)
        self.log.info(
            _fmt(
                "claimed",
                attempts=row.get("attempts"),
                reclaims=row.get("reclaims"),
                lease_window=decide.format_duration(window) if known else "server default",
                **f,
            )
        )
        if known and self.set.heartbeat_interval >= window:
            self.log.warning(
                _fmt(
                    "lease heartbeat interval is not shorter than the lease window: the lease will lapse",
                    heartbeat_interval=decide.format_duration(self.set.heartbeat_interval),
                    lease_window=decide.format_duration(window),
                    **f,
                )
            )
        task = Task(row, inst, self)
        # Until when a finished result is worth sending (keep_lease moves it).
        task._keep_until = decide.lease_surely_over(claim_received, window if known else decide.LEASE_WINDOW_UNKNOWN)
        kq: "queue.Queue[Any]" = queue.Queue()
        with self.cv:
            self.task, self.keeper_q = task, kq
            if self.fenced or self.gen != gen:  # fenced between the claim and now
                kq.put(("fenced", self.fence_cause or FencedError("instance fenced")))

        box: List[Tuple[str, Any, Optional[str]]] = []
        handler = self.a.handlers[task.type]

        def call() -> None:
            try:
                res: Tuple[str, Any, Optional[str]] = ("ok", handler(task), None)
            except BaseException as e:  # noqa: BLE001 - recorded as a failure, like a recovered panic
                res = ("err", e, traceback.format_exc())
            with self.cv:
                box.append(res)
                self.cv.notify_all()

        handler_thread = threading.Thread(target=call, name=f"vigil-task-{task.id}", daemon=True)
        keeper = threading.Thread(
            target=self.keep_lease, args=(kq, task, window, known, claim_sent, f), name=f"vigil-lease-{task.id}", daemon=True
        )
        handler_thread.start()
        keeper.start()

        def stop_keeper() -> None:
            kq.put(_STOP)
            keeper.join()  # no lease heartbeat is sent after this

        grace_deadline: Optional[float] = None
        try:
            while True:
                with self.cv:
                    if grace_deadline is None:
                        self.cv.wait_for(lambda: bool(box) or self.a._stopping)
                    else:
                        self.cv.wait_for(lambda: bool(box), max(0.0, grace_deadline - time.monotonic()))
                    done, stopping = bool(box), self.a._stopping
                if done:
                    stop_keeper()
                    if box[0][0] != "ok" and isinstance(task.cancel_cause, FencedError):
                        # Stopped by the fence (the server could not be
                        # reached), not a failure of the work: hand the task
                        # back without counting an attempt.
                        self.log.warning(_fmt("handler stopped by the fence: releasing the task, no attempt counted", **f))
                        self.send_outcome(f, "release", lambda: self.client.release(lease), task._keep_until)
                        return
                    self.report(f, lease, box[0], task._keep_until)
                    return
                if stopping and grace_deadline is None:
                    self.log.info(_fmt("draining: waiting for the handler to finish", grace=decide.format_duration(self.a.drain_grace), **f))
                    grace_deadline = time.monotonic() + self.a.drain_grace
                    continue
                if grace_deadline is not None and time.monotonic() >= grace_deadline:
                    self.log.warning(
                        _fmt(
                            "drain grace passed: cancelling the handler and releasing the task",
                            grace=decide.format_duration(self.a.drain_grace),
                            **f,
                        )
                    )
                    task._cancel(DrainingError("agent stopping: drain grace passed"))
                    with self.cv:
                        finished = self.cv.wait_for(lambda: bool(box), ABANDON_WAIT)
                    if not finished:
                        self.log.error(
                            _fmt("handler ignored cancellation; abandoning it", waited=decide.format_duration(ABANDON_WAIT), **f)
                        )
                    stop_keeper()
                    self.send_outcome(f, "release", lambda: self.client.release(lease), _release_until())
                    return
        finally:
            with self.cv:
                self.task, self.keeper_q = None, None
                late, self.exit_late = self.exit_late, None
            if late is not None:
                self.mark_exited(late)

    # --- lease ------------------------------------------------------------------

    def keep_lease(
        self,
        kq: "queue.Queue[Any]",
        task: Task,
        window: float,
        known: bool,
        claim_sent: float,
        f: Dict[str, Any],
    ) -> None:
        """Renews the lease every heartbeat interval (DESIGN T3), each renewal
        in its own thread with a timeout under the interval.

        Cancels the handler when the server refuses the lease (409
        stale_epoch, or the task or instance is gone) and then stops. Also
        cancels it when the agent itself can no longer vouch for the lease
        (no renewal accepted before the local lease deadline, or the
        instance fenced) but then keeps asking until the handler returns or
        the server gives its verdict: a holder that was frozen learns from
        the 409 that its task was handed on.

        Each accepted renewal moves task._keep_until, the instant the lease is
        surely over on the server (decide.lease_surely_over)."""
        interval = self.set.heartbeat_interval
        lease = task.lease
        next_tick = time.monotonic() + interval
        deadline: Optional[float] = decide.lease_deadline(claim_sent, window) if known else None
        deadline_fired = False
        fence_seen = False

        def lost(cause: BaseException) -> None:
            task._cancel(cause)
            self.log.warning(_fmt("lease lost", reason=cause, **f))

        def renew() -> None:
            sent = time.monotonic()
            try:
                # v1 until the handler reported activity, then v2 carrying
                # its age on this host's monotonic clock (DESIGN T7); a server
                # that predates activity_age_ms gets activity_at.
                age = task._activity_age
                if age is None:
                    row = self.client.task_heartbeat(lease, timeout=decide.call_timeout(interval))
                else:
                    try:
                        row = self.client.task_heartbeat(lease, activity_age=age, timeout=decide.call_timeout(interval))
                    except BadRequestError:
                        row = self.client.task_heartbeat(
                            lease, activity_at=task.last_activity, timeout=decide.call_timeout(interval)
                        )
                kq.put(("beat", row, sent, None, time.monotonic()))
            except Exception as e:  # noqa: BLE001
                kq.put(("beat", None, sent, e, time.monotonic()))

        while True:
            now = time.monotonic()
            wake = next_tick
            if deadline is not None and not deadline_fired:
                wake = min(wake, deadline)
            try:
                item = kq.get(timeout=max(0.0, wake - now))
            except queue.Empty:
                item = None
            if item is _STOP:
                return
            if item is not None:
                if item[0] == "fenced":
                    if not fence_seen:  # the instance that holds this lease; asked and answered
                        fence_seen = True
                        cause = item[1]
                        task._cancel(cause)
                        self.log.warning(_fmt("handler cancelled: instance fenced", reason=cause, **f))
                else:
                    _, row, sent, err, received = item
                    if err is not None and is_store_unavailable(err):
                        # The server renews every lease alive before the
                        # outage once its store is back (DESIGN L8).
                        self.log.warning(
                            _fmt("lease heartbeat not recorded: the server's store is unavailable; the lease is kept", err=err, **f)
                        )
                        row, err = None, None
                    if err is None:
                        w, ok = decide.lease_window(row)
                        if ok:
                            known = True
                            if w > 0 and task.last_activity is None:
                                window = w
                        else:
                            w = window
                        d = decide.lease_deadline(sent, w)
                        if known and not deadline_fired and (deadline is None or d > deadline):
                            deadline = d
                        if known:
                            task._keep_until = max(task._keep_until, decide.lease_surely_over(received, w))
                    elif isinstance(err, LeaseLostError):
                        self.log.warning(
                            _fmt(
                                "lease heartbeat refused: stale epoch (the task was reclaimed or finished)",
                                err=_err_text(err),
                                **f,
                            )
                        )
                        lost(err)
                        return
                    elif isinstance(err, VigilError) and err.code in (CODE_INVALID_TOKEN, CODE_INSTANCE_EXITED):
                        self.fence_and_log(
                            FencedError(f"instance fenced: the server no longer accepts instance {lease.instance.id}: {err}")
                        )
                        lost(LeaseLostError(f"lease lost: {err}", status=err.status, code=err.code))
                        return
                    elif isinstance(err, NotFoundError):
                        lost(LeaseLostError("lease lost: task not found", status=err.status, code=err.code))
                        return
                    else:
                        left = (deadline - time.monotonic()) if deadline is not None else None
                        self.log.warning(
                            _fmt(
                                "lease heartbeat failed",
                                err=err,
                                deadline_in=decide.format_duration(left) if left is not None else "unknown",
                                **f,
                            )
                        )
            now = time.monotonic()
            if now >= next_tick:
                next_tick += interval
                if next_tick <= now:
                    next_tick = now + interval
                self.spawn(f"vigil-lease-beat-{task.id}", renew)
            if deadline is not None and not deadline_fired and decide.lease_expired(now, deadline):
                deadline_fired = True  # keep renewing for the server's verdict
                if task.last_activity is None:
                    why = "no renewal accepted within the lease window of " + decide.format_duration(window)
                else:  # under the server's activity expiry, v2 renewals extend it from the last activity only
                    why = (
                        "no renewal extended the lease within the lease window of "
                        + decide.format_duration(window)
                        + " (v2: counted from the last activity reported)"
                    )
                lost(LeaseLostError("lease lost: " + why))

    def activity(self, task: Task) -> Optional[Row]:
        """Task.activity: a v2 heartbeat now, its answer fed to the task's keeper."""
        with self.cv:
            kq = self.keeper_q if self.task is task else None
        sent = time.monotonic()
        at = datetime.now(timezone.utc)
        try:
            try:
                row = self.client.task_heartbeat(task.lease, activity_age=0.0, timeout=decide.CALL_TIMEOUT_MAX)
            except BadRequestError:  # a server that predates activity_age_ms
                row = self.client.task_heartbeat(task.lease, activity_at=at, timeout=decide.CALL_TIMEOUT_MAX)
        except VigilError as e:
            if kq is not None and (isinstance(e, (LeaseLostError, NotFoundError)) or e.code in (CODE_INVALID_TOKEN, CODE_INSTANCE_EXITED)):
                kq.put(("beat", None, sent, e, time.monotonic()))
            raise
        task._set_activity(at, sent)
        if kq is not None:
            kq.put(("beat", row, sent, None, time.monotonic()))
        return row

    # --- outcome ------------------------------------------------------------------

    def report(self, f: Dict[str, Any], lease: Lease, outcome: Tuple[str, Any, Optional[str]], keep_until: float) -> None:
        """Sends the handler's outcome: complete with the result, or fail with
        the exception's text. A result that does not encode as JSON is a
        failure. The outcome is kept until the server accepts or refuses it,
        or until keep_until, when the lease is surely over (send_outcome)."""
        kind, value, tb = outcome
        if kind == "ok":
            try:
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError) as e:
                kind, value, tb = "err", ValueError(f"encode result: {e}"), None
            else:
                self.send_outcome(f, "complete", lambda: self.client.complete(lease, value), keep_until)
                return
        msg = _err_text(value)
        if tb:
            self.log.warning(_fmt("handler raised", err=msg, **f) + "\n" + tb.rstrip())
        self.send_outcome(dict(f, error=msg), "fail", lambda: self.client.fail(lease, msg), keep_until)

    def send_outcome(self, f: Dict[str, Any], verb: str, call: Callable[[], Any], keep_until: float) -> None:
        """Sends one outcome call and keeps it until the server answers (DESIGN
        T8): while the server is unreachable or answers 5xx (503 unavailable
        included) it is sent again, waiting outcome_backoff, until keep_until
        (for a complete or fail, the instant the lease is surely over) or,
        once the agent is stopping, for at most OUTCOME_STOP_BUDGET more.
        complete and fail are idempotent for the holder, so a retry whose
        first try landed gets 200. 409 stale_epoch is final: the server says
        the lease was lost and the call changed nothing; 409
        outcome_conflict and other 4xx are final too."""
        n = 0
        stop_by: Optional[float] = None
        while True:
            n += 1
            try:
                call()
                if n > 1:
                    self.log.info(_fmt(_OUTCOME_LOGS[verb], attempts=n, **f))
                else:
                    self.log.info(_fmt(_OUTCOME_LOGS[verb], **f))
                return
            except LeaseLostError as e:
                self.log.warning(_fmt(f"{verb} refused: lease lost (stale epoch)", err=_err_text(e), **f))
                return
            except OutcomeConflictError as e:
                self.log.error(_fmt(f"{verb} refused: the task already holds a different outcome from this lease", err=e, **f))
                return
            except VigilError as e:
                if not e.transient:
                    self.log.error(_fmt(f"{verb} failed", err=e, attempts=n, **f))
                    return
                now = time.monotonic()
                if stop_by is None and self.a._stopping:
                    stop_by = now + decide.OUTCOME_STOP_BUDGET
                if decide.outcome_give_up(now, keep_until, stop_by):
                    if verb == "release":
                        reason = "the lease lapses on its own"
                    elif now < keep_until:
                        reason = "the agent is stopping"
                    else:
                        reason = "the lease window has passed since the last accepted renewal: the server may hand the task on"
                    self.log.error(_fmt(f"{verb} not delivered: gave up", reason=reason, attempts=n, err=e, **f))
                    return
                wait = min(decide.outcome_backoff(n), max(0.0, keep_until - now))
                self.log.warning(_fmt(f"{verb} failed; retrying", err=e, retry_in=decide.format_duration(wait), **f))
                time.sleep(wait)


def _release_until() -> float:
    """The keep_until of a release: RELEASE_RETRY_BUDGET from now."""
    return time.monotonic() + decide.RELEASE_RETRY_BUDGET


_OUTCOME_LOGS = {"complete": "completed", "fail": "failure recorded", "release": "released"}


def _err_text(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


_FIRST_FIELDS = ("kind", "task_id", "task_type", "lease_epoch", "instance_id")


def _fmt(msg: str, **fields: Any) -> str:
    """``msg key=value …``, values quoted when they hold spaces, as slog's text
    handler writes them, so a line can be grepped for ``task_id=7``."""
    parts = [msg]
    first = [k for k in _FIRST_FIELDS if k in fields]
    for k in first + [k for k in fields if k not in _FIRST_FIELDS]:
        v = fields[k]
        if v is None:
            continue
        s = str(v)
        if s == "" or any(c in s for c in ' "=\n\t'):
            s = json.dumps(s, ensure_ascii=False)
        parts.append(f"{k}={s}")
    return " ".join(parts)
