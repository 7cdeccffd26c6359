"""One live writer per workdir: a trainer or an evaluation holds ``<workdir>/.lock`` while it runs.

The lock is an exclusive ``flock`` on ``.lock`` (the kernel drops it when its process dies, even by
``kill -9``), and the file names the holder: ``{"pid", "host", "what", "since"}``. A second process
asking for a held workdir is refused with one line naming the holder's pid (:class:`WorkdirBusy`,
an ``OSError``: the entry points print it and exit 2). A lock file left by a dead process (its
``flock`` gone with it) is taken over with one log line naming that pid. Within one process the lock
is re-entrant (a resumed ``Trainer`` in a notebook or a test is the same writer); it is released by
``release``, by leaving its ``with`` block, when the holder object is collected, or at exit.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["LOCK_FILE", "WorkdirBusy", "WorkdirLock", "hold_workdir"]

LOCK_FILE = ".lock"
_HELD: dict[str, list[Any]] = {}  # lock path -> [fd, count] of this process


class WorkdirBusy(OSError):
    """The workdir is held by another live process (the message names its pid)."""


def _holder(fd: int) -> dict[str, Any]:
    """The holder record in the lock file ({} when empty or unreadable)."""
    try:
        raw = os.pread(fd, 4096, 0)
        rec = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


class WorkdirLock:
    """A held workdir lock (see the module docstring); ``release`` is idempotent."""

    def __init__(self, path: str):
        self.path = path
        self._held = True

    def release(self) -> None:
        """Drops this hold; the last hold of the process empties the file and unlocks it."""
        if not self._held:
            return
        self._held = False
        entry = _HELD.get(self.path)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _HELD[self.path]
        try:
            os.ftruncate(entry[0], 0)
            fcntl.flock(entry[0], fcntl.LOCK_UN)
        finally:
            os.close(entry[0])

    def __enter__(self) -> "WorkdirLock":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except (OSError, TypeError, AttributeError):  # at interpreter exit the kernel releases it anyway
            pass


class _NoLock(WorkdirLock):
    """What a process other than 0 holds: nothing."""

    def __init__(self) -> None:
        super().__init__("")
        self._held = False


def hold_workdir(workdir: str | os.PathLike, *, what: str, log: Callable[[str], None] = print,
                 enabled: bool = True) -> WorkdirLock:
    """Takes the lock of ``workdir`` (created if missing) for this process.

    Args:
      workdir: the run's folder.
      what: the holder's kind, recorded in the file and named in a refusal (``trainer``, ``evaluation``).
      log: where the take-over of a stale lock is reported (one line).
      enabled: False on the processes of a multi-process run other than 0 (only process 0 writes).

    Raises:
      WorkdirBusy: another live process holds it: ``workdir W is in use by pid P (...)``.
      OSError: the folder or its lock file cannot be created.
    """
    if not enabled:
        return _NoLock()
    wd = Path(workdir)
    wd.mkdir(parents=True, exist_ok=True)
    path = os.path.realpath(wd / LOCK_FILE)
    if path in _HELD:
        _HELD[path][1] += 1
        return WorkdirLock(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        rec = _holder(fd)
        os.close(fd)
        pid = rec.get("pid", "unknown")
        raise WorkdirBusy(f"workdir {wd} is in use by pid {pid} ({rec.get('what', 'a run')} on "
                          f"{rec.get('host', 'this host')} since {rec.get('since', '?')}; lock {path}): wait for "
                          "it to finish or stop it") from None
    except BaseException:
        os.close(fd)
        raise
    old = _holder(fd)
    if old.get("pid") not in (None, os.getpid()):
        state = "still running (it let go of its lock)" if _alive(old["pid"]) else "no longer running"
        log(f"workdir {wd}: took over the stale lock of pid {old['pid']} ({old.get('what', 'a run')}, "
            f"{state})")
    rec = {"pid": os.getpid(), "host": socket.gethostname(), "what": what,
           "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(rec) + "\n").encode(), 0)
    _HELD[path] = [fd, 1]
    return WorkdirLock(path)
