"""vigil_client: vigil's Python client and agent runtime, standard library only.

The same runtime as the Go SDK (package vigilclient), with the same
semantics, settings and defaults::

    from vigil_client import Agent

    def resize(task):
        for step in range(10):
            if not task.sleep(1):          # False once the lease is lost
                raise task.cancel_cause
            task.activity()                # optional: a v2 heartbeat "progress now"
        return {"ok": True}

    Agent("resizer", {"resize": resize}).run_with_signals()

See Agent (the runtime), Client (one typed method per API call), the errors
(VigilError, LeaseLostError, NotFoundError, BadRequestError, …) and
settings_from_env (``VIGIL_<KIND>_{LIVENESS,HEARTBEAT,POLL}_INTERVAL``).
Python 3.9 or newer.
"""

from ._version import __version__
from .activity import activity_path, last_activity, touch_activity
from .agent import ABANDON_WAIT, DRAIN_GRACE_DEFAULT, Agent, Handler, Task
from .client import HTTP_TIMEOUT_DEFAULT, INSTANCE_TOKEN_HEADER, Client, Instance, Lease, Registration
from .errors import (
    BadRequestError,
    DrainingError,
    FencedError,
    LeaseLostError,
    NotFoundError,
    OutcomeConflictError,
    UnreachableError,
    VigilError,
)
from .settings import (
    HEARTBEAT_INTERVAL_DEFAULT,
    LIVENESS_INTERVAL_DEFAULT,
    POLL_INTERVAL_DEFAULT,
    URL_DEFAULT,
    EnvError,
    Settings,
    SettingsError,
    connection_from_env,
    env_prefix,
    parse_interval,
    settings_from_env,
)

__all__ = [
    "__version__",
    "ABANDON_WAIT",
    "DRAIN_GRACE_DEFAULT",
    "HEARTBEAT_INTERVAL_DEFAULT",
    "HTTP_TIMEOUT_DEFAULT",
    "INSTANCE_TOKEN_HEADER",
    "LIVENESS_INTERVAL_DEFAULT",
    "POLL_INTERVAL_DEFAULT",
    "URL_DEFAULT",
    "Agent",
    "BadRequestError",
    "Client",
    "DrainingError",
    "EnvError",
    "FencedError",
    "Handler",
    "Instance",
    "Lease",
    "LeaseLostError",
    "NotFoundError",
    "OutcomeConflictError",
    "Registration",
    "Settings",
    "SettingsError",
    "Task",
    "UnreachableError",
    "VigilError",
    "activity_path",
    "connection_from_env",
    "env_prefix",
    "last_activity",
    "parse_interval",
    "settings_from_env",
    "touch_activity",
]
