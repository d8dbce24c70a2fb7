"""The activity file: evidence of progress for activity-gated leases (DESIGN H3).

A program that works inside a directory (a worktree, a session's workdir)
reports progress by touching ``<workdir>/.vigil/last-activity``, as
``vigil touch-activity`` does from a shell or an editor hook. A heartbeat
loop reads the file's mtime and sends it as ``activity_at`` on v2 lease
heartbeats, and skips a heartbeat when the file has gone stale.

An agent on this package that holds its lease itself reports progress with
``Task.activity()`` instead (a v2 heartbeat with the current time).
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import Optional, Union

ACTIVITY_DIR = ".vigil"
ACTIVITY_FILE = "last-activity"

PathLike = Union[str, "os.PathLike[str]"]


def activity_path(workdir: PathLike) -> str:
    """``<workdir>/.vigil/last-activity``."""
    return os.path.join(os.fspath(workdir), ACTIVITY_DIR, ACTIVITY_FILE)


def touch_activity(workdir: Optional[PathLike] = None, *, create: bool = False) -> Optional[str]:
    """Records progress now, as ``vigil touch-activity`` does: sets the mtime of
    ``<workdir>/.vigil/last-activity`` to the current time, creating the file
    if needed. It makes no server call, so it is cheap enough for a hook run
    after every tool call.

    workdir defaults to ``$VIGIL_WORKDIR`` (set by ``vigil run``), else the
    current directory. A workdir without ``.vigil/`` (no session there) is
    left alone and None is returned, so a hook installed for every project is
    harmless; ``create=True`` makes the directory (mode 0700). Returns the
    file's path when it was touched. workdir itself must be an existing
    directory: FileNotFoundError / NotADirectoryError otherwise."""
    if workdir is None:
        workdir = os.environ.get("VIGIL_WORKDIR") or "."
    wd = os.path.abspath(os.fspath(workdir))
    if not os.path.exists(wd):
        raise FileNotFoundError(f"touch activity: workdir {wd}: no such directory")
    if not os.path.isdir(wd):
        raise NotADirectoryError(f"touch activity: workdir {wd}: not a directory")
    state_dir = os.path.join(wd, ACTIVITY_DIR)
    if not os.path.isdir(state_dir):
        if not create:
            return None
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
    path = os.path.join(state_dir, ACTIVITY_FILE)
    try:
        os.utime(path, None)
    except FileNotFoundError:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.close(fd)
        os.utime(path, None)
    return path


def last_activity(workdir: PathLike) -> Optional[datetime]:
    """The last recorded progress in workdir (the file's mtime, UTC), or None
    when nothing was ever recorded."""
    try:
        st = os.stat(activity_path(workdir))
    except FileNotFoundError:
        return None
    return datetime.fromtimestamp(st.st_mtime, tz=timezone.utc)
