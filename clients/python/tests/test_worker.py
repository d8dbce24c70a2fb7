"""The example Python worker (examples/python-worker) as real processes:
killed with SIGKILL under `vigil up`, frozen with SIGSTOP, stopped with
SIGTERM, and started with bad settings."""

import os
import signal
import subprocess
import sys
import time
import unittest
from datetime import datetime, timezone
from typing import Dict, List, Set

from _support import REPO, WORKER, Proc, VigilTestCase, eventually, lines_with, processes, vigil_bin
from vigil_client import Client, env_prefix
from vigil_client._decide import parse_time

RULE = "must be a positive duration like 30s"


class WorkerSettingsTest(VigilTestCase):
    def test_bad_settings_fail_at_start_naming_the_variable(self):
        cases = [
            ("worker", "LIVENESS_INTERVAL", "-1"),
            ("worker", "LIVENESS_INTERVAL", "abc"),
            ("py-worker", "HEARTBEAT_INTERVAL", "-1"),
            ("py-worker", "POLL_INTERVAL", "abc"),
            ("py-worker", "POLL_INTERVAL", "0"),
        ]
        for kind, suffix, value in cases:
            var = env_prefix(kind) + suffix
            with self.subTest(var=var, value=value):
                env = dict(os.environ, VIGIL_KIND=kind, VIGIL_URL="http://127.0.0.1:9", PYTHONDONTWRITEBYTECODE="1")
                env[var] = value
                out = subprocess.run([sys.executable, WORKER], env=env, capture_output=True, text=True, timeout=30)
                self.assertEqual(out.returncode, 1, out.stderr)
                self.assertIn(f'{var}="{value}": {RULE}', out.stderr)
        self.assertIn('VIGIL_WORKER_LIVENESS_INTERVAL="-1": must be a positive duration like 30s',
                      subprocess.run([sys.executable, WORKER], capture_output=True, text=True, timeout=30,
                                     env=dict(os.environ, VIGIL_KIND="worker", VIGIL_WORKER_LIVENESS_INTERVAL="-1",
                                              PYTHONDONTWRITEBYTECODE="1")).stderr)

    def test_fleet_file_runs_the_python_worker(self):
        with open(os.path.join(REPO, "examples", "fleet.yaml"), encoding="utf-8") as f:
            fleet = f.read()
        self.assertIn('"examples/python-worker/worker.py"', fleet)
        self.assertTrue(os.path.isfile(WORKER))


class WorkerTest(VigilTestCase):
    def enqueue(self, c: Client, payload: Dict) -> Dict:
        return c.enqueue("py_sleep", payload)

    def holder(self, c: Client, task_id: int, not_owner: str = "") -> Dict:
        """Waits until the task is running under an owner other than not_owner
        and returns the task row."""
        row: Dict = {}

        def claimed() -> bool:
            row.update(c.get_task(task_id))
            return row["status"] == "running" and row.get("lease_owner") not in (None, not_owner)

        eventually(30, f"task {task_id} to be claimed", claimed)
        return row

    def test_completes_py_sleep_tasks(self):
        url = self.start_server()
        c = Client(url)
        w = self.start_worker(url)
        queued = self.enqueue(c, {"seconds": 0.2})
        eventually(30, "the task to complete", lambda: c.get_task(queued["task_id"])["status"] == "completed")
        done = c.get_task(queued["task_id"])
        self.assertEqual(done["result"], {"slept_s": 0.2, "instance_id": done["completed_by"], "pid": w.pid})
        owner = c.get_process(done["completed_by"])
        self.assertEqual((owner["process_kind"], owner["pid"], owner["status"]), ("py-worker", w.pid, "alive"))

        bad = self.enqueue(c, {"seconds": -1})
        eventually(30, "the bad task to fail", lambda: c.get_task(bad["task_id"])["attempts"] == 1)
        self.assertIn("payload seconds", c.get_task(bad["task_id"])["last_error"])

    def test_sigterm_drains_with_liveness_kept_up(self):
        url = self.start_server()
        c = Client(url)
        # 1s liveness (a 3s alive window): a loaded machine's late heartbeat
        # must not read as the drain stopping liveness.
        w = self.start_worker(url, liveness="1s", heartbeat="200ms")
        queued = self.enqueue(c, {"seconds": 2})
        running = self.holder(c, queued["task_id"])
        inst = running["lease_owner"]
        w.signal(signal.SIGTERM)

        statuses: List[str] = []
        while w.running():
            statuses.append(c.get_process(inst)["status"])
            time.sleep(0.05)  # a sampling period, not an assertion on time
        self.assertEqual(w.wait(5), 0, w.output())
        self.assertEqual(set(statuses[:-1]) or {"alive"}, {"alive"}, "liveness stopped during the drain")
        done = c.get_task(queued["task_id"])
        self.assertEqual((done["status"], done["completed_by"]), ("completed", inst))
        row = c.get_process(inst)
        self.assertEqual(row["status"], "stopped")
        self.assertIsNotNone(row.get("exited_at"))
        self.assertTrue(lines_with(w.output(), "draining", f"task_id={queued['task_id']}"))

    def test_frozen_worker_gets_lease_lost_and_its_handler_sees_it(self):
        """A worker frozen (SIGSTOP) past its lease window and resumed after its
        task was reclaimed: its lease heartbeat and its completion are refused
        with LeaseLostError, its handler sees the cancellation, and the task's
        result is the new holder's."""
        lease_window = 2.0
        url = self.start_server("--lease-timeout", "2s")
        c = Client(url)
        workers = {}
        for _ in range(2):
            p = self.start_worker(url, liveness="500ms", heartbeat="300ms")
            workers[p.pid] = p
        eventually(30, "two alive workers", lambda: sum(
            1 for r in processes(c, "py-worker").values() if r["status"] == "alive" and r["pid"] in workers) == 2)

        # The handler ignores cancellation so that the frozen worker, once
        # resumed, really tries to complete; and it outlasts the freeze, so
        # the resumed holder is still renewing when it learns it lost the task.
        queued = self.enqueue(c, {"seconds": 10, "ignore_cancel": True})
        first = self.holder(c, queued["task_id"])
        frozen = c.get_process(first["lease_owner"])
        frozen_proc = workers[frozen["pid"]]
        frozen_proc.signal(signal.SIGSTOP)
        froze_at = time.monotonic()

        second = self.holder(c, queued["task_id"], not_owner=frozen["instance_id"])
        self.assertGreater(second["lease_epoch"], first["lease_epoch"])
        successor = second["lease_owner"]
        eventually(30, "the lease window to pass", lambda: time.monotonic() - froze_at > lease_window + 0.5)
        frozen_proc.signal(signal.SIGCONT)

        tid = f"task_id={queued['task_id']}"
        eventually(30, "the resumed worker to be refused", lambda: (
            lines_with(frozen_proc.output(), "lease heartbeat refused", "LeaseLostError", tid)
            and lines_with(frozen_proc.output(), "complete refused", "LeaseLostError", tid)))
        out = frozen_proc.output()
        self.assertTrue(lines_with(out, "handler saw cancellation", tid), out)
        self.assertTrue(lines_with(out, "lease lost", tid) or lines_with(out, "handler cancelled", tid), out)

        eventually(60, "the successor to complete the task",
                   lambda: c.get_task(queued["task_id"])["status"] == "completed")
        done = c.get_task(queued["task_id"])
        self.assertEqual(done["completed_by"], successor)
        self.assertEqual(done["result"]["instance_id"], successor, "the result is the new holder's")


class WorkerUnderUpTest(VigilTestCase):
    """The example worker supervised by `vigil up`, as examples/fleet.yaml runs it."""

    def start_up(self, names: List[str]) -> str:
        fleet = os.path.join(self.tmp, "fleet.yaml")
        with open(fleet, "w", encoding="utf-8") as f:
            f.write("agents:\n")
            for name in names:
                p = env_prefix(name)
                f.write(
                    f"  - name: {name}\n"
                    # As examples/fleet.yaml runs it.
                    f"    command: [\"python3\", \"examples/python-worker/worker.py\"]\n"
                    f"    dir: \"{REPO}\"\n"
                    f"    env:\n"
                    f"      {p}LIVENESS_INTERVAL: \"1s\"\n"
                    f"      {p}HEARTBEAT_INTERVAL: \"1s\"\n"
                    f"      {p}POLL_INTERVAL: \"100ms\"\n"
                )
        up = self.start(
            [vigil_bin(), "up", "--fleet", fleet, "--db", os.path.join(self.tmp, "up.db"), "--addr", "127.0.0.1:0",
             "--sweep-interval", "200ms", "--backoff-min", "500ms", "--stop-grace", "5s"],
            name="up",
        )
        url = self.wait_url(up)
        self.addCleanup(self.stop_up, up, Client(url))
        return url

    def stop_up(self, up: Proc, c: Client) -> None:
        """SIGTERM stops the agents (own process groups) and then the server;
        any worker still running after that is killed by pid."""
        pids: Set[int] = set()
        try:
            pids = {r["pid"] for r in processes(c).values()}
        except Exception:  # noqa: BLE001 - the server may be gone already
            pass
        up.signal(signal.SIGTERM)
        try:
            up.wait(20)
        except subprocess.TimeoutExpired:
            pass
        for pid in pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    mine = b"examples/python-worker/worker.py" in f.read()
            except OSError:
                mine = False
            if mine:
                os.kill(pid, signal.SIGKILL)

    def test_killed_worker_shows_stopped_and_its_task_moves_on(self):
        """A worker killed with SIGKILL while holding a task shows stopped once
        3× its liveness interval has passed; its task is reclaimed at once (not
        after the 5 min lease window) and completed by the other worker; and
        `vigil up` restarts the killed one."""
        names = ["py-a", "py-b"]
        url = self.start_up(names)
        c = Client(url)

        def alive_kinds() -> Set[str]:
            return {r["process_kind"] for r in processes(c).values() if r["status"] == "alive"}

        eventually(60, "both workers alive", lambda: alive_kinds() == set(names))

        queued = c.enqueue("py_sleep", {"seconds": 6})  # still running when the kill lands
        row: Dict = {}

        def claimed() -> bool:
            row.update(c.get_task(queued["task_id"]))
            return row["status"] == "running" and bool(row.get("lease_owner"))

        eventually(30, "the task to be claimed", claimed)
        victim = c.get_process(row["lease_owner"])
        os.kill(victim["pid"], signal.SIGKILL)
        killed_at = time.monotonic()

        def victim_stopped() -> bool:
            r = c.get_process(victim["instance_id"])
            if r["status"] != "stopped":
                return False
            # Same host: the server's clock is this one.
            silent = datetime.now(timezone.utc) - parse_time(r["last_heartbeat_at"])
            self.assertGreaterEqual(silent.total_seconds(), 3 * 1.0, "shown stopped before 3× its liveness interval")
            return True

        eventually(30, "the killed worker to show stopped", victim_stopped)
        self.assertIsNone(c.get_process(victim["instance_id"]).get("exited_at"), "a SIGKILL records no clean exit")

        eventually(60, "the task to be completed by the other worker",
                   lambda: c.get_task(queued["task_id"])["status"] == "completed")
        self.assertLess(time.monotonic() - killed_at, 120, "the task waited out the lease window")
        done = c.get_task(queued["task_id"])
        self.assertEqual(done["reclaims"], 1)
        self.assertNotEqual(done["completed_by"], victim["instance_id"])
        finisher = c.get_process(done["completed_by"])
        self.assertEqual(finisher["status"], "alive")
        # The other agent, or the killed one restarted by `vigil up` (a new
        # process and a new instance), whichever claimed first.
        self.assertNotEqual(finisher["pid"], victim["pid"])
        self.assertEqual(done["result"]["instance_id"], done["completed_by"])

        eventually(60, "`vigil up` to restart the killed worker", lambda: any(
            r["process_kind"] == victim["process_kind"] and r["status"] == "alive" and r["pid"] != victim["pid"]
            for r in processes(c).values()))


if __name__ == "__main__":
    unittest.main()
