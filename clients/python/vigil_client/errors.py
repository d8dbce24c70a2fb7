"""Errors raised by the client and the agent runtime.

Every error answer from the server has one shape,
``{"error": {"code": ..., "message": ...}}`` (docs/api.md, Conventions). The
client raises it as a :class:`VigilError` carrying the HTTP ``status`` and the
API ``code``; some codes get their own subclass because callers branch on
them:

=====================  ==========================================  ==========
code                   meaning                                     class
=====================  ==========================================  ==========
``stale_epoch``        the lease is no longer held at that epoch   LeaseLostError
``outcome_conflict``   a repeated complete/fail differs from the   OutcomeConflictError
                       outcome stored for that lease
``not_found``          no such instance, kind, task or route       NotFoundError
``invalid``,           a field breaks a rule / the body is not     BadRequestError
``malformed_json``     JSON of the expected shape
anything else          ``invalid_token``, ``instance_exited``,     VigilError
                       ``instance_stopped``, ``unauthorized``, …
=====================  ==========================================  ==========

When no server answered at all (connection refused, DNS, timeout, reset) the
client raises :class:`UnreachableError`, whose ``status`` is 0.

The agent runtime also cancels a running handler with one of these as the
cause (``Task.cancel_cause``): :class:`LeaseLostError` (the server refused
the lease, or no renewal was accepted before the lease's own deadline),
:class:`FencedError` (the instance could not prove it is alive) or
:class:`DrainingError` (the agent is stopping and the drain grace passed).
"""

from __future__ import annotations

import json
from typing import Optional

# API error codes (docs/api.md, Conventions).
CODE_INVALID = "invalid"
CODE_MALFORMED_JSON = "malformed_json"
CODE_UNAUTHORIZED = "unauthorized"
CODE_INVALID_TOKEN = "invalid_token"
CODE_FORBIDDEN = "forbidden"  # 403: the bearer token's role may not make this call
CODE_NOT_FOUND = "not_found"
CODE_METHOD_NOT_ALLOWED = "method_not_allowed"
CODE_STALE_EPOCH = "stale_epoch"
CODE_INSTANCE_EXITED = "instance_exited"
CODE_INSTANCE_STOPPED = "instance_stopped"
CODE_OUTCOME_CONFLICT = "outcome_conflict"
CODE_PAYLOAD_TOO_LARGE = "payload_too_large"
CODE_INTERNAL = "internal"
CODE_UNAVAILABLE = "unavailable"

# How much of an error answer is read to build the error.
MAX_ERROR_BODY = 64 << 10


class VigilError(Exception):
    """An error from vigil: an API error answer, or one the runtime detected.

    Attributes:
        message: the server's message (or the runtime's).
        status: the HTTP status of the answer; 0 when there was none (the
            server was not reached, or the runtime decided on its own).
        code: the API error code (``"stale_epoch"``, ``"invalid_token"``, …);
            ``""`` when the answer had no error body of the API's shape or
            there was no answer.
        op: what was being done, e.g. ``"heartbeat task 7 at epoch 2"``.
    """

    def __init__(self, message: str, *, status: int = 0, code: str = "", op: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.op = op

    def __str__(self) -> str:
        text = f"{self.op}: {self.message}" if self.op else self.message
        if self.status:
            text += f" (HTTP {self.status} {self.code or _status_code_name(self.status)})"
        return text

    @property
    def transient(self) -> bool:
        """Whether the same call may succeed if sent again: no server answered,
        or one answered 5xx (503 ``unavailable``: its store cannot be
        reached). A 4xx answer is final."""
        return self.status == 0 or self.status >= 500


class LeaseLostError(VigilError):
    """The task's lease is no longer held by this instance at this epoch.

    Raised by the client for ``409 stale_epoch`` (the task was reclaimed and
    perhaps claimed again, released or finished: the call changed nothing).
    The agent runtime also uses it, with status 0, as the cancellation cause
    when no lease renewal was accepted before the lease's own deadline.
    """


class OutcomeConflictError(VigilError):
    """``409 outcome_conflict``: a complete or fail repeated by the holder at
    the epoch its lease ended with, but with another result or error text
    than the one stored (the message names the field); nothing changed. The
    same call repeated exactly is answered with the stored task (DESIGN T8)."""


class NotFoundError(VigilError):
    """``404 not_found``: no such process instance, kind, task or route."""


class BadRequestError(VigilError):
    """``400 invalid`` or ``400 malformed_json``: the request broke a rule
    (the message names the field) or was not JSON of the expected shape;
    nothing was written."""


class UnreachableError(VigilError):
    """No server answered: every URL refused the connection, failed to
    resolve, timed out or dropped it. ``status`` is 0 and ``code`` is ``""``.
    Always transient."""


class FencedError(VigilError):
    """Cancellation cause: no liveness heartbeat was accepted within the alive
    window (3 × the liveness interval), or the server no longer accepts the
    instance (``not_found``, ``invalid_token``, ``instance_exited``). The
    server may show the instance stopped and hand its task to another, so
    the agent must not go on working unseen."""


class DrainingError(VigilError):
    """Cancellation cause: the agent is stopping and the handler did not
    finish within the drain grace; the task is released."""


_BY_CODE = {
    CODE_STALE_EPOCH: LeaseLostError,
    CODE_OUTCOME_CONFLICT: OutcomeConflictError,
    CODE_NOT_FOUND: NotFoundError,
    CODE_INVALID: BadRequestError,
    CODE_MALFORMED_JSON: BadRequestError,
}


def error_for(status: int, raw: bytes, op: str = "") -> VigilError:
    """Builds the error for a non-2xx answer with body ``raw``.

    An answer of the API's shape gets the class of its code; any other
    (a proxy's HTML page, say) keeps its status, an empty code and the start
    of the body as its message.
    """
    code, message = "", ""
    try:
        body = json.loads(raw.decode("utf-8"))
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict) and isinstance(err.get("code"), str) and err["code"]:
            code = err["code"]
            message = err.get("message") if isinstance(err.get("message"), str) else ""
    except (ValueError, UnicodeDecodeError):
        pass
    if not code:
        message = raw.decode("utf-8", errors="replace").strip()
        if len(message) > 200:
            message = message[:200] + "…"
        if not message:
            message = _status_text(status)
    cls = _BY_CODE.get(code, VigilError)
    return cls(message, status=status, code=code, op=op)


def is_instance_gone(err: BaseException) -> bool:
    """Whether err means the server will never again accept work from the
    instance: it was pruned, exited, or the token is not its."""
    return isinstance(err, NotFoundError) or (
        isinstance(err, VigilError) and err.code in (CODE_INVALID_TOKEN, CODE_INSTANCE_EXITED)
    )


def is_store_unavailable(err: Optional[BaseException]) -> bool:
    """Whether err is the server's 503 ``unavailable``: the server answered
    and its store could not be reached. Heartbeats so answered count toward
    neither fencing nor losing a lease: the server gives every instance and
    lease a full window once its store is back (DESIGN L8)."""
    return isinstance(err, VigilError) and err.status == 503 and err.code == CODE_UNAVAILABLE


def is_transient(err: Optional[BaseException]) -> bool:
    """Whether a failed call may succeed if sent again (see VigilError.transient)."""
    if isinstance(err, VigilError):
        return err.transient
    return err is not None


def _status_text(status: int) -> str:
    try:
        from http import HTTPStatus

        return HTTPStatus(status).phrase
    except ValueError:
        return f"HTTP {status}"


def _status_code_name(status: int) -> str:
    return _status_text(status).lower().replace(" ", "_")
