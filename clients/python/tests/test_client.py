"""Client against a real `vigil serve`: every agent-facing call and its errors."""

import os
import socket
import unittest

from _support import VigilTestCase, eventually, processes
from vigil_client import (
    BadRequestError,
    Client,
    Instance,
    LeaseLostError,
    NotFoundError,
    UnreachableError,
    VigilError,
)
from vigil_client._decide import parse_time


def free_port() -> int:
    """A loopback port nobody listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ClientProcessesTest(VigilTestCase):
    def test_register_heartbeat_exit(self):
        c = Client(self.start_server())
        c.health()
        reg = c.register_process("critic", 30, hostname="box1", pid=4242)
        inst = reg.instance
        self.assertNotIn(inst.token, repr(inst))
        self.assertNotIn("instance_token", reg.process)
        self.assertEqual(reg.process["process_kind"], "critic")
        self.assertEqual(reg.process["status"], "alive")
        self.assertEqual(reg.process["started_at"], reg.process["last_heartbeat_at"])

        row = c.process_heartbeat(inst)
        self.assertEqual(row["instance_id"], inst.id)
        self.assertGreaterEqual(parse_time(row["last_heartbeat_at"]), parse_time(reg.process["last_heartbeat_at"]))
        self.assertEqual(c.get_process(inst.id)["pid"], 4242)
        self.assertEqual(c.process_status("critic")["instance_id"], inst.id)
        self.assertIn(inst.id, processes(c, "critic"))
        page = c.list_processes(kind="critic", status="alive", limit=1)
        self.assertEqual([p["instance_id"] for p in page["processes"]], [inst.id])

        c.process_exit(inst)
        self.assertEqual(c.get_process(inst.id)["status"], "stopped")
        with self.assertRaises(VigilError) as cm:
            c.process_heartbeat(inst)
        self.assertIs(type(cm.exception), VigilError)
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "instance_exited"))

    def test_errors(self):
        c = Client(self.start_server())
        with self.assertRaises(BadRequestError) as cm:
            c.register_process("bad kind!", 30)
        self.assertEqual((cm.exception.status, cm.exception.code), (400, "invalid"))
        self.assertIn("process_kind", str(cm.exception))
        with self.assertRaises(NotFoundError) as cm:
            c.process_status("never-registered")
        self.assertEqual(cm.exception.code, "not_found")
        with self.assertRaises(NotFoundError):
            c.process_heartbeat(Instance("00000000-0000-4000-8000-000000000000", "x"))
        inst = c.register_process("critic", 30).instance
        with self.assertRaises(VigilError) as cm:
            c.process_heartbeat(Instance(inst.id, "not-the-token"))
        self.assertEqual((cm.exception.status, cm.exception.code), (403, "invalid_token"))


class ClientTasksTest(VigilTestCase):
    def test_claim_heartbeat_complete_fail_release(self):
        c = Client(self.start_server())
        inst = c.register_process("worker", 30).instance
        self.assertIsNone(c.claim(inst, ["echo"]), "nothing to claim: None")

        queued = c.enqueue("echo", {"text": "hi"}, max_attempts=3, max_reclaims=1)
        self.assertEqual((queued["status"], queued["payload"]), ("scheduled", {"text": "hi"}))
        task = c.claim(inst, ["echo"])
        self.assertEqual((task["task_id"], task["status"], task["lease_owner"]), (queued["task_id"], "running", inst.id))
        lease = inst.lease(task)
        self.assertEqual(lease.epoch, 1)
        self.assertEqual(c.get_process(inst.id)["current_task_id"], task["task_id"])

        row = c.task_heartbeat(lease)
        self.assertEqual(row["lease_epoch"], 1)
        done = c.complete(lease, {"ok": True})
        self.assertEqual((done["status"], done["result"], done["completed_by"]), ("completed", {"ok": True}, inst.id))
        with self.assertRaises(LeaseLostError) as cm:
            c.task_heartbeat(lease)
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "stale_epoch"))

        # fail → back to scheduled with the error; release → scheduled, no attempt.
        t2 = c.enqueue("echo", {"text": "again"})
        l2 = inst.lease(c.claim(inst, ["echo"]))
        failed = c.fail(l2, "boom", retry_after=0.01)
        self.assertEqual((failed["status"], failed["attempts"], failed["last_error"]), ("scheduled", 1, "boom"))
        eventually(10, "the failed task to be claimable again", lambda: c.claim(inst, ["echo"]) is not None)
        l3 = inst.lease(c.get_task(t2["task_id"]))
        self.assertEqual(l3.epoch, 2)
        released = c.release(l3)
        self.assertEqual((released["status"], released["attempts"]), ("scheduled", 1))
        with self.assertRaises(LeaseLostError):
            c.complete(l3, None)

        page = c.list_tasks(task_type="echo", limit=10)
        self.assertEqual({t["task_id"] for t in page["tasks"]}, {queued["task_id"], t2["task_id"]})
        with self.assertRaises(NotFoundError):
            c.get_task(999999)
        with self.assertRaises(BadRequestError):
            c.enqueue("bad type!")

    def test_stale_epoch_after_reclaim(self):
        """A holder whose task was reclaimed and claimed again gets LeaseLostError
        for every lease call, and changes nothing."""
        c = Client(self.start_server())
        a = c.register_process("worker", 30).instance
        b = c.register_process("worker", 30).instance
        c.enqueue("echo", {})
        first = a.lease(c.claim(a, ["echo"]))
        c.process_exit(a)  # a clean exit: reclaimed on the next sweep
        second_row = {}

        def claimed_by_b():
            row = c.claim(b, ["echo"])
            if row:
                second_row.update(row)
            return bool(row)

        eventually(10, "b to claim the reclaimed task", claimed_by_b)
        second = b.lease(second_row)
        self.assertGreater(second.epoch, first.epoch)
        for call in (lambda: c.task_heartbeat(first), lambda: c.complete(first, {"by": "a"}),
                     lambda: c.fail(first, "x"), lambda: c.release(first)):
            with self.assertRaises(LeaseLostError):
                call()
        c.complete(second, {"by": "b"})
        done = c.get_task(second.task_id)
        self.assertEqual((done["result"], done["completed_by"], done["reclaims"]), ({"by": "b"}, b.id, 1))


class ClientTransportTest(VigilTestCase):
    def test_fails_over_to_the_next_url(self):
        url = self.start_server()
        dead = f"http://127.0.0.1:{free_port()}"
        c = Client([dead, url])
        inst = c.register_process("worker", 30).instance  # a POST: the connection was refused, so it moved on
        self.assertEqual(c.urls, [url, dead], "the URL that answered is tried first")
        c.process_heartbeat(inst)

        with self.assertRaises(UnreachableError) as cm:
            Client([dead], timeout=2).health()
        self.assertEqual((cm.exception.status, cm.exception.code), (0, ""))
        self.assertTrue(cm.exception.transient)

    def test_server_token(self):
        token_file = os.path.join(self.tmp, "token")
        with open(token_file, "w") as f:
            f.write("a-server-token-of-32-characters!\n")
        url = self.start_server("--token-file", token_file)
        with self.assertRaises(VigilError) as cm:
            Client(url).register_process("worker", 30)
        self.assertEqual((cm.exception.status, cm.exception.code), (401, "unauthorized"))
        c = Client.from_env({"VIGIL_URL": url, "VIGIL_TOKEN_FILE": token_file})
        c.register_process("worker", 30)


if __name__ == "__main__":
    unittest.main()
