"""Issue 53, failure 8: an SQL result cannot outlast the limit or fill the parent's memory.

Before: ``SELECT zeroblob(9000000)`` over 30 rows returned ``ok`` under a 2 s limit after 4.4 s
on the probe's host (1.37 s here; the parent read the worker's reply with no deadline), the
parent's peak RSS went from 42 MB to 2.36 GB and ``results_equal`` of that result with itself
took 6.0 s (``str()`` of every 9 MB blob). Real SQLite, real worker processes, real pipes.
"""

from __future__ import annotations

import os
import resource
import sqlite3
import threading
import time
import tracemalloc

import pytest

from jaxrl_mt.tasks.sql_exec import (
    KILL_GRACE_S,
    MAX_RESULT_BYTES,
    read_reply,
    results_equal,
    run_isolated,
    run_query,
)
from jaxrl_mt.tasks.sql_exec import ReplyTooLarge
from jaxrl_mt.tasks.sql_worker import _HEADER, guard, write_record

PROBE = "SELECT zeroblob(9000000) FROM t"


@pytest.fixture(scope="module")
def thirty_rows():
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    conn.execute("CREATE TABLE t(x INTEGER)")
    conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(30)])
    conn.commit()
    return conn


def test_thirty_9mb_blobs_are_refused_within_the_limit_and_the_parent_stays_small(thirty_rows):
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.monotonic()
    r = run_isolated(thirty_rows.serialize(), PROBE, timeout_s=2.0)
    wall = time.monotonic() - t
    assert r.status == "error" and r.error == f"the result is over {MAX_RESULT_BYTES} bytes", r  # before: ok
    assert wall < 2.0 + KILL_GRACE_S
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024 < 100 << 20  # before: +2.3 GB


def test_the_cap_holds_in_process_and_a_small_result_still_passes(thirty_rows):
    local = sqlite3.connect(":memory:")
    local.deserialize(thirty_rows.serialize())
    assert run_query(guard(local), PROBE).status == "error"
    ok = run_isolated(thirty_rows.serialize(), "SELECT zeroblob(1000), x FROM t", timeout_s=2.0)
    assert ok.status == "ok" and len(ok.rows) == 30 and ok.rows[0] == (bytes(1000), 0)
    capped = run_isolated(thirty_rows.serialize(), "SELECT zeroblob(1000) FROM t", max_bytes=10_000)
    assert (capped.status, capped.error) == ("error", "the result is over 10000 bytes")


def test_a_reply_still_arriving_at_the_deadline_is_not_waited_for():
    r, w = os.pipe()
    try:
        os.write(w, _HEADER.pack(1000) + b"x" * 10)  # announced 1,000 bytes, 10 sent, then nothing
        t = time.monotonic()
        assert read_reply(r, time.monotonic() + 0.3, MAX_RESULT_BYTES) is None  # before: read blocked
        assert 0.25 < time.monotonic() - t < 1.0
    finally:
        os.close(r), os.close(w)


def test_a_whole_reply_reads_back_and_an_oversized_one_is_refused_unread():
    r, w = os.pipe()
    try:
        writer = threading.Thread(target=write_record, args=(w, ("ok", ((b"\0" * 200_000, 1),), "")))
        writer.start()  # more than a pipe buffer: read in pieces
        assert read_reply(r, time.monotonic() + 5, MAX_RESULT_BYTES) == ("ok", ((b"\0" * 200_000, 1),), "")
        writer.join()
        os.write(w, _HEADER.pack(1 << 30))
        with pytest.raises(ReplyTooLarge):
            read_reply(r, time.monotonic() + 5, MAX_RESULT_BYTES)
    finally:
        os.close(r), os.close(w)


def test_results_equal_compares_blobs_without_a_text_copy():
    rows = [(bytes([i]) * 9_000_000, i) for i in range(3)]
    tracemalloc.start()
    try:
        t = time.thread_time()
        same = results_equal(rows, list(reversed(rows)), ordered=False)
        cpu = time.thread_time() - t
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert same and cpu < 0.5 and peak < 1 << 20  # before: str() of each blob, ~36 MB each
    assert not results_equal(rows, [(rb"\9" * 9_000_000, 0), *rows[1:]], ordered=False)
    assert not results_equal([(b"1",)], [("1",)], ordered=False)  # a blob is not its text
    assert results_equal([(1, "a")], [("a", 1.0)], ordered=True)  # numbers by value, columns in any order


def test_the_database_task_refuses_the_probe_within_its_limit():
    """Through ``DatabaseTask.verify`` (8 fuzzed instances of the first LiC record, 2 s each)."""
    from jaxrl_mt.data.loaders import load_source
    from jaxrl_mt.tasks import get_task

    task, checker = load_source("lic:@:database")[0], get_task("database")
    sql = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 30) SELECT zeroblob(9000000) FROM c"
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.monotonic()
    v = checker.verify(f"```sql\n{sql}\n```", task)
    assert v.status == "sql_error" and f"over {MAX_RESULT_BYTES} bytes" in v.reason, v
    assert time.monotonic() - t < checker.timeout_s
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024 < 100 << 20
