"""LiC's database task (Spider text-to-SQL): prompt, SQL extraction, execution-based verification.

LiC scores a reply by running its SQL on the Spider database and comparing the result with the
reference query's. The Spider database files are not available here, so by default
:class:`DatabaseTask` measures *test-suite execution accuracy*: the schema is built in SQLite
and filled with K seeded random instances (:mod:`jaxrl_mt.tasks.sql_fuzz`), and a prediction is
correct when its result equals the reference's on every instance (multisets of rows, or lists
when the reference has a top-level ORDER BY; columns in any order). With ``spider_db_dir``
set (a folder of ``<db_id>/<db_id>.sqlite``), the real database is used instead (LiC's metric).

Predicted SQL runs read-only (query_only + an authorizer that denies writes, ATTACH and
PRAGMA; real databases are opened ``mode=ro``) in a worker process killed at its time limit
(:func:`jaxrl_mt.tasks.sql_exec.run_isolated`: the limit holds for parsing and for one long
step too); the reference queries (the data's own) run in this process. Verdict statuses:
``correct``, ``wrong``, ``sql_error``, ``timeout``, ``no_answer`` (and ``reference_error``
when the reference query itself fails everywhere: a data problem, not the model's).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from jaxrl_mt.data.records import ShardedTask
from jaxrl_mt.tasks.base import MAX_REPLY_CHARS, Verdict, lic_extra, oversized
from jaxrl_mt.tasks.fences import backtick_fences, fence_tag
from jaxrl_mt.tasks.sql_exec import (
    QueryResult,
    guard,
    open_readonly,
    results_equal,
    run_isolated,
    run_query,
)
from jaxrl_mt.tasks.sql_fuzz import FuzzConfig, make_instances
from jaxrl_mt.tasks.sql_schema import has_top_level, strip_comments

__all__ = ["DATABASE_SYSTEM_PROMPT", "DatabaseTask", "extract_sql"]

DATABASE_SYSTEM_PROMPT = (
    "You are an assistant that writes SQL for a user. The user is asking a question about an "
    "SQLite database; its schema is given below. Work with the user until the request is clear. "
    "When you give an answer, give exactly one SQL query (SELECT or WITH) that answers the whole "
    "request, in a ```sql code block. If you write several blocks, the last one counts as your answer."
)

_TAG_RE = re.compile(r"[ \t]*([A-Za-z0-9_+.-]*)")  # a fence's tag (fences: jaxrl_mt.tasks.fences, linear)
_SQL_TAGS = {"sql", "sqlite", "sqlite3", "mysql", "postgresql", "postgres", "psql", "tsql", "plsql"}
_PROSE_RE = re.compile(r"\b(select|with)\b[^;`]*?(?=;|`|\n[ \t]*\n|\Z)", re.I | re.S)
_STARTS_QUERY = re.compile(r"\s*\(*\s*(select|with)\b", re.I)


def _is_query(sql: str) -> bool:
    body = strip_comments(sql)
    if not _STARTS_QUERY.match(body):
        return False
    if body.lstrip("( \n\t").lower().startswith("with"):
        return bool(re.search(r"\bas\s*\(", body, re.I)) and bool(re.search(r"\bselect\b", body, re.I))
    return True


def _starts_line(text: str, pos: int) -> bool:
    """``text[:pos].rsplit("\\n", 1)[-1].strip() in ("", "`", ">")``, reading back from ``pos`` only
    over the whitespace (and one "`" or ">") before it."""
    i = pos - 1
    for allowed_mark in (True, False):
        while i >= 0 and text[i] != "\n" and text[i].isspace():
            i -= 1
        if i < 0 or text[i] == "\n":
            return True
        if not (allowed_mark and text[i] in "`>"):
            return False
        i -= 1
    return False


def extract_sql(reply: str) -> str | None:
    """The SQL of ``reply``: the last ```sql block; else the last fenced block holding a
    SELECT/WITH query; else the last SELECT ... FROM / WITH ... AS ( statement in the text
    (upper-case keyword, or at the start of a line or inline code).

    Returns:
      the query text, stripped, trailing ``;`` removed, or None (also for a reply over
      ``MAX_REPLY_CHARS``).
    """
    if not isinstance(reply, str) or len(reply) > MAX_REPLY_CHARS:
        return None
    blocks = [(fence_tag(info, _TAG_RE).lower(), body.strip()) for info, body in backtick_fences(reply)]
    tagged = [b for tag, b in blocks if tag in _SQL_TAGS and strip_comments(b).strip()]
    if tagged:
        return tagged[-1].rstrip().rstrip(";").rstrip()
    plain = [b for _, b in blocks if _is_query(b)]
    if plain:
        return plain[-1].rstrip().rstrip(";").rstrip()
    found = None
    for m in _PROSE_RE.finditer(reply):
        text, kw = m.group(0).strip(), m.group(1)
        line_start = _starts_line(reply, m.start())
        ok = kw.isupper() or line_start or reply[max(0, m.start() - 1) : m.start()] == "`"
        has_from = re.search(r"\bfrom\b", text, re.I) if kw.lower() == "select" else _is_query(text)
        if ok and has_from:
            found = text
    return found.rstrip().rstrip(";").rstrip() if found else None


def _difference(gold: tuple, pred: tuple, ordered: bool) -> str:
    """How a wrong result differs, in a few words."""
    if len(gold) != len(pred):
        return f"{len(pred)} rows, the reference gives {len(gold)}"
    if gold and pred and len(gold[0]) != len(pred[0]):
        return f"{len(pred[0])} columns, the reference gives {len(gold[0])}"
    if ordered and results_equal(gold, pred, ordered=False):
        return f"same {len(gold)} rows in another order (the reference sorts)"
    return f"{len(pred)} rows as the reference, with other values"


@functools.lru_cache(maxsize=1024)
def _reference_results(
    schema_sql: str, ref_sql: str, seed: int, cfg: FuzzConfig, timeout_s: float
) -> tuple[QueryResult, ...]:
    out = []
    for inst in make_instances(schema_sql, [ref_sql], seed=seed, config=cfg):
        conn = guard(inst.connect())
        try:
            out.append(run_query(conn, ref_sql, timeout_s=max(timeout_s, 5.0)))
        finally:
            conn.close()
    return tuple(out)


class DatabaseTask:
    """LiC's database task (see module doc).

    Args:
      spider_db_dir: folder of real Spider databases (``<dir>/<db_id>/<db_id>.sqlite``); when
        set, replies are scored on the real database (LiC's metric) and a missing file is an
        error. None: test-suite accuracy on generated instances.
      n_instances: K, generated databases per test suite.
      seed: seed of the test suites (same seed: same instances, same verdicts).
      timeout_s: time limit of one predicted query on one database.
    """

    name = "database"
    system_prompt = DATABASE_SYSTEM_PROMPT

    def __init__(
        self, spider_db_dir: str | Path | None = None, *, n_instances: int = 8, seed: int = 0, timeout_s: float = 2.0
    ):
        if n_instances < 1:
            raise ValueError(f"n_instances must be >= 1, got {n_instances}")
        self.spider_db_dir = Path(spider_db_dir) if spider_db_dir else None
        self.fuzz = FuzzConfig(n_instances=n_instances)
        self.seed = int(seed)
        self.timeout_s = float(timeout_s)

    def system_prompt_for(self, task: ShardedTask) -> str:
        """The system prompt with this task's database schema (LiC gives the schema up front)."""
        extra = lic_extra(task)
        schema = str(extra.get("schema_sql", "")).strip()
        db = extra.get("db_id", "")
        return (
            f"{self.system_prompt}\n\nDatabase{f' {db}' if db else ''} schema:\n{schema}"
            if schema
            else self.system_prompt
        )

    def extract(self, reply: str, task: ShardedTask) -> str | None:
        """The SQL of ``reply`` (:func:`extract_sql`)."""
        return extract_sql(reply)

    def is_answer_attempt(self, reply: str, task: ShardedTask) -> bool:
        """Whether ``reply`` holds a SELECT/WITH query."""
        sql = extract_sql(reply)
        return sql is not None and _is_query(sql)

    def _fields(self, task: ShardedTask) -> tuple[str, str, str]:
        extra = lic_extra(task)
        ref = extra.get("reference_sql") or task.answer
        schema, db_id = extra.get("schema_sql"), extra.get("db_id", "")
        if not ref or not schema:
            raise ValueError(f"task {task.task_id}: database task needs 'reference_sql' and 'schema_sql' in lic_extra")
        return ref, schema, db_id

    def verify(self, reply: str, task: ShardedTask) -> Verdict:
        """Extracts the SQL of ``reply`` and scores it by execution (see module doc)."""
        too_long = oversized(reply)
        if too_long is not None:
            return too_long
        sql = extract_sql(reply)
        if sql is None:
            return Verdict(0.0, None, "no_answer", "no SQL query in the reply")
        ref, schema, db_id = self._fields(task)
        if self.spider_db_dir is not None:
            return self._verify_real(sql, ref, db_id)
        return self._verify_suite(sql, ref, schema)

    @staticmethod
    def _failed(sql: str, res: QueryResult, where: str) -> Verdict:
        if res.status == "timeout":
            return Verdict(0.0, sql, "timeout", f"{where}: {res.error}")
        what = "refused (the database is read-only)" if res.status == "refused" else "error"
        return Verdict(0.0, sql, "sql_error", f"{where}: {what}: {res.error}")

    def _verify_real(self, sql: str, ref: str, db_id: str) -> Verdict:
        path = self.spider_db_dir / db_id / f"{db_id}.sqlite"
        conn = open_readonly(path)
        try:
            gold = run_query(conn, ref, timeout_s=max(self.timeout_s, 30.0))
            if gold.status != "ok":
                return Verdict(0.0, sql, "reference_error", f"{db_id}: the reference query failed: {gold.error}")
        finally:
            conn.close()
        pred = run_isolated(path, sql, timeout_s=self.timeout_s)
        if pred.status != "ok":
            return self._failed(sql, pred, db_id)
        if results_equal(gold.rows, pred.rows, ordered=has_top_level(ref, "ORDER", "BY")):
            return Verdict(1.0, sql, "correct", f"same result as the reference on {db_id}")
        return Verdict(
            0.0, sql, "wrong", f"{db_id}: {_difference(gold.rows, pred.rows, has_top_level(ref, 'ORDER', 'BY'))}"
        )

    def _run(self, inst, sql: str) -> QueryResult:
        """``sql`` on one generated instance, in a worker (in this process where Python cannot
        serialize databases)."""
        if inst.blob is not None:
            return run_isolated(inst.blob, sql, timeout_s=self.timeout_s)
        conn = guard(inst.connect())
        try:
            return run_query(conn, sql, timeout_s=self.timeout_s)
        finally:
            conn.close()

    def _verify_suite(self, sql: str, ref: str, schema: str) -> Verdict:
        instances = make_instances(schema, [ref], seed=self.seed, config=self.fuzz)
        golds = _reference_results(schema, ref, self.seed, self.fuzz, self.timeout_s)
        ordered, k, used = has_top_level(ref, "ORDER", "BY"), len(instances), 0
        for i, (inst, gold) in enumerate(zip(instances, golds)):
            if gold.status != "ok":
                continue
            used += 1
            pred = self._run(inst, sql)
            where = f"instance {i + 1}/{k}"
            if pred.status != "ok":
                return self._failed(sql, pred, where)
            if not results_equal(gold.rows, pred.rows, ordered=ordered):
                return Verdict(0.0, sql, "wrong", f"{where}: {_difference(gold.rows, pred.rows, ordered)}")
        if used == 0:
            return Verdict(
                0.0, sql, "reference_error", f"the reference query failed on all {k} instances: {golds[0].error}"
            )
        return Verdict(1.0, sql, "correct", f"same result as the reference on {used}/{k} generated databases")
