"""Running untrusted SQL read-only with a time limit, and comparing results (Spider-style).

:func:`guard` locks a connection: ``PRAGMA query_only=ON`` plus an authorizer that allows only
reading (SELECT, column reads, functions, recursive CTEs) and denies every write, schema change,
ATTACH/DETACH, PRAGMA and transaction (:mod:`jaxrl_mt.tasks.sql_worker`). :func:`run_query` runs
one statement in this process under a deadline (a progress handler aborts it) and caps the rows
fetched; :func:`run_isolated` runs an untrusted one the same way in a worker process that is
killed at the deadline, so that one long step (a huge parse, ``printf('%.*c', 2000000000, 'x')``)
is bounded too, and the worker's reply is read under the same deadline (a reply still arriving
at it is a timeout). A result is capped in rows and in bytes (``MAX_RESULT_BYTES``).
:func:`results_equal` compares two results as multisets of rows (as lists when ``ordered``),
allowing the columns in any order, with numbers compared by value (``1`` equals ``1.0``; floats
to 1e-6 relative), strings and blobs as they are (no text copy of a 9 MB blob).
"""

from __future__ import annotations

import atexit
import dataclasses
import itertools
import marshal
import math
import os
import select
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

from jaxrl_mt.tasks import sql_worker
from jaxrl_mt.tasks.sql_worker import _HEADER, MAX_RESULT_BYTES, MAX_VALUE_BYTES, execute, guard, write_record

__all__ = ["KILL_GRACE_S", "MAX_RESULT_BYTES", "MAX_VALUE_BYTES", "QueryResult", "guard", "open_readonly",
           "read_reply", "results_equal", "run_isolated", "run_query"]


@dataclasses.dataclass(frozen=True)
class QueryResult:
    """Outcome of one query.

    Attributes:
      status: "ok", "error", "refused" (a write / ATTACH / PRAGMA the authorizer denied),
        "timeout".
      rows: the rows (status "ok").
      error: the error message otherwise.
    """

    status: str
    rows: tuple[tuple, ...] = ()
    error: str = ""


def open_readonly(path: str | Path) -> sqlite3.Connection:
    """Opens an SQLite file read-only (``file:...?mode=ro``), guarded.

    Raises:
      FileNotFoundError: no such file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no SQLite database at {path}")
    conn = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True, check_same_thread=False)
    return guard(conn)


def run_query(conn: sqlite3.Connection, sql: str, *, timeout_s: float = 2.0, max_rows: int = 10_000,
              max_bytes: int = MAX_RESULT_BYTES) -> QueryResult:
    """Runs one SELECT on a guarded connection, in this process, with a deadline (a progress
    handler: it cannot interrupt one long step; for untrusted SQL use :func:`run_isolated`).

    Args:
      conn: a connection passed through :func:`guard`.
      sql: one statement (a trailing ``;`` is fine; several statements are an error).
      timeout_s: wall-clock limit; past it the statement is interrupted.
      max_rows: rows fetched at most (more is an error: no Spider answer is that long).
      max_bytes: bytes of the whole result at most (strings and blobs by length; more is an error).
    """
    return QueryResult(*execute(conn, sql, timeout_s, max_rows, max_bytes))


KILL_GRACE_S = 0.25  # past the limit, a worker that has not answered is killed
_REPLY_SLACK = 1 << 20  # a reply's encoding beyond the result's counted bytes


class ReplyTooLarge(Exception):
    """The worker announced a reply larger than the cap allows."""


def read_reply(fd: int, deadline: float, max_bytes: int):
    """One record of :func:`jaxrl_mt.tasks.sql_worker.write_record` from ``fd``, read under
    ``deadline`` (``time.monotonic()``); None when it has not fully arrived by then.

    Raises:
      EOFError: the writer closed the pipe.
      ReplyTooLarge: the record's announced length is over ``max_bytes`` plus a small slack.
    """
    buf, need = bytearray(), _HEADER.size
    while len(buf) < need:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, min(need - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the pipe")
        buf += chunk
        if need == _HEADER.size and len(buf) == need:
            (n,) = _HEADER.unpack(buf)
            if n > max_bytes + _REPLY_SLACK:
                raise ReplyTooLarge(f"the result is over {max_bytes} bytes")
            need += n
    return marshal.loads(bytes(buf[_HEADER.size :]))


class _Worker:
    """One worker process (:mod:`jaxrl_mt.tasks.sql_worker`) and the databases it holds."""

    SLOTS = 64  # databases kept in one worker

    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(Path(sql_worker.__file__))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True,
        )
        self.slots: OrderedDict[bytes | str, int] = OrderedDict()

    def _slot(self, db: bytes | str) -> tuple[int, bool]:
        """(slot of ``db``, whether the worker must be sent it)."""
        if db in self.slots:
            self.slots.move_to_end(db)
            return self.slots[db], False
        slot = len(self.slots) if len(self.slots) < self.SLOTS else self.slots.popitem(last=False)[1]
        self.slots[db] = slot
        return slot, True

    def run(self, db: bytes | str, sql: str, timeout_s: float, max_rows: int,
            max_bytes: int) -> tuple[str, tuple, str] | None:
        """The worker's answer, or None when it has not wholly arrived ``timeout_s + KILL_GRACE_S``
        after the start (ReplyTooLarge, EOFError, OSError: see :func:`read_reply`)."""
        slot, send = self._slot(db)
        blob, path = (db, None) if isinstance(db, bytes) else (None, db)
        deadline = time.monotonic() + timeout_s + KILL_GRACE_S
        write_record(self.proc.stdin.fileno(), (slot, blob if send else None, path if send else None, sql,
                                                float(timeout_s), int(max_rows), int(max_bytes)))
        return read_reply(self.proc.stdout.fileno(), deadline, max_bytes)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            f.close()


_IDLE: list[_Worker] = []
_IDLE_LOCK = threading.Lock()


def _release(worker: _Worker) -> None:
    with _IDLE_LOCK:
        _IDLE.append(worker)


@atexit.register
def _close_workers() -> None:
    with _IDLE_LOCK:
        while _IDLE:
            _IDLE.pop().close()


def run_isolated(db: bytes | str | Path, sql: str, *, timeout_s: float = 2.0, max_rows: int = 10_000,
                 max_bytes: int = MAX_RESULT_BYTES) -> QueryResult:
    """Runs one untrusted SELECT in a worker process, guarded as :func:`guard` does, under a
    wall-clock limit that holds for any statement, its parsing included: a worker that has not
    answered ``KILL_GRACE_S`` after the limit is killed (the next query gets a fresh one); its
    reply is read under the same deadline.

    Args:
      db: the database: a serialized in-memory database (``Connection.serialize()``) or the
        path of an SQLite file (opened read-only).
      sql, timeout_s, max_rows, max_bytes: as :func:`run_query`.
    """
    key = db if isinstance(db, bytes) else str(Path(db).resolve())
    with _IDLE_LOCK:
        worker = _IDLE.pop() if _IDLE else None
    for attempt in range(2):
        worker = worker or _Worker()
        try:
            got = worker.run(key, sql, timeout_s, max_rows, max_bytes)
        except ReplyTooLarge as e:  # the rest of the reply is still in the pipe: not reusable
            worker.close()
            return QueryResult("error", error=str(e))
        except (OSError, EOFError, ValueError):  # the worker died (memory limit, killed; ValueError: a cut
            # reply marshal cannot read): one retry on a fresh one
            worker.close()
            worker = None
            if attempt:
                return QueryResult("error", error="the SQL worker process died")
            continue
        if got is None:
            worker.close()
            return QueryResult("timeout", error=f"no result after {timeout_s:g} s")
        _release(worker)
        return QueryResult(*got)
    raise AssertionError("unreachable")


def _norm(v):
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if v.is_integer() and abs(v) < 2**53:
            return int(v)
        return float(f"{v:.6g}")
    if isinstance(v, bool):
        return int(v)
    return v


def _key(v):
    """A hashable key; numbers of equal value equal (1 and 1.0), strings and blobs as themselves
    (no ``str()`` of a 9 MB blob: it was a 36 MB copy per value)."""
    return ("num", v) if isinstance(v, (int, float)) else (type(v).__name__, v)


def results_equal(ref: Sequence, pred: Sequence, *, ordered: bool) -> bool:
    """Whether ``pred`` has the same rows as ``ref`` (multisets, or lists when ``ordered``).

    The columns may come in any order (Spider's test-suite rule); at most 6 columns are
    permuted, wider results must keep the reference's column order.
    """
    ref = [tuple(_key(_norm(v)) for v in r) for r in ref]
    pred = [tuple(_key(_norm(v)) for v in r) for r in pred]
    if len(ref) != len(pred):
        return False
    if not ref:
        return True
    n = len(ref[0])
    if any(len(r) != n for r in pred):
        return False
    ref_cols = [Counter(r[j] for r in ref) for j in range(n)]
    pred_cols = [Counter(r[j] for r in pred) for j in range(n)]
    target = ref if ordered else Counter(ref)
    for perm in itertools.permutations(range(n)) if n <= 6 else [tuple(range(n))]:
        if any(pred_cols[p] != ref_cols[j] for j, p in enumerate(perm)):
            continue  # some column's values do not match: skip without building rows
        moved = [tuple(r[p] for p in perm) for r in pred]
        if (moved if ordered else Counter(moved)) == target:
            return True
    return False
