"""Running untrusted SQL read-only with a time limit, and comparing results (Spider-style).

:func:`guard` locks a connection: ``PRAGMA query_only=ON`` plus an authorizer that allows only
reading (SELECT, column reads, functions, recursive CTEs) and denies every write, schema change,
ATTACH/DETACH, PRAGMA and transaction. :func:`run_query` runs one statement under a deadline
(a progress handler aborts it) and caps the rows fetched. :func:`results_equal` compares two
results as multisets of rows (as lists when ``ordered``), allowing the columns in any order,
with numbers compared by value (``1`` equals ``1.0``; floats to 1e-6 relative).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import sqlite3
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

from jaxrl_mt.tasks.sql_schema import split_statements

__all__ = ["QueryResult", "guard", "open_readonly", "results_equal", "run_query"]

_ALLOWED = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    getattr(sqlite3, "SQLITE_RECURSIVE", 33),
}
_DENIED_FUNCTIONS = {"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"}


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


def _authorizer(action: int, arg1, arg2, dbname, source) -> int:
    if action in _ALLOWED:
        if action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() in _DENIED_FUNCTIONS:
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


MAX_VALUE_BYTES = 10_000_000  # no string or blob above 10 MB (zeroblob(1e9) fails at once)


def guard(conn: sqlite3.Connection) -> sqlite3.Connection:
    """Makes ``conn`` read-only for what runs on it next (query_only + the authorizer) and caps
    the size of one value."""
    conn.execute("PRAGMA query_only = ON")
    conn.set_authorizer(_authorizer)
    if hasattr(conn, "setlimit"):  # Python >= 3.11
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    return conn


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
    """Runs one SELECT on a guarded connection with a deadline.

    Args:
      conn: a connection passed through :func:`guard`.
      sql: one statement (a trailing ``;`` is fine; several statements are an error).
      timeout_s: wall-clock limit; past it the statement is interrupted.
      max_rows: rows fetched at most (more is an error: no Spider answer is that long).
    """
    stmts = split_statements(sql)
    if len(stmts) != 1:
        return QueryResult("error", error=f"expected one SQL statement, got {len(stmts)}")
    deadline = time.monotonic() + timeout_s
    timed_out = [False]

    def tick() -> int:
        if time.monotonic() > deadline:
            timed_out[0] = True
            return 1
        return 0

    conn.set_progress_handler(tick, 1000)
    try:
        cur = conn.execute(stmts[0])
        rows = cur.fetchmany(max_rows + 1)
        cur.close()
    except sqlite3.DatabaseError as e:
        if timed_out[0]:
            return QueryResult("timeout", error=f"no result after {timeout_s:g} s")
        msg = str(e)
        return QueryResult("refused" if "not authorized" in msg or "readonly" in msg else "error", error=msg)
    except (sqlite3.Warning, ValueError, OverflowError, MemoryError) as e:
        return QueryResult("error", error=f"{type(e).__name__}: {e}")
    finally:
        conn.set_progress_handler(None, 0)
    if len(rows) > max_rows:
        return QueryResult("error", error=f"more than {max_rows} rows")
    return QueryResult("ok", tuple(tuple(r) for r in rows))


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
