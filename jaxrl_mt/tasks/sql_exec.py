"""Running untrusted SQL read-only with a time limit, and comparing results (Spider-style).

:func:`guard` locks a connection: ``PRAGMA query_only=ON`` plus an authorizer that allows only
reading (SELECT, column reads, functions, recursive CTEs) and denies every write, schema change,
ATTACH/DETACH, PRAGMA and transaction (:mod:`jaxrl_mt.tasks.sql_worker`). :func:`run_query` runs
one statement in this process under a deadline (a progress handler aborts it) and caps the rows
fetched; :func:`run_isolated` runs an untrusted one the same way in a worker process that is
killed at the deadline, so that one long step (a huge parse, ``printf('%.*c', 2000000000, 'x')``)
is bounded too. :func:`results_equal` compares two
results as multisets of rows (as lists when ``ordered``), allowing the columns in any order,
with numbers compared by value (``1`` equals ``1.0``; floats to 1e-6 relative).
"""

from __future__ import annotations

import atexit
import dataclasses
import itertools
import math
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
from jaxrl_mt.tasks.sql_worker import MAX_VALUE_BYTES, execute, guard, read_record, write_record

__all__ = ["KILL_GRACE_S", "MAX_VALUE_BYTES", "QueryResult", "guard", "open_readonly", "results_equal", "run_isolated",
           "run_query"]


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


def run_query(conn: sqlite3.Connection, sql: str, *, timeout_s: float = 2.0, max_rows: int = 10_000) -> QueryResult:
    """Runs one SELECT on a guarded connection, in this process, with a deadline (a progress
    handler: it cannot interrupt one long step; for untrusted SQL use :func:`run_isolated`).

    Args:
      conn: a connection passed through :func:`guard`.
      sql: one statement (a trailing ``;`` is fine; several statements are an error).
      timeout_s: wall-clock limit; past it the statement is interrupted.
      max_rows: rows fetched at most (more is an error: no Spider answer is that long).
    """
    return QueryResult(*execute(conn, sql, timeout_s, max_rows))


KILL_GRACE_S = 0.25  # past the limit, a worker that has not answered is killed


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

    def run(self, db: bytes | str, sql: str, timeout_s: float, max_rows: int) -> tuple[str, tuple, str] | None:
        """The worker's answer, or None when it gave none within ``timeout_s + KILL_GRACE_S``."""
        slot, send = self._slot(db)
        blob, path = (db, None) if isinstance(db, bytes) else (None, db)
        deadline = time.monotonic() + timeout_s + KILL_GRACE_S
        write_record(self.proc.stdin.fileno(), (slot, blob if send else None, path if send else None, sql,
                                                float(timeout_s), int(max_rows)))
        out = self.proc.stdout.fileno()
        if not select.select([out], [], [], max(0.0, deadline - time.monotonic()))[0]:
            return None
        return read_record(out)

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


def run_isolated(db: bytes | str | Path, sql: str, *, timeout_s: float = 2.0, max_rows: int = 10_000) -> QueryResult:
    """Runs one untrusted SELECT in a worker process, guarded as :func:`guard` does, under a
    wall-clock limit that holds for any statement, its parsing included: a worker that has not
    answered ``KILL_GRACE_S`` after the limit is killed (the next query gets a fresh one).

    Args:
      db: the database: a serialized in-memory database (``Connection.serialize()``) or the
        path of an SQLite file (opened read-only).
      sql, timeout_s, max_rows: as :func:`run_query`.
    """
    key = db if isinstance(db, bytes) else str(Path(db).resolve())
    with _IDLE_LOCK:
        worker = _IDLE.pop() if _IDLE else None
    for attempt in range(2):
        worker = worker or _Worker()
        try:
            got = worker.run(key, sql, timeout_s, max_rows)
        except (OSError, EOFError):  # the worker died (memory limit, killed): one retry on a fresh one
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
    return (type(v).__name__ if not isinstance(v, (int, float)) else "num", str(v))


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
