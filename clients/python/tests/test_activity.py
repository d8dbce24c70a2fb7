"""v2 lease heartbeats (DESIGN T4): activity_at from the client and from a
handler's task.activity(), against a real `vigil serve`."""

import threading
import unittest
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, List, Optional

from _support import AgentTestCase, eventually
from vigil_client import BadRequestError, Client, LeaseLostError, Settings, Task
from vigil_client._decide import format_time, parse_time


def ms(at: datetime) -> datetime:
    """at as the API stores it: UTC, truncated to milliseconds."""
    return parse_time(format_time(at))


class ActivityTest(AgentTestCase):
    def test_v2_heartbeat_carries_activity(self):
        """A v2 lease heartbeat (schema_version 2, activity_at) is accepted and
        its activity recorded apart from the heartbeat; one from the future is
        refused with 400; v1 heartbeats still work."""
        c = Client(self.start_server())
        inst = c.register_process("worker", 30).instance
        c.enqueue("echo", {})
        lease = inst.lease(c.claim(inst, ["echo"]))

        row = c.activity(lease)
        self.assertEqual(row["heartbeat_schema_version"], 2)
        self.assertGreaterEqual(parse_time(row["last_activity_at"]),
                                parse_time(row["started_at"]).replace(microsecond=0))

        at = datetime.now(timezone.utc)  # not before the first activity: it moves last_activity_at forward
        row = c.task_heartbeat(lease, activity_at=at)
        self.assertEqual(parse_time(row["last_activity_at"]), ms(at))
        self.assertEqual((row["lease_epoch"], row["heartbeat_schema_version"]), (lease.epoch, 2))

        with self.assertRaises(BadRequestError) as cm:
            c.task_heartbeat(lease, activity_at=datetime.now(timezone.utc) + timedelta(hours=1))
        self.assertEqual(cm.exception.code, "invalid")
        self.assertIn("activity_at", str(cm.exception))

        row = c.task_heartbeat(lease)  # v1: no schema_version sent
        self.assertEqual(row["heartbeat_schema_version"], 1)
        self.assertEqual(parse_time(row["last_activity_at"]), ms(at), "a v1 heartbeat is no activity")
        c.complete(lease, None)

    def test_task_activity_makes_the_periodic_heartbeats_v2(self):
        """Periodic lease heartbeats are v1 until the handler reports activity;
        then v2, carrying the time of that activity, not their own."""
        url = self.start_server()
        c = Client(url)
        go, done = threading.Event(), threading.Event()
        reported: List[Any] = []

        def work(task: Task) -> str:
            go.wait(30)
            reported.append(task.activity())
            reported.append(task.last_activity)
            done.wait(30)
            return "ok"

        self.run_agent(url, {"work": work})
        queued = c.enqueue("work", {})
        tid = queued["task_id"]

        def renewed_after(t0: str, version: int) -> bool:
            row = c.get_task(tid)
            return parse_time(row["last_heartbeat_at"]) > parse_time(t0) and row["heartbeat_schema_version"] == version

        running: Dict[str, Any] = {}
        eventually(30, "the task to run", lambda: running.update(c.get_task(tid)) or running["status"] == "running")
        eventually(30, "a periodic v1 heartbeat", lambda: renewed_after(running["started_at"], 1))

        go.set()
        eventually(30, "the handler to report activity", lambda: len(reported) == 2)
        row, at = reported
        self.assertEqual(row["heartbeat_schema_version"], 2)
        # The activity goes as its age (DESIGN T7): the server places it on
        # its own clock, here the same machine's, within a request's time.
        first = parse_time(row["last_activity_at"])
        self.assertLess(abs((first - ms(at)).total_seconds()), 1.0)

        eventually(30, "a periodic v2 heartbeat", lambda: renewed_after(row["last_heartbeat_at"], 2))
        later = parse_time(c.get_task(tid)["last_activity_at"])
        self.assertLess((later - first).total_seconds(), 1.0, "periodic heartbeats carry no new activity")
        done.set()
        self.assertEqual(self.wait_status(c, tid, "completed")["result"], "ok")

    def test_activity_gated_lease_lapses_without_progress(self):
        """Under --lease-expiry activity, a handler that reported activity once
        and then stalls loses its lease although its process renews it: the
        handler is cancelled with LeaseLostError and the task moves on."""
        url = self.start_server("--lease-expiry", "activity", "--lease-timeout", "2s")
        c = Client(url)
        causes: List[Optional[BaseException]] = []

        def work(task: Task) -> Dict[str, int]:
            if task.epoch == 1:
                task.activity()
                task.cancelled.wait(30)  # stalled: no more progress
                causes.append(task.cancel_cause)
                task.check_cancelled()  # raises the cause: a failure, or refused if already reclaimed
            return {"epoch": task.epoch}

        self.run_agent(url, {"work": work}, settings=Settings(liveness_interval=0.3, heartbeat_interval=0.2, poll_interval=0.1))
        queued = c.enqueue("work", {})
        eventually(30, "the stalled handler to be cancelled", lambda: bool(causes))
        self.assertIsInstance(causes[0], LeaseLostError)
        self.assertIn("counted from the last activity reported", str(causes[0]))
        done = self.wait_status(c, queued["task_id"], "completed")
        self.assertEqual(done["result"], {"epoch": 2})
        self.assertEqual(done["attempts"] + done["reclaims"], 1, "given back once: failed by the handler or reclaimed")


if __name__ == "__main__":
    unittest.main()
