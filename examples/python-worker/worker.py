#!/usr/bin/env python3
"""A vigil agent written in Python on clients/python (vigil_client).

It handles ``py_sleep`` tasks with payload

    {"seconds": N, "ignore_cancel": false, "report_activity": false}

by sleeping N seconds, and completes each with

    {"slept_s": N, "instance_id": "<its instance id>", "pid": <its pid>}

The sleep ends early when the runtime cancels the handler (lease lost,
fenced, or the worker stopping past its drain grace) unless ignore_cancel is
set, which shows what the runtime does with a handler that will not stop.
With report_activity it reports progress once a second with a v2 lease
heartbeat (``task.activity()``).

The task type is ``py_sleep``, not the Go workers' ``sleep``, so each fleet
takes its own tasks. Enqueue some with

    vigil tasks add py_sleep --payload '{"seconds": 5}'

Configuration, from the environment:

    VIGIL_KIND      process kind (default "py-worker"; `vigil up` sets it
                    to the agent's name)
    VIGIL_URL, VIGIL_TOKEN_FILE, VIGIL_CA_FILE, VIGIL_<KIND>_{LIVENESS,HEARTBEAT,POLL}_INTERVAL
                    as read by vigil_client.Agent

It logs to stderr: "claimed", "completed", "lease lost", each with task_id.
SIGINT/SIGTERM stop it cleanly (drain, then the instance is marked exited).
A bad setting stops it at once with a message naming the variable.
"""

import logging
import math
import os
import sys
import time

try:
    import vigil_client
except ImportError:  # run from a checkout: use the package next door
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))
    import vigil_client

from vigil_client import Agent, BadRequestError, SettingsError, Task

TASK_TYPE = "py_sleep"

log = logging.getLogger("py-worker")


def py_sleep(task: Task) -> dict:
    """Handles one py_sleep task."""
    payload = task.payload if isinstance(task.payload, dict) else {}
    seconds = payload.get("seconds", 0)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or math.isnan(seconds) or not 0 <= seconds <= 86400:
        raise ValueError("payload seconds: must be between 0 and 86400")
    ignore_cancel = bool(payload.get("ignore_cancel", False))
    report_activity = bool(payload.get("report_activity", False))

    start = time.monotonic()
    end = start + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0:
            break
        step = min(left, 1.0) if report_activity else left
        if ignore_cancel:
            time.sleep(step)
        elif not task.sleep(step):
            raise InterruptedError(
                f"sleep interrupted after {time.monotonic() - start:.3f}s: {task.cancel_cause}"
            )
        if report_activity and end - time.monotonic() > 0:
            try:
                task.activity()
            except BadRequestError as e:  # a server without v2 heartbeats
                log.warning("activity not accepted; no longer reporting it task_id=%d err=%r", task.id, str(e))
                report_activity = False
            except vigil_client.VigilError as e:
                log.warning("activity failed task_id=%d err=%r", task.id, str(e))
    if task.cancelled.is_set():
        # ignore_cancel: the handler saw the cancellation and went on anyway;
        # the server decides whether its completion still counts.
        log.warning(
            "handler saw cancellation and ignored it task_id=%d cause=%r", task.id, f"{type(task.cancel_cause).__name__}: {task.cancel_cause}"
        )
    return {"slept_s": seconds, "instance_id": task.instance_id, "pid": os.getpid()}


def main() -> int:
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    kind = os.environ.get("VIGIL_KIND") or "py-worker"
    try:
        agent = Agent(kind, {TASK_TYPE: py_sleep})
    except (SettingsError, ValueError) as e:
        print(f"{kind}: {e}", file=sys.stderr)
        return 1
    try:
        agent.run_with_signals()
    except vigil_client.VigilError as e:
        log.error("worker stopped: %s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
