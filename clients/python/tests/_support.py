"""Test support: a real `vigil serve` (or `vigil up`) per test, real worker
processes, and waiting on conditions with a deadline.

The vigil binary comes from VIGIL_TEST_BIN; without it, one is built once
with `go build` from this checkout. Every child runs in its own process
group and is killed in cleanup.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import socket
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from typing import Any, Callable, Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
PY_ROOT = os.path.dirname(HERE)  # clients/python
REPO = os.path.dirname(os.path.dirname(PY_ROOT))
WORKER = os.path.join(REPO, "examples", "python-worker", "worker.py")

if PY_ROOT not in sys.path:
    sys.path.insert(0, PY_ROOT)

import vigil_client  # noqa: E402  (after the path set-up)
from vigil_client import Agent, Client, Settings  # noqa: E402

FAST = Settings(liveness_interval=0.3, heartbeat_interval=0.2, poll_interval=0.1)
"""Intervals for in-process agents: a lost signal shows within a second."""

_URL_RE = re.compile(r"url=(https?://127\.0\.0\.1:\d+)")
_bin_lock = threading.Lock()
_built_bin: Optional[str] = None


def vigil_bin() -> str:
    """The vigil binary under test: VIGIL_TEST_BIN, else built once from this checkout."""
    global _built_bin
    env_bin = os.environ.get("VIGIL_TEST_BIN")
    if env_bin:
        if not os.access(env_bin, os.X_OK):
            raise RuntimeError(f"VIGIL_TEST_BIN={env_bin!r}: not an executable file")
        return env_bin
    with _bin_lock:
        if _built_bin is None:
            go = shutil.which("go")
            if go is None:
                raise unittest.SkipTest("set VIGIL_TEST_BIN to a vigil binary (no `go` on PATH to build one)")
            bin_dir = tempfile.mkdtemp(prefix="vigil-pytest-bin-")
            atexit.register(shutil.rmtree, bin_dir, True)
            out = os.path.join(bin_dir, "vigil")
            subprocess.run([go, "build", "-o", out, "./cmd/vigil"], cwd=REPO, check=True)
            _built_bin = out
        return _built_bin


def eventually(timeout: float, what: str, cond: Callable[[], bool], interval: float = 0.05) -> None:
    """Polls cond until it holds. The timeout only guards against a hung test;
    it is not what the test measures."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class Proc:
    """A child process in its own process group, its output kept in a file."""

    def __init__(self, argv: Sequence[str], *, env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
                 log_dir: str, name: str) -> None:
        self.argv = list(argv)
        self.name = name
        self.log_path = os.path.join(log_dir, f"{name}.log")
        full_env = dict(os.environ)
        full_env["PYTHONDONTWRITEBYTECODE"] = "1"
        full_env["PYTHONUNBUFFERED"] = "1"
        if env:
            full_env.update(env)
        self._log = open(self.log_path, "wb")
        self.popen = subprocess.Popen(
            self.argv, env=full_env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.popen.pid

    def output(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", errors="replace")

    def running(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)

    def kill(self) -> None:
        """SIGCONT then SIGKILL to the whole group (frozen members included), then reap."""
        self.signal_group(signal.SIGCONT)
        self.signal_group(signal.SIGKILL)
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()


class VigilTestCase(unittest.TestCase):
    """A test case with a temp dir, child-process bookkeeping and a server."""

    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="vigil-pytest-")
        self.procs: List[Proc] = []
        self.addCleanup(self._cleanup)

    def _cleanup(self) -> None:
        for p in reversed(self.procs):
            p.kill()
        failed = self._outcome_failed()
        if failed:
            for p in self.procs:
                sys.stderr.write(f"\n--- output of {p.name} ({' '.join(p.argv[:3])} …) ---\n{p.output()}\n")
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _outcome_failed(self) -> bool:
        outcome = getattr(self, "_outcome", None)
        if outcome is None:
            return False
        errors = getattr(outcome, "errors", None)  # Python <= 3.10
        if errors is not None:
            return any(exc for _, exc in errors)
        result = getattr(outcome, "result", None)  # Python >= 3.11
        if result is None:
            return False
        return any(t is self for t, _ in list(result.failures) + list(result.errors))

    def start(self, argv: Sequence[str], *, env: Optional[Dict[str, str]] = None, name: str = "proc",
              cwd: Optional[str] = None) -> Proc:
        p = Proc(argv, env=env, cwd=cwd, log_dir=self.tmp, name=f"{name}-{len(self.procs)}")
        self.procs.append(p)
        return p

    def start_server(self, *args: str) -> str:
        """Runs `vigil serve` on a free loopback port over a fresh SQLite file
        (sweeping every 200ms) and returns its URL."""
        db = os.path.join(self.tmp, f"v{len(self.procs)}.db")
        p = self.start(
            [vigil_bin(), "serve", "--db", db, "--addr", "127.0.0.1:0", "--sweep-interval", "200ms", *args],
            name="serve",
        )
        return self.wait_url(p)

    def wait_url(self, p: Proc) -> str:
        found: List[str] = []

        def logged() -> bool:
            if not p.running():
                raise AssertionError(f"{p.name} exited with {p.popen.returncode}:\n{p.output()}")
            m = _URL_RE.search(p.output())
            if m:
                found.append(m.group(1))
            return bool(m)

        eventually(30, f"{p.name} to log its URL", logged)
        return found[0]

    def start_worker(self, url: str, *, kind: str = "py-worker", liveness: str = "1s", heartbeat: str = "1s",
                     poll: str = "100ms", extra: Optional[Dict[str, str]] = None) -> Proc:
        """Starts the example Python worker against url."""
        prefix = vigil_client.env_prefix(kind)
        env = {
            "VIGIL_URL": url,
            "VIGIL_KIND": kind,
            prefix + "LIVENESS_INTERVAL": liveness,
            prefix + "HEARTBEAT_INTERVAL": heartbeat,
            prefix + "POLL_INTERVAL": poll,
        }
        env.update(extra or {})
        return self.start([sys.executable, WORKER], env=env, name=f"worker-{kind}")


class Records(logging.Handler):
    """Keeps every log message, for assertions on what the agent said."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: List[str] = []
        self._mu = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._mu:
            self.lines.append(record.getMessage())

    def has(self, *words: str) -> bool:
        with self._mu:
            return any(all(w in line for w in words) for line in self.lines)

    def text(self) -> str:
        with self._mu:
            return "\n".join(self.lines)


class AgentTestCase(VigilTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.records = Records()
        self.logger = logging.getLogger(f"vigil_client.test.{self.id()}")
        self.logger.setLevel(logging.DEBUG)
        self.logger.propagate = False
        self.logger.addHandler(self.records)
        self.addCleanup(self._dump_logs)

    def _dump_logs(self) -> None:
        if self._outcome_failed():
            print(f"\n--- agent log of {self.id()} ---\n{self.records.text()}")

    def run_agent(self, url: str, handlers: Dict[str, Any], settings: Settings = FAST,
                  client: Optional[Client] = None, **kw: Any) -> Agent:
        """Starts an agent in a thread (with client, else a Client(url)); it is
        stopped and joined in cleanup."""
        agent = Agent("py-agent", handlers, settings=settings, client=client or Client(url), logger=self.logger, **kw)
        errors: List[BaseException] = []

        def target() -> None:
            try:
                agent.run()
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        t = threading.Thread(target=target, name="agent-under-test")
        t.start()
        agent.thread = t  # type: ignore[attr-defined]
        agent.errors = errors  # type: ignore[attr-defined]

        def stop() -> None:
            agent.stop()
            t.join(30)
            self.assertFalse(t.is_alive(), "the agent did not stop")

        self.addCleanup(stop)
        eventually(30, "the agent to register", lambda: agent.instance_id is not None or bool(errors))
        self.assertEqual(errors, [])
        return agent

    def stop_agent(self, agent: Agent) -> None:
        agent.stop()
        agent.thread.join(30)  # type: ignore[attr-defined]
        self.assertFalse(agent.thread.is_alive(), "the agent did not stop")  # type: ignore[attr-defined]
        self.assertEqual(agent.errors, [])  # type: ignore[attr-defined]

    def wait_status(self, c: Client, task_id: int, status: str, timeout: float = 30) -> Dict[str, Any]:
        row: Dict[str, Any] = {}

        def reached() -> bool:
            row.update(c.get_task(task_id))
            return row["status"] == status

        eventually(timeout, f"task {task_id} to be {status}", reached)
        return row


def lines_with(out: str, *words: str) -> bool:
    """Whether one line of out contains every word."""
    return any(all(w in line for w in words) for line in out.splitlines())


def processes(client: vigil_client.Client, kind: Optional[str] = None) -> Dict[str, dict]:
    """Every process row (of kind), by instance id."""
    page = client.list_processes(kind=kind, limit=1000)
    return {p["instance_id"]: p for p in page["processes"]}


class Proxy:
    """A TCP forwarder in front of a server, to cut an agent off from it and
    let it back: while ``blocked``, new connections are closed at once."""

    def __init__(self, target_url: str) -> None:
        from urllib.parse import urlsplit

        u = urlsplit(target_url)
        self.target = (u.hostname, u.port)
        self.blocked = False
        self._closed = False
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, name="test-proxy", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            if self.blocked:
                conn.close()
                continue
            try:
                up = socket.create_connection(self.target, timeout=5)
            except OSError:
                conn.close()
                continue
            threading.Thread(target=self._bridge, args=(conn, up), daemon=True).start()

    def _bridge(self, conn: socket.socket, up: socket.socket) -> None:
        back = threading.Thread(target=self._pump, args=(up, conn), daemon=True)
        back.start()
        self._pump(conn, up)
        back.join()
        conn.close()
        up.close()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            src.settimeout(None)
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self) -> None:
        self._closed = True
        self.sock.close()
        self._thread.join(2)
