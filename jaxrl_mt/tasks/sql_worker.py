"""Running one untrusted SQL statement read-only: the guard, the executor, and the worker process.

:func:`guard` locks a connection: ``PRAGMA query_only=ON``, an authorizer that allows only
reading (SELECT, column reads, functions, recursive CTEs) and denies every write, schema change,
ATTACH/DETACH, PRAGMA and transaction, and a 10 MB cap on one value. :func:`execute` runs one
statement with a deadline (a progress handler interrupts the virtual machine) and caps the rows
and the bytes of the result (``MAX_RESULT_BYTES``: ``zeroblob(9000000)`` over 30 rows is an
error after 2 rows, not 270 MB sent to the parent).

A progress handler cannot stop what SQLite does inside one step (parsing, one ``printf`` of a
huge width), so untrusted queries run in this module's worker process
(:mod:`jaxrl_mt.tasks.sql_exec` keeps a small pool and kills a worker at the deadline). The
worker is started as a script (``python -I -S sql_worker.py``: the standard library only, and
``sql_schema.py`` beside it) and serves requests on stdin, length-prefixed ``marshal`` records.
"""

from __future__ import annotations

import marshal
import sqlite3
import struct
import sys
import time
from pathlib import Path

try:
    from jaxrl_mt.tasks.sql_schema import split_statements
except ImportError:  # run as the worker script: the sibling file, without the package
    import importlib.util

    _spec = importlib.util.spec_from_file_location("sql_schema", Path(__file__).with_name("sql_schema.py"))
    _schema = sys.modules["sql_schema"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_schema)
    split_statements = _schema.split_statements

__all__ = ["MAX_RESULT_BYTES", "MAX_VALUE_BYTES", "WORKER_MEMORY_BYTES", "execute", "guard", "read_record",
           "write_record"]

_ALLOWED = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    getattr(sqlite3, "SQLITE_RECURSIVE", 33),
}
_DENIED_FUNCTIONS = {"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"}
MAX_VALUE_BYTES = 10_000_000  # no string or blob above 10 MB (zeroblob(1e9) fails at once)
MAX_RESULT_BYTES = 16 << 20  # a whole result (strings and blobs by length, other values 8 bytes)
WORKER_MEMORY_BYTES = 2 << 30  # address-space limit of a worker process
_HEADER = struct.Struct("<I")


def _authorizer(action: int, arg1, arg2, dbname, source) -> int:
    if action in _ALLOWED:
        if action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() in _DENIED_FUNCTIONS:
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


def guard(conn: sqlite3.Connection) -> sqlite3.Connection:
    """Makes ``conn`` read-only for what runs on it next (query_only + the authorizer) and caps
    the size of one value."""
    conn.execute("PRAGMA query_only = ON")
    conn.set_authorizer(_authorizer)
    if hasattr(conn, "setlimit"):  # Python >= 3.11
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    return conn


def _fetch(cur: sqlite3.Cursor, max_rows: int, max_bytes: int) -> tuple[list, str]:
    """Up to ``max_rows + 1`` rows, and "" or why the result is refused (over ``max_bytes``)."""
    rows, size = [], 0
    for row in cur:
        size += sum(len(v) if isinstance(v, (str, bytes)) else 8 for v in row)
        if size > max_bytes:
            return [], f"the result is over {max_bytes} bytes"
        rows.append(row)
        if len(rows) > max_rows:
            break
    return rows, ""


def execute(conn: sqlite3.Connection, sql: str, timeout_s: float, max_rows: int,
            max_bytes: int = MAX_RESULT_BYTES) -> tuple[str, tuple, str]:
    """Runs one statement on a guarded connection: ``(status, rows, error)`` as
    :class:`jaxrl_mt.tasks.sql_exec.QueryResult` has them; a result over ``max_rows`` rows or
    ``max_bytes`` bytes is an error."""
    stmts = split_statements(sql)
    if len(stmts) != 1:
        return "error", (), f"expected one SQL statement, got {len(stmts)}"
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
        rows, too_big = _fetch(cur, max_rows, max_bytes)
        cur.close()
    except sqlite3.DatabaseError as e:
        if timed_out[0]:
            return "timeout", (), f"no result after {timeout_s:g} s"
        msg = str(e)
        return ("refused" if "not authorized" in msg or "readonly" in msg else "error"), (), msg
    except (sqlite3.Warning, ValueError, OverflowError, MemoryError) as e:
        return "error", (), f"{type(e).__name__}: {e}"
    finally:
        conn.set_progress_handler(None, 0)
    if too_big:
        return "error", (), too_big
    if len(rows) > max_rows:
        return "error", (), f"more than {max_rows} rows"
    return "ok", tuple(tuple(r) for r in rows), ""


def write_record(fd: int, obj) -> None:
    """Writes one length-prefixed ``marshal`` record to a file descriptor."""
    import os

    data = marshal.dumps(obj)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def read_record(fd: int):
    """Reads one record written by :func:`write_record` (EOFError at end of stream)."""
    import os

    def read(n: int) -> bytes:
        chunks = []
        while n:
            b = os.read(fd, min(n, 1 << 20))
            if not b:
                raise EOFError("the other side closed the pipe")
            chunks.append(b)
            n -= len(b)
        return b"".join(chunks)

    (n,) = _HEADER.unpack(read(_HEADER.size))
    return marshal.loads(read(n))


def _connect(blob: bytes | None, path: str | None) -> sqlite3.Connection:
    if path is not None:
        from urllib.parse import quote

        conn = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True)
    else:
        conn = sqlite3.connect(":memory:")
        conn.deserialize(blob)
    return guard(conn)


def serve() -> None:
    """The worker loop: ``(slot, blob | None, path | None, sql, timeout_s, max_rows, max_bytes)`` in,
    ``(status, rows, error)`` out; the database of a slot is kept until the slot is reused."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    except (ImportError, ValueError, OSError):
        pass
    conns: dict[int, sqlite3.Connection] = {}
    while True:
        try:
            slot, blob, path, sql, timeout_s, max_rows, max_bytes = read_record(0)
        except EOFError:
            return
        try:
            if blob is not None or path is not None:
                old = conns.pop(slot, None)
                if old is not None:
                    old.close()
                conns[slot] = _connect(blob, path)
            reply = execute(conns[slot], sql, timeout_s, max_rows, max_bytes)
        except Exception as e:  # a database that does not open: the query's error, not the worker's end
            reply = ("error", (), f"{type(e).__name__}: {e}")
        write_record(1, reply)


if __name__ == "__main__":
    sys.exit(serve())
