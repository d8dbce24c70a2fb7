"""The agent runtime's decisions, as plain functions of explicit times.

The same rules as the Go SDK's decide.go, kept apart from the threads so
they are tested without a clock. Local times are ``time.monotonic()``
readings: deadlines are built by adding durations to the monotonic time a
request was sent, so a wall-clock jump cannot move them. Server timestamps
are only ever subtracted from each other (a window), never compared with the
local clock.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping, Optional, Tuple

ALIVE_WINDOW_FACTOR = 3
"""How many liveness intervals may pass without a heartbeat before the server
shows an instance stopped (DESIGN L3)."""

CALL_TIMEOUT_FLOOR = 5.0
"""The least time a periodic call is given: a loaded machine's round trip fits."""

CALL_TIMEOUT_MAX = 10.0
"""Bounds every single request the agent runtime makes, in seconds."""

# A finished result is kept until the server accepts or refuses it (DESIGN
# T8): a complete or fail that cannot reach the server, or is answered 5xx
# (503 unavailable included), is sent again -- it is idempotent for the
# holder, so a retry whose first try landed gets 200 -- for as long as the
# lease may still be valid. 2xx, 409 (stale_epoch, outcome_conflict) and any
# other 4xx are final.

OUTCOME_BACKOFF_MAX = 4.0
"""Caps the wait between two tries of an outcome call, in seconds."""

LEASE_WINDOW_UNKNOWN = 300.0
"""Stands in for a lease window the server did not report: its default
--lease-timeout (DESIGN T3), in seconds."""

RELEASE_RETRY_BUDGET = 4.0
"""Bounds the retries of a release, in seconds: the lease lapses anyway."""

OUTCOME_STOP_BUDGET = 5.0
"""How long a stopping agent keeps retrying an outcome the server cannot
take, in seconds, so that it exits within a supervisor's stop grace."""


def lease_window(task: Optional[Mapping[str, Any]]) -> Tuple[float, bool]:
    """The lease window, in seconds, the server granted in its answer to a
    claim or a lease heartbeat: ``lease_expires_at - last_heartbeat_at``,
    both stamped by the server's clock in one write. Falls back to the task's
    own ``lease_timeout_s``; the flag is False when neither is known.

    Under the server's activity expiry a v2 renewal's expiry counts from its
    activity_at, so the window it grants shrinks as the activity ages, and
    is zero or negative once the activity is older than the lease window:
    that is returned as is (the renewal does not extend the lease), unlike
    a missing answer, which falls back."""
    if not task:
        return 0.0, False
    exp, hb = task.get("lease_expires_at"), task.get("last_heartbeat_at")
    if isinstance(exp, str) and isinstance(hb, str):
        try:
            return (parse_time(exp) - parse_time(hb)).total_seconds(), True
        except ValueError:
            pass
    lt = task.get("lease_timeout_s")
    if isinstance(lt, (int, float)) and not isinstance(lt, bool) and lt > 0:
        return float(lt), True
    return 0.0, False


def lease_deadline(renewal_sent: float, window: float) -> float:
    """The local (monotonic) instant after which the lease must be taken as
    lost unless renewed again: when the last accepted renewal (or the claim)
    was sent, plus the granted window. Counting from the send time errs
    early: the server stamped the renewal after it was sent."""
    return renewal_sent + window


def lease_expired(now: float, deadline: float) -> bool:
    """Whether the lease deadline has passed at now."""
    return now >= deadline


def alive_window(liveness_interval: float) -> float:
    """How long the server keeps an instance alive after a liveness heartbeat:
    3 × the interval, truncated to milliseconds as the server does."""
    return math.trunc(liveness_interval * ALIVE_WINDOW_FACTOR * 1000) / 1000.0


def fence_needed(now: float, last_accepted: float, window: float) -> bool:
    """Whether an instance whose last accepted liveness heartbeat was sent at
    last_accepted must stop working at now: the alive window has passed, so
    the server may show it stopped and reclaim its task."""
    return now >= last_accepted + window


def call_timeout(interval: float) -> float:
    """Bounds one periodic call made every interval: 4/5 of it, but never
    less than CALL_TIMEOUT_FLOOR nor more than CALL_TIMEOUT_MAX. Each periodic
    call runs in a thread of its own, so a call that outlives the next tick
    delays nothing; the lease deadline and the alive window decide loss, not
    one call's timeout. The floor keeps a short interval from abandoning
    every call on a loaded machine."""
    return min(max(interval * 4 / 5, CALL_TIMEOUT_FLOOR), CALL_TIMEOUT_MAX)


def outcome_backoff(n: int) -> float:
    """The wait before retry n (1-based) of an outcome call: 250ms doubling,
    at most OUTCOME_BACKOFF_MAX."""
    return min(0.25 * (1 << min(n - 1, 16)), OUTCOME_BACKOFF_MAX)


def lease_surely_over(renewal_received: float, window: float) -> float:
    """The local (monotonic) instant after which the lease surely has expired
    on the server: the granted window counted from when the answer to the
    last accepted renewal (or the claim) was received. The server stamped
    the renewal before it answered, so its expiry is no later than this.
    Until then a finished result is worth sending."""
    return renewal_received + window


def outcome_give_up(now: float, keep_until: float, stop_by: Optional[float]) -> bool:
    """Whether an outcome call that failed transiently at now should not be
    sent again: the lease is surely over, or the agent is stopping and its
    budget (stop_by) has passed."""
    return now >= keep_until or (stop_by is not None and now >= stop_by)


def register_backoff(n: int, liveness_interval: float) -> float:
    """The wait before registration attempt n+1 after n transient failures:
    1s doubling, capped at the liveness interval and at a minute."""
    limit = min(liveness_interval, 60.0)
    if n > 16:
        return limit
    return min(float(1 << (n - 1)), limit)


_TIME_RE = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(?:\.(\d+))?(?:([Zz])|([+-])(\d\d):(\d\d))\Z"
)


def parse_time(s: str) -> datetime:
    """Parses an RFC 3339 timestamp as the server writes it
    (``2026-11-30T06:21:00.123Z``) into an aware UTC datetime."""
    m = _TIME_RE.match(s.strip())
    if not m:
        raise ValueError(f"not an RFC 3339 time: {s!r}")
    y, mo, d, h, mi, sec = (int(m.group(i)) for i in range(1, 7))
    frac = m.group(7) or ""
    micro = int((frac + "000000")[:6]) if frac else 0
    dt = datetime(y, mo, d, h, mi, sec, micro, tzinfo=timezone.utc)
    if m.group(9):
        off = timedelta(hours=int(m.group(10)), minutes=int(m.group(11)))
        dt = dt - off if m.group(9) == "+" else dt + off
    return dt


def format_time(dt: datetime) -> str:
    """Formats an aware datetime as the API's times: RFC 3339 in UTC with
    millisecond precision (truncated, so never later than dt)."""
    if dt.tzinfo is None or dt.tzinfo.utcoffset(dt) is None:
        raise ValueError("a naive datetime is ambiguous: pass an aware one, e.g. datetime.now(timezone.utc)")
    u = dt.astimezone(timezone.utc)
    return u.strftime("%Y-%m-%dT%H:%M:%S") + f".{u.microsecond // 1000:03d}Z"


def format_duration(seconds: float) -> str:
    """A duration as Go prints one: ``500ms``, ``2s``, ``1.5s``, ``1m30s``, ``2h0m0s``."""
    if seconds == 0:
        return "0s"
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    if s < 1:
        return f"{sign}{_trim(s * 1000)}ms"
    if s < 60:
        return f"{sign}{_trim(s)}s"
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    if h:
        return f"{sign}{int(h)}h{int(m)}m{_trim(sec)}s"
    return f"{sign}{int(m)}m{_trim(sec)}s"


def _trim(x: float) -> str:
    return f"{round(x, 3):.3f}".rstrip("0").rstrip(".")
