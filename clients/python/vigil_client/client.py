"""A typed client for vigil's HTTP JSON API (docs/api.md), standard library only."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union
from urllib.parse import quote, urlencode, urlsplit

from ._version import __version__
from ._decide import format_time
from .errors import MAX_ERROR_BODY, BadRequestError, UnreachableError, VigilError, error_for
from .settings import ENV_CA_FILE, EnvError, SettingsError, connection_from_env

HTTP_TIMEOUT_DEFAULT = 30.0
"""Seconds one request may take unless a call passes its own timeout."""

INSTANCE_TOKEN_HEADER = "X-Vigil-Instance-Token"
"""Carries the instance token on every write made for that instance (DESIGN L2)."""

Row = Dict[str, Any]
"""A row as the API returns it: a task or process instance object."""


@dataclass(frozen=True)
class Instance:
    """The credential of one registered process instance: its id and the
    instance token issued at registration. ``repr`` and ``str`` show the id
    only, so the token does not end up in logs."""

    id: str
    token: str = field(repr=False)

    def __str__(self) -> str:
        return self.id

    def lease(self, task: Mapping[str, Any]) -> "Lease":
        """The lease this instance holds on a task it just claimed: the task id
        and its ``lease_epoch``, the fencing token of every later call."""
        return Lease(instance=self, task_id=int(task["task_id"]), epoch=int(task["lease_epoch"]))


@dataclass(frozen=True)
class Lease:
    """A held lease: holder instance, task id and lease epoch (DESIGN T2). The
    server refuses a stale epoch with 409 (LeaseLostError) and changes nothing."""

    instance: Instance
    task_id: int
    epoch: int


@dataclass(frozen=True)
class Registration:
    """The answer to register_process: the instance's credential and its new
    process row (``instance_token`` removed from the row)."""

    instance: Instance
    process: Row = field(repr=False)


class Client:
    """Talks to vigil servers over the HTTP API. Safe for concurrent use.

    ``urls`` is one URL, a comma-separated string of them, or a list. A
    request goes to the URL that answered last; when that one cannot be
    reached (the connection could not be made) the others are tried in
    turn, for every call; for GET requests any transport failure also moves
    on. An HTTP error status is an answer, never a reason to try another
    URL. A path prefix is kept (``https://host/vigil`` works).

    For an ``https://`` server whose certificate a private CA signed, give
    that CA's certificates as ``ca_file`` (a PEM file; the system's roots are
    then not used, as with ``curl --cacert``) or a whole ``ssl_context``.

    Every method takes ``timeout=`` (seconds) to override the client's
    default for that call. Durations are seconds (float). Rows are returned
    as the decoded JSON objects of docs/api.md.
    """

    def __init__(
        self,
        urls: Union[str, Sequence[str]],
        *,
        token: Optional[str] = None,
        timeout: float = HTTP_TIMEOUT_DEFAULT,
        ca_file: Optional[str] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
    ) -> None:
        if isinstance(urls, str):
            urls = [u for u in urls.split(",") if u.strip()]
        if not urls:
            raise ValueError("vigil_client: at least one server URL is required")
        if ca_file and ssl_context is not None:
            raise ValueError("vigil_client: give ca_file or ssl_context, not both")
        if ssl_context is None:
            ssl_context = _ssl_context(ca_file)
        self._bases = [_parse_base(raw, ssl_context) for raw in urls]
        self._token = token or None
        self._timeout = timeout
        self._last = 0
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, **kwargs: Any) -> "Client":
        """A Client for the servers in ``VIGIL_URL`` (comma-separated, default
        http://127.0.0.1:7711) sending the server token read from the file
        named by ``VIGIL_TOKEN_FILE`` and trusting the CA certificates in the
        file named by ``VIGIL_CA_FILE``. Raises SettingsError."""
        urls, token = connection_from_env(environ)
        if token and "token" not in kwargs:
            kwargs["token"] = token
        env = os.environ if environ is None else environ
        ca_file = (env.get(ENV_CA_FILE) or "").strip()
        if ca_file and "ca_file" not in kwargs and "ssl_context" not in kwargs:
            try:
                kwargs["ssl_context"] = _ssl_context(ca_file)
            except ValueError as e:
                raise SettingsError([EnvError(ENV_CA_FILE, ca_file, f"read the CA certificates: {e.__cause__ or e}")]) from e
        return cls(urls, **kwargs)

    @property
    def urls(self) -> List[str]:
        """The server URLs in the order they are tried, starting with the one
        that answered last."""
        with self._lock:
            start = self._last
        n = len(self._bases)
        return [self._bases[(start + i) % n].url for i in range(n)]

    # --- process instances (liveness, DESIGN L1-L7) ---------------------------

    def register_process(
        self,
        kind: str,
        liveness_interval: float,
        *,
        hostname: Optional[str] = None,
        pid: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> Registration:
        """Registers a new process instance of kind (``POST /v1/processes``): the
        server assigns a fresh instance_id and sets started_at =
        last_heartbeat_at = its now. hostname and pid default to this
        process's. Raises BadRequestError for a bad field."""
        body = {
            "process_kind": kind,
            "hostname": hostname if hostname is not None else (socket.gethostname() or "unknown"),
            "pid": pid if pid is not None else os.getpid(),
            "liveness_interval_s": float(liveness_interval),
        }
        op = f"register {kind} process"
        out = self._call("POST", "/v1/processes", body=body, timeout=timeout, op=op)
        if not isinstance(out, dict) or not out.get("instance_id") or not out.get("instance_token"):
            raise VigilError("answer lacks instance_id or instance_token", op=op)
        row = dict(out)
        token = row.pop("instance_token")
        return Registration(instance=Instance(row["instance_id"], token), process=row)

    def process_heartbeat(self, instance: Instance, *, timeout: Optional[float] = None) -> Optional[Row]:
        """One liveness heartbeat: the server sets last_heartbeat_at to its now.
        Errors: NotFoundError, VigilError invalid_token / instance_exited."""
        return self._process_write(instance, "heartbeat", timeout)

    def process_exit(self, instance: Instance, *, timeout: Optional[float] = None) -> Optional[Row]:
        """Marks the instance exited (a clean exit): it shows stopped at once and
        a task it still holds is reclaimed on the next sweep."""
        return self._process_write(instance, "exit", timeout)

    def _process_write(self, instance: Instance, verb: str, timeout: Optional[float]) -> Optional[Row]:
        path = f"/v1/processes/{quote(instance.id, safe='')}/{verb}"
        out = self._call("POST", path, instance=instance.token, timeout=timeout, op=f"{verb} of instance {instance.id}")
        return out if isinstance(out, dict) and out.get("instance_id") else None

    def get_process(self, instance_id: str, *, timeout: Optional[float] = None) -> Row:
        """One process instance, with its status computed by the server."""
        path = f"/v1/processes/{quote(instance_id, safe='')}"
        return self._call("GET", path, timeout=timeout, op=f"get process {instance_id}")

    def list_processes(
        self,
        *,
        kind: Optional[str] = None,
        host: Optional[str] = None,
        status: Optional[str] = None,
        limit: Optional[int] = None,
        cursor: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Row:
        """One page of instances, newest first: ``{"processes": [...], "next_cursor": ...}``."""
        q = _query(kind=kind, host=host, status=status, limit=limit, cursor=cursor)
        return self._call("GET", "/v1/processes", query=q, timeout=timeout, op="list processes")

    def process_status(self, kind: str, *, timeout: Optional[float] = None) -> Row:
        """The most recently started instance of kind; NotFoundError if none."""
        path = f"/v1/process-status/{quote(kind, safe='')}"
        return self._call("GET", path, timeout=timeout, op=f"status of kind {kind}")

    def prune(self, older_than: float, *, timeout: Optional[float] = None) -> int:
        """Deletes stopped instances idle longer than older_than seconds that
        hold no task; returns how many."""
        body = {"older_than_s": float(older_than)}
        out = self._call("POST", "/v1/processes/prune", body=body, timeout=timeout, op="prune processes")
        return int(out.get("deleted", 0)) if isinstance(out, dict) else 0

    # --- tasks and leases (DESIGN T1-T4) --------------------------------------

    def enqueue(
        self,
        task_type: str,
        payload: Any = None,
        *,
        max_attempts: Optional[int] = None,
        max_reclaims: Optional[int] = None,
        lease_timeout: Optional[float] = None,
        delay: Optional[float] = None,
        activity_gated: bool = False,
        timeout: Optional[float] = None,
    ) -> Row:
        """Adds a scheduled task. None fields take the server's defaults.
        activity_gated marks work whose holder sends v2 (activity)
        heartbeats: without lease_timeout its lease window is 30 min."""
        body: Dict[str, Any] = {"task_type": task_type}
        if payload is not None:
            body["payload"] = payload
        if max_attempts is not None:
            body["max_attempts"] = max_attempts
        if max_reclaims is not None:
            body["max_reclaims"] = max_reclaims
        if lease_timeout is not None:
            body["lease_timeout_s"] = float(lease_timeout)
        if delay is not None:
            body["delay_s"] = float(delay)
        if activity_gated:
            body["activity_gated"] = True
        return self._call("POST", "/v1/tasks", body=body, timeout=timeout, op=f"enqueue {task_type} task")

    def get_task(self, task_id: int, *, timeout: Optional[float] = None) -> Row:
        """One task. NotFoundError if there is none."""
        return self._call("GET", f"/v1/tasks/{int(task_id)}", timeout=timeout, op=f"get task {task_id}")

    def list_tasks(
        self,
        *,
        status: Optional[str] = None,
        task_type: Optional[str] = None,
        limit: Optional[int] = None,
        cursor: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Row:
        """One page of tasks, highest id first: ``{"tasks": [...], "next_cursor": ...}``."""
        q = _query(status=status, type=task_type, limit=limit, cursor=cursor)
        return self._call("GET", "/v1/tasks", query=q, timeout=timeout, op="list tasks")

    def claim(self, instance: Instance, task_types: Sequence[str], *, timeout: Optional[float] = None) -> Optional[Row]:
        """Atomically takes the oldest claimable task of one of task_types for
        instance, under a fresh lease (use ``instance.lease(task)``); None
        when nothing is claimable. Errors: BadRequestError, NotFoundError,
        VigilError invalid_token / instance_exited / instance_stopped."""
        body = {"instance_id": instance.id, "task_types": list(task_types)}
        op = f"claim {list(task_types)} for instance {instance.id}"
        out = self._call("POST", "/v1/tasks/claim", body=body, instance=instance.token, timeout=timeout, op=op)
        return out if isinstance(out, dict) and out.get("task_id") else None

    def task_heartbeat(
        self,
        lease: Lease,
        *,
        activity_at: Optional[datetime] = None,
        activity_age: Optional[float] = None,
        timeout: Optional[float] = None,
    ) -> Optional[Row]:
        """Renews the lease (DESIGN T3): last_heartbeat_at = now, lease_expires_at
        = now + the window. Without activity this is a v1 heartbeat (no
        schema_version sent). With activity it is a v2 heartbeat (DESIGN T4):
        ``activity_age`` (seconds, measured on this host's own clock; sent as
        ``activity_age_ms``, which the server places at its now − age, so this
        host's clock being off does not matter, DESIGN T7) or ``activity_at``
        (an aware datetime, for a server that predates activity_age_ms; not
        both). Errors: LeaseLostError (do not retry), NotFoundError,
        BadRequestError, VigilError."""
        if activity_at is not None and activity_age is not None:
            raise ValueError("task_heartbeat: pass activity_at or activity_age, not both")
        extra: Dict[str, Any] = {}
        if activity_age is not None:
            extra = {"schema_version": 2, "activity_age_ms": max(0, int(activity_age * 1000))}
        elif activity_at is not None:
            extra = {"schema_version": 2, "activity_at": format_time(activity_at)}
        return self._lease_call(lease, "heartbeat", extra, timeout)

    def activity(self, lease: Lease, *, timeout: Optional[float] = None) -> Optional[Row]:
        """A v2 lease heartbeat saying "this task made progress just now"
        (activity_age_ms 0, so this host's clock does not matter; activity_at
        = now for a server that predates it). Errors as task_heartbeat."""
        try:
            return self.task_heartbeat(lease, activity_age=0.0, timeout=timeout)
        except BadRequestError:
            return self.task_heartbeat(lease, activity_at=datetime.now(timezone.utc), timeout=timeout)

    def complete(self, lease: Lease, result: Any = None, *, timeout: Optional[float] = None) -> Optional[Row]:
        """Finishes the task with result (any JSON value; None stores null)."""
        return self._lease_call(lease, "complete", {"result": result}, timeout)

    def fail(
        self,
        lease: Lease,
        error: str,
        *,
        retry_after: Optional[float] = None,
        timeout: Optional[float] = None,
    ) -> Optional[Row]:
        """Records a handler failure: attempts + 1, then back to scheduled after
        a backoff (retry_after seconds, when given and > 0, replaces the
        server's), or dead_letter at max_attempts."""
        extra: Dict[str, Any] = {"error": error}
        if retry_after is not None and retry_after > 0:
            extra["retry_after_s"] = float(retry_after)
        return self._lease_call(lease, "fail", extra, timeout)

    def release(self, lease: Lease, *, timeout: Optional[float] = None) -> Optional[Row]:
        """Gives the task back: scheduled now, no attempt counted."""
        return self._lease_call(lease, "release", {}, timeout)

    def _lease_call(self, lease: Lease, verb: str, extra: Mapping[str, Any], timeout: Optional[float]) -> Optional[Row]:
        body: Dict[str, Any] = {"instance_id": lease.instance.id, "lease_epoch": lease.epoch}
        body.update(extra)
        op = f"{verb} task {lease.task_id} at epoch {lease.epoch}"
        out = self._call(
            "POST", f"/v1/tasks/{lease.task_id}/{verb}", body=body, instance=lease.instance.token, timeout=timeout, op=op
        )
        return out if isinstance(out, dict) and out.get("task_id") else None

    # --- server ----------------------------------------------------------------

    def sweepers(self, *, timeout: Optional[float] = None) -> List[Row]:
        """The server's background loops and their last pass."""
        out = self._call("GET", "/v1/sweepers", timeout=timeout, op="list sweepers")
        return list(out.get("sweepers") or []) if isinstance(out, dict) else []

    def health(self, *, timeout: Optional[float] = None) -> None:
        """Returns when ``GET /healthz`` answers ``{"status":"ok"}``; raises otherwise."""
        out = self._call("GET", "/healthz", timeout=timeout, op="health")
        status = out.get("status") if isinstance(out, dict) else None
        if status != "ok":
            raise VigilError(f"server status is {status!r}", op="health")

    # --- transport -------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: Optional[str] = None,
        body: Any = None,
        instance: Optional[str] = None,
        timeout: Optional[float] = None,
        op: str = "",
    ) -> Any:
        data = None
        if body is not None:
            try:
                data = json.dumps(body, allow_nan=False, separators=(",", ":")).encode("utf-8")
            except (TypeError, ValueError) as e:
                raise ValueError(f"{op}: encode request: {e}") from e
        headers = {"Accept": "application/json", "User-Agent": f"vigil-client-python/{__version__}"}
        if data is not None or method != "GET":
            # Every write says it is JSON, a bodyless one too: the server
            # refuses other writes (415), as a browser's cross-site form
            # could send them.
            headers["Content-Type"] = "application/json"
        if self._token:
            headers["Authorization"] = "Bearer " + self._token
        if instance:
            headers[INSTANCE_TOKEN_HEADER] = instance
        t = self._timeout if timeout is None else timeout

        with self._lock:
            start = self._last
        n = len(self._bases)
        failures: List[str] = []
        for i in range(n):
            idx = (start + i) % n
            base = self._bases[idx]
            try:
                status, raw = base.send(method, path, query, headers, data, t)
            except _ConnectError as e:
                hint = ""
                if isinstance(e.__cause__, ssl.SSLCertVerificationError):
                    hint = " (the server's certificate is not trusted: give ca_file= or VIGIL_CA_FILE, the CA that signed it)"
                failures.append(f"{base.url}: {e.cause}{hint}")
                continue
            except (OSError, http.client.HTTPException) as e:
                failures.append(f"{base.url}: {_describe(e)}")
                if method == "GET":
                    continue
                raise UnreachableError(f"{method} {path}: {_describe(e)}", op=op) from e
            with self._lock:
                self._last = idx
            if status < 200 or status > 299:
                raise error_for(status, raw, op=op)
            if status == 204 or not raw.strip():
                return None
            try:
                return json.loads(raw.decode("utf-8"))
            except (ValueError, UnicodeDecodeError) as e:
                raise VigilError(f"{method} {path}: decode response: {e}", status=0, op=op) from e
        raise UnreachableError(f"{method} {path}: no server reachable: " + "; ".join(failures), op=op)


class _ConnectError(Exception):
    """The connection could not be made: the request never reached the server."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = _describe(cause)


class _Base:
    """One server URL."""

    def __init__(
        self, url: str, scheme: str, host: str, port: Optional[int], prefix: str, context: ssl.SSLContext
    ) -> None:
        self.url = url
        self.scheme = scheme
        self.host = host
        self.port = port
        self.prefix = prefix
        self.context = context

    def send(
        self, method: str, path: str, query: Optional[str], headers: Mapping[str, str], data: Optional[bytes], timeout: float
    ) -> "tuple[int, bytes]":
        conn: http.client.HTTPConnection
        if self.scheme == "https":
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self.context)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            try:
                conn.connect()
            except OSError as e:
                raise _ConnectError(e) from e
            target = self.prefix + path + ("?" + query if query else "")
            conn.request(method, target, body=data, headers=dict(headers))
            resp = conn.getresponse()
            if 200 <= resp.status <= 299:
                raw = resp.read()
            else:
                raw = resp.read(MAX_ERROR_BODY)
            return resp.status, raw
        finally:
            conn.close()


def _ssl_context(ca_file: Optional[str]) -> ssl.SSLContext:
    """The default TLS client context, trusting only ca_file's certificates
    when given. Raises ValueError naming the file."""
    if not ca_file:
        return ssl.create_default_context()
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"vigil_client: ca_file {ca_file!r}: read the CA certificates: {_describe(e)}") from e


def _parse_base(raw: str, context: ssl.SSLContext) -> _Base:
    text = raw.strip()
    try:
        u = urlsplit(text)
        port = u.port
    except ValueError as e:
        raise ValueError(f"vigil_client: server URL {raw!r}: {e}") from e
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"vigil_client: server URL {raw!r}: must be absolute http(s), like http://127.0.0.1:7711")
    prefix = u.path.rstrip("/")
    return _Base(f"{u.scheme}://{u.netloc}{prefix}", u.scheme, u.hostname, port, prefix, context)


def _query(**params: Any) -> Optional[str]:
    q = {k: str(v) for k, v in params.items() if v is not None and v != ""}
    return urlencode(q) if q else None


def _describe(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
