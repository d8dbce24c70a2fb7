"""The Agent runtime in this process against a real `vigil serve`."""

import threading
import time
import unittest
from typing import Any, Dict, List, Optional

from _support import FAST, AgentTestCase, Proxy, eventually
from vigil_client import (
    Agent,
    Client,
    DrainingError,
    FencedError,
    LeaseLostError,
    Settings,
    Task,
)
from vigil_client._decide import parse_time


class AgentLivenessTest(AgentTestCase):
    def test_liveness_keeps_the_row_alive_then_exit(self):
        url = self.start_server()
        c = Client(url)
        agent = self.run_agent(url, {})  # no handlers: liveness only
        inst = agent.instance_id

        # Alive well past 3× its interval: the liveness thread keeps it so.
        def beating_for_a_while() -> bool:
            row = c.get_process(inst)
            self.assertEqual(row["status"], "alive")
            age = parse_time(row["last_heartbeat_at"]) - parse_time(row["started_at"])
            return age.total_seconds() >= 4 * FAST.liveness_interval

        eventually(30, "liveness heartbeats past the alive window", beating_for_a_while)
        row = c.get_process(inst)
        self.assertEqual((row["process_kind"], row["liveness_interval_s"]), ("py-agent", 0.3))

        self.stop_agent(agent)
        row = c.get_process(inst)
        self.assertEqual(row["status"], "stopped")
        self.assertIsNotNone(row.get("exited_at"), "the instance was marked exited")
        self.assertTrue(self.records.has("exited", inst))

    def test_registration_refused_is_raised(self):
        url = self.start_server()
        agent = Agent("bad kind!", {}, settings=FAST, client=Client(url), logger=self.logger)
        from vigil_client import BadRequestError

        with self.assertRaises(BadRequestError):
            agent.run()


class AgentTaskTest(AgentTestCase):
    def test_completes_with_result(self):
        url = self.start_server()
        c = Client(url)

        def double(task: Task) -> Dict[str, Any]:
            return {"n": task.payload["n"] * 2, "instance_id": task.instance_id, "epoch": task.epoch}

        agent = self.run_agent(url, {"double": double})
        queued = c.enqueue("double", {"n": 21})
        done = self.wait_status(c, queued["task_id"], "completed")
        self.assertEqual(done["result"], {"n": 42, "instance_id": agent.instance_id, "epoch": 1})
        self.assertEqual(done["completed_by"], agent.instance_id)
        self.assertTrue(self.records.has("completed", f"task_id={queued['task_id']}"))
        eventually(10, "the current task to be cleared", lambda: c.get_process(agent.instance_id).get("current_task_id") is None)

    def test_records_handler_failures(self):
        url = self.start_server()
        c = Client(url)

        def broken(task: Task) -> None:
            raise ValueError(f"cannot handle {task.payload['what']}")

        def unencodable(task: Task) -> Any:
            return {"x": object()}

        self.run_agent(url, {"broken": broken, "unencodable": unencodable})
        t1 = c.enqueue("broken", {"what": "this"}, max_attempts=1)
        t2 = c.enqueue("unencodable", {}, max_attempts=1)
        dead = self.wait_status(c, t1["task_id"], "dead_letter")
        self.assertEqual((dead["attempts"], dead["last_error"]), (1, "ValueError: cannot handle this"))
        dead = self.wait_status(c, t2["task_id"], "dead_letter")
        self.assertIn("encode result", dead["last_error"])
        self.assertTrue(self.records.has("handler raised", "cannot handle this"))

    def test_renews_the_lease(self):
        url = self.start_server("--lease-timeout", "1s")
        c = Client(url)
        release = threading.Event()
        seen: List[Task] = []

        def hold(task: Task) -> str:
            seen.append(task)
            release.wait(30)
            return "held"

        self.run_agent(url, {"hold": hold})
        queued = c.enqueue("hold", {})
        running = self.wait_status(c, queued["task_id"], "running")

        def renewed_past_the_window() -> bool:
            row = c.get_task(queued["task_id"])
            self.assertEqual((row["status"], row["lease_epoch"]), ("running", 1), "the lease lapsed")
            held = parse_time(row["last_heartbeat_at"]) - parse_time(running["started_at"])
            return held.total_seconds() > 2.0  # twice the lease window

        eventually(30, "lease heartbeats past the lease window", renewed_past_the_window)
        release.set()
        done = self.wait_status(c, queued["task_id"], "completed")
        self.assertEqual((done["result"], done["reclaims"]), ("held", 0))
        self.assertFalse(seen[0].cancelled.is_set())

    def test_cancels_the_handler_when_the_lease_is_lost(self):
        """The server refuses the lease (409 stale_epoch): the handler's event is
        set with LeaseLostError, its late completion is refused, and the task
        goes on under a new epoch."""
        url = self.start_server()
        c = Client(url)
        first: List[Task] = []
        causes: List[Optional[BaseException]] = []

        def work(task: Task) -> Dict[str, int]:
            if task.epoch == 1:
                first.append(task)
                task.cancelled.wait(30)
                causes.append(task.cancel_cause)
            return {"epoch": task.epoch}

        self.run_agent(url, {"work": work})
        queued = c.enqueue("work", {})
        eventually(30, "the handler to start", lambda: bool(first))
        c.release(first[0].lease)  # the lease is taken away; the agent's next heartbeat is refused

        eventually(30, "the handler to be cancelled", lambda: bool(causes))
        self.assertIsInstance(causes[0], LeaseLostError)
        self.assertEqual((causes[0].status, causes[0].code), (409, "stale_epoch"))
        done = self.wait_status(c, queued["task_id"], "completed")
        self.assertEqual(done["result"], {"epoch": 2}, "the result is the new holder's")
        tid = f"task_id={queued['task_id']}"
        self.assertTrue(self.records.has("lease heartbeat refused", "LeaseLostError", tid))
        eventually(10, "the late completion to be refused", lambda: self.records.has("complete refused", "lease_epoch=1", tid))

    def test_lease_deadline_cancels_the_handler(self):
        """No renewal accepted within the lease window (here: none sent, the
        heartbeat interval being longer): the handler is cancelled on the
        agent's own clock, before the server hands the task on."""
        url = self.start_server("--lease-timeout", "1s")
        c = Client(url)
        causes: List[Optional[BaseException]] = []

        def work(task: Task) -> None:
            if task.epoch == 1:
                task.cancelled.wait(30)
                causes.append(task.cancel_cause)

        slow_renewals = Settings(liveness_interval=0.3, heartbeat_interval=30, poll_interval=0.1)
        self.run_agent(url, {"work": work}, settings=slow_renewals)
        c.enqueue("work", {})
        eventually(30, "the handler to be cancelled", lambda: bool(causes))
        self.assertIsInstance(causes[0], LeaseLostError)
        self.assertIn("no renewal accepted within the lease window of 1s", str(causes[0]))
        self.assertTrue(self.records.has("lease heartbeat interval is not shorter than the lease window"))


class AgentDrainTest(AgentTestCase):
    def test_drain_lets_the_handler_finish_with_liveness_kept_up(self):
        url = self.start_server()
        c = Client(url)
        started = threading.Event()

        def work(task: Task) -> str:
            started.set()
            task.sleep(1.5)  # five liveness intervals
            return "finished"

        agent = self.run_agent(url, {"work": work})
        inst = agent.instance_id
        queued = c.enqueue("work", {})
        self.assertTrue(started.wait(30))
        agent.stop()
        statuses = []
        while agent.thread.is_alive():  # type: ignore[attr-defined]
            statuses.append(c.get_process(inst)["status"])
            agent.thread.join(0.05)  # type: ignore[attr-defined]
        self.assertGreater(len(statuses), 3)
        self.assertEqual(set(statuses[:-1]), {"alive"}, "liveness stopped during the drain")
        done = c.get_task(queued["task_id"])
        self.assertEqual((done["status"], done["result"]), ("completed", "finished"))
        row = c.get_process(inst)
        self.assertEqual(row["status"], "stopped")
        self.assertIsNotNone(row.get("exited_at"))
        self.assertTrue(self.records.has("draining"))

    def test_drain_releases_an_unfinished_task(self):
        url = self.start_server()
        c = Client(url)
        causes: List[Optional[BaseException]] = []
        started = threading.Event()

        def work(task: Task) -> None:
            started.set()
            task.cancelled.wait(30)
            causes.append(task.cancel_cause)
            raise RuntimeError("interrupted")

        agent = self.run_agent(url, {"work": work}, drain_grace=0.3)
        queued = c.enqueue("work", {})
        self.assertTrue(started.wait(30))
        self.stop_agent(agent)
        self.assertIsInstance(causes[0], DrainingError)
        row = c.get_task(queued["task_id"])
        self.assertEqual((row["status"], row["attempts"], row["lease_owner"]), ("scheduled", 0, None))
        self.assertTrue(self.records.has("released", f"task_id={queued['task_id']}"))


class AgentFenceTest(AgentTestCase):
    def test_fences_when_liveness_fails_then_reregisters(self):
        url = self.start_server()
        proxy = Proxy(url)
        self.addCleanup(proxy.close)
        c = Client(url)
        causes: List[Optional[BaseException]] = []
        started = threading.Event()

        def work(task: Task) -> str:
            if task.epoch == 1:
                started.set()
                task.cancelled.wait(30)
                causes.append(task.cancel_cause)
                raise RuntimeError("cut off")
            return task.instance_id

        agent = self.run_agent(proxy.url, {"work": work})
        old = agent.instance_id
        queued = c.enqueue("work", {})
        self.assertTrue(started.wait(30))
        proxy.blocked = True  # no heartbeat gets through

        eventually(30, "the handler to be cancelled by the fence", lambda: bool(causes))
        self.assertIsInstance(causes[0], FencedError)
        self.assertIn("alive window", str(causes[0]))
        self.assertTrue(self.records.has("fenced", old))

        proxy.blocked = False
        eventually(30, "a new instance", lambda: agent.instance_id not in (None, old))
        self.assertTrue(self.records.has("re-registered after fence; resuming", old))
        done = self.wait_status(c, queued["task_id"], "completed")
        self.assertEqual(done["result"], agent.instance_id, "the new instance finished the task")
        self.assertEqual(c.get_process(old)["status"], "stopped")
        self.assertEqual(c.get_process(agent.instance_id)["status"], "alive")


if __name__ == "__main__":
    unittest.main()


class FaultyCompletes(Client):
    """A Client whose first ``refuse`` completes never reach the server (a
    connection error, then 503 unavailable, alternately), and whose next
    ``drop_answers`` completes are applied by the server but answered with
    a connection error, as when a connection breaks after the write."""

    def __init__(self, url: str, *, refuse: int = 0, drop_answers: int = 0) -> None:
        super().__init__(url)
        self.refuse, self.drop_answers = refuse, drop_answers
        self.seen = self.forwarded = 0
        self._mu = threading.Lock()

    def complete(self, lease: Any, result: Any = None, **kw: Any) -> Any:
        from vigil_client import UnreachableError, VigilError

        with self._mu:
            self.seen += 1
            n = self.seen
        if n <= self.refuse:
            if n % 2:
                raise UnreachableError("connection reset by peer (test fault)", op="complete")
            raise VigilError("the store is unavailable; retry later", status=503, code="unavailable", op="complete")
        with self._mu:
            self.forwarded += 1
        row = super().complete(lease, result, **kw)
        if n <= self.refuse + self.drop_answers:
            raise UnreachableError("connection reset by peer after the write (test fault)", op="complete")
        return row


class AgentOutcomeTest(AgentTestCase):
    """A finished result is kept until the server accepts or refuses it
    (DESIGN T8, issue #12 cases 1 and 6)."""

    def work(self, task: Task) -> Dict[str, int]:
        return {"n": task.id}

    def test_result_kept_through_an_outage_longer_than_the_old_budget(self):
        url = self.start_server()
        c = Client(url)
        faulty = FaultyCompletes(url, refuse=5)  # the old runtime gave up after 5 tries (~4s)
        agent = self.run_agent(url, {"work": self.work}, client=faulty)
        queued = c.enqueue("work", lease_timeout=60)
        done = self.wait_status(c, queued["task_id"], "completed")
        self.assertEqual(done["result"], {"n": queued["task_id"]})
        self.assertEqual(done["completed_by"], agent.instance_id)
        self.assertEqual((faulty.seen, faulty.forwarded), (6, 1), "stored by exactly one request")
        eventually(10, "the completion to be logged", lambda: self.records.has("completed", "attempts=6"))
        for bad in ("lease lost", "gave up", "complete failed:"):
            self.assertFalse(self.records.has(bad), bad)

    def test_retried_complete_whose_answer_was_lost_is_accepted(self):
        url = self.start_server()
        c = Client(url)
        faulty = FaultyCompletes(url, drop_answers=1)
        self.run_agent(url, {"work": self.work}, client=faulty)
        queued = c.enqueue("work", lease_timeout=60)
        eventually(30, "the completion to be logged", lambda: self.records.has("completed", "attempts=2"))
        self.assertEqual(faulty.forwarded, 2)
        done = c.get_task(queued["task_id"])
        self.assertEqual((done["status"], done["result"]), ("completed", {"n": queued["task_id"]}))
        self.assertFalse(self.records.has("lease lost"), self.records.text())


class StoreDownClient(Client):
    """A Client whose heartbeats (liveness and lease) are answered 503
    ``unavailable`` while ``down`` is set, as by a server whose store is
    away."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.down = threading.Event()
        self.refused = 0
        self._mu = threading.Lock()

    def _refuse(self, op: str) -> None:
        from vigil_client import VigilError

        with self._mu:
            self.refused += 1
        raise VigilError("the store is unavailable; retry later", status=503, code="unavailable", op=op)

    def process_heartbeat(self, *args: Any, **kw: Any) -> Any:
        if self.down.is_set():
            self._refuse("heartbeat process")
        return super().process_heartbeat(*args, **kw)

    def task_heartbeat(self, *args: Any, **kw: Any) -> Any:
        if self.down.is_set():
            self._refuse("heartbeat task")
        return super().task_heartbeat(*args, **kw)


class AgentStoreOutageTest(AgentTestCase):
    """Heartbeats answered 503 unavailable neither fence the agent nor lose
    its lease: the server gives a full window once its store is back
    (DESIGN L8, issue #12 case 1). The server's reclaimer is held off (an
    hour between passes) to stand for that grace, since its store is up."""

    def test_agent_rides_out_a_store_outage(self):
        url = self.start_server("--sweep-interval", "1h")
        c = Client(url)
        finish = threading.Event()
        cancelled: List[BaseException] = []

        def work(task: Task) -> str:
            while not finish.is_set():
                if task.cancelled.is_set():
                    cancelled.append(task.cancel_cause or RuntimeError("cancelled"))
                    raise task.cancel_cause or RuntimeError("cancelled")
                time.sleep(0.02)
            return "done"

        down = StoreDownClient(url)
        agent = self.run_agent(url, {"work": work}, client=down)
        inst = agent.instance_id
        queued = c.enqueue("work", lease_timeout=1)
        self.wait_status(c, queued["task_id"], "running")
        down.down.set()
        # Three alive windows (0.9s) and the lease window (1s) twice over.
        eventually(30, "2s of 503s", lambda: down.refused >= 20)
        down.down.clear()
        self.assertEqual(cancelled, [], "the handler ran on")
        self.assertEqual(agent.instance_id, inst, "not fenced: no re-registration")
        finish.set()
        done = self.wait_status(c, queued["task_id"], "completed")
        self.assertEqual(done["completed_by"], inst)
        self.assertEqual(done["reclaims"], 0)


class HeartbeatsUnreachableClient(Client):
    """A Client whose heartbeats fail as if the server could not be reached
    while ``down`` is set (a server being restarted)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.down = threading.Event()

    def _refuse(self, op: str) -> None:
        from vigil_client import UnreachableError

        raise UnreachableError("connection refused (test fault)", op=op)

    def process_heartbeat(self, *args: Any, **kw: Any) -> Any:
        if self.down.is_set():
            self._refuse("heartbeat process")
        return super().process_heartbeat(*args, **kw)

    def task_heartbeat(self, *args: Any, **kw: Any) -> Any:
        if self.down.is_set():
            self._refuse("heartbeat task")
        return super().task_heartbeat(*args, **kw)


class AgentFencedReleaseTest(AgentTestCase):
    """A handler stopped by the fence has its task released, not failed: a
    server restart must not count an attempt (attacker finding F3)."""

    def test_fenced_handler_releases_its_task(self):
        url = self.start_server("--sweep-interval", "1h")
        c = Client(url)
        started = threading.Event()

        def work(task: Task) -> str:
            started.set()
            task.cancelled.wait(30)
            raise RuntimeError(f"interrupted: {task.cancel_cause}")

        net = HeartbeatsUnreachableClient(url)
        queued = c.enqueue("work")  # claimed at the agent's first poll; the next is an hour away
        self.run_agent(url, {"work": work}, client=net, settings=Settings(liveness_interval=0.1, heartbeat_interval=0.1, poll_interval=3600))
        self.assertTrue(started.wait(30))
        net.down.set()
        row = self.wait_status(c, queued["task_id"], "scheduled")
        net.down.clear()
        self.assertEqual((row["attempts"], row["reclaims"]), (0, 0), row.get("last_error"))
        eventually(10, "the release to be logged", lambda: self.records.has("handler stopped by the fence: releasing the task"))
