"""Seeded random database instances for test-suite execution accuracy (Spider rows are not here).

A *test suite* is K small random databases of one schema. Each instance respects the column
types, primary keys, unique constraints and foreign keys (a foreign key takes its values from
the parent's rows), and the literal values of the queries it is built for are put into the
rows of the columns they are compared with (``country_code = 'USA'`` gives some ``'USA'``
rows, ``killed > 10`` gives values on both sides of 10, ``state LIKE '%North%'`` gives strings
containing ``North``), so that filters select something. Columns joined in the query
(``T1.a = T2.b``) share values even without a declared foreign key. Table sizes vary across
instances (3-6, 6-12, 10-20, 15-30 rows by default), and so do value domains (narrow: many
duplicates for GROUP BY; wide: few ties for ORDER BY; columns the query sorts on are always
wide, so that ``ORDER BY x LIMIT 1`` rarely depends on how ties are broken).

Everything is a function of (schema, literals, seed): instances are cached and two runs with
the same seed give byte-identical databases (``random.Random`` with string seeds; no set
iteration).
"""

from __future__ import annotations

import dataclasses
import functools
import random
import sqlite3
from collections.abc import Sequence

from jaxrl_mt.tasks.sql_schema import (
    Literal,
    Table,
    parse_schema,
    quote_ident,
    sql_literals,
    sqlite_ddl,
    tokenize,
)

__all__ = ["FuzzConfig", "Instance", "column_pairs", "make_instances", "order_columns", "schema_names"]


@dataclasses.dataclass(frozen=True)
class FuzzConfig:
    """How the instances of a test suite are drawn.

    Attributes:
      n_instances: K, databases per suite.
      sizes: (min, max) rows per table, cycled over the instances.
      p_literal: probability that a value of a column compared with a literal is taken from
        the values derived from that literal.
    """

    n_instances: int = 8
    sizes: tuple[tuple[int, int], ...] = ((3, 6), (6, 12), (10, 20), (15, 30))
    p_literal: float = 0.4


@dataclasses.dataclass(frozen=True)
class Instance:
    """One generated database: its DDL, rows per table, and a serialized copy."""

    ddl: str
    rows: tuple[tuple[str, tuple[tuple, ...]], ...]
    blob: bytes | None

    def connect(self) -> sqlite3.Connection:
        """A fresh in-memory connection holding this instance (the caller closes it)."""
        conn = sqlite3.connect(":memory:", check_same_thread=False)
        if self.blob is not None:
            conn.deserialize(self.blob)
        else:  # Python < 3.11: no deserialize
            _fill(conn, self.ddl, self.rows)
        return conn


def _fill(conn: sqlite3.Connection, ddl: str, rows) -> None:
    conn.executescript(ddl)
    for name, rs in rows:
        if rs:
            marks = ", ".join("?" * len(rs[0]))
            conn.executemany(f"INSERT INTO {quote_ident(name)} VALUES ({marks})", rs)
    conn.commit()


def schema_names(tables: Sequence[Table]) -> set[str]:
    """Lower-case table and column names (what a double-quoted token may name)."""
    return {t.name.lower() for t in tables} | {c.name.lower() for t in tables for c in t.columns}


def column_pairs(sql: str, names: set[str]) -> list[tuple[str, str]]:
    """Column pairs compared with ``=`` in ``sql`` (join conditions), lower-case names."""
    toks = tokenize(sql)
    out = []
    for i, t in enumerate(toks):
        if t.text not in ("=", "==") or i < 1 or i + 1 >= len(toks):
            continue
        k = i + 1
        while k + 2 < len(toks) and toks[k + 1].text == ".":
            k += 2
        a, b = toks[i - 1].text.strip('"`[]').lower(), toks[k].text.strip('"`[]').lower()
        if toks[i - 1].kind in ("word", "qid") and toks[k].kind in ("word", "qid") and a in names and b in names:
            out.append((a, b))
    return out


def order_columns(sql: str, names: set[str]) -> list[str]:
    """Columns named in the ORDER BY clauses of ``sql`` (lower-case); they get wide domains."""
    toks, out, on = tokenize(sql), [], False
    for i, t in enumerate(toks):
        if t.upper == "BY" and i and toks[i - 1].upper == "ORDER":
            on = True
        elif t.upper in ("LIMIT", "UNION", "EXCEPT", "INTERSECT", "OFFSET") or t.text == ")" and on:
            on = False
        elif on and t.kind in ("word", "qid") and t.text.strip('"`[]').lower() in names:
            out.append(t.text.strip('"`[]').lower())
    return out


def _kind(type_text: str) -> str:
    t = type_text.lower()
    if "bool" in t:
        return "bool"
    if "date" in t or "time" in t:
        return "date"
    if "int" in t:
        return "int"
    if any(x in t for x in ("real", "floa", "doub", "dec", "num")):
        return "real"
    return "text"


def _fill_like(pattern: str, rng: random.Random) -> str:
    out = []
    for ch in pattern:
        out.append(rng.choice(["", "x", "Ab ", " Cd"]) if ch == "%" else ("q" if ch == "_" else ch))
    return "".join(out)


class _Columns:
    """Per-instance value domains of the columns of one schema."""

    def __init__(
        self, literals: Sequence[Literal], rng: random.Random, cfg: FuzzConfig, order_cols: frozenset = frozenset()
    ):
        self.rng, self.cfg, self.order_cols = rng, cfg, order_cols
        self.by_col: dict[str, list[Literal]] = {}
        for lit in literals:
            self.by_col.setdefault(lit.column or "", []).append(lit)
        self.domains: dict[tuple, object] = {}  # per-instance caches: literal candidates, domains

    def _candidates(self, col: str, kind: str) -> list:
        key = ("lit", col, kind)
        if key in self.domains:
            return self.domains[key]
        out = []
        for lit in self.by_col.get(col, []) + (self.by_col.get("", []) if kind == "text" else []):
            v = lit.value
            if lit.op == "LIKE" and isinstance(v, str):
                out += [_fill_like(v, self.rng) for _ in range(2)]
            elif isinstance(v, (int, float)) and lit.op in ("<", ">", "<=", ">=", "BETWEEN"):
                out += [v - 1, v, v + 1]
            else:
                out.append(v)
        if kind == "text":
            out = [str(v) for v in out]
        self.domains[key] = out
        return out

    def _draw(self, kind: str, lo: int, hi: int):
        rng = self.rng
        if kind == "int":
            return rng.randint(lo, hi)
        if kind == "real":
            return round(rng.uniform(lo, hi), 2)
        return f"{rng.randint(1950, 2020)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"

    def _domain(self, table: str, col: str, kind: str):
        """(pool or None, lo, hi): a small pool of values (narrow), or a range to draw from (wide)."""
        key = (table, col)
        if key in self.domains:
            return self.domains[key]
        rng, nums = self.rng, [lit.value for lit in self.by_col.get(col, []) if isinstance(lit.value, (int, float))]
        narrow = rng.random() < 0.35 and col not in self.order_cols  # sort keys: few ties
        c = nums[0] if nums else rng.choice([10, 50, 500])
        lo, hi = (int(c - max(5, abs(c))) if nums else 0), int(c + max(5, abs(c)))
        if kind == "bool":
            dom = (["T", "F"], lo, hi)
        elif kind == "text":
            stem = "".join(ch for ch in col.title() if ch.isalnum())[:10] or "v"
            size = rng.randint(2, 6) if col not in self.order_cols else 60
            dom = ([f"{stem}{k}" for k in rng.sample(range(100), size)], lo, hi)
        else:
            dom = ([self._draw(kind, lo, hi) for _ in range(rng.randint(2, 4))] if narrow else None, lo, hi)
        self.domains[key] = dom
        return dom

    def value(self, table: str, col: str, kind: str, shared: list | None = None):
        """A value for a non-key column: from its literals, a joined column's values, or its domain."""
        rng = self.rng
        cands = self._candidates(col, kind)
        if cands and rng.random() < self.cfg.p_literal:
            return rng.choice(cands)
        if shared and rng.random() < 0.7:
            return rng.choice(shared)
        pool, lo, hi = self._domain(table, col, kind)
        return rng.choice(pool) if pool else self._draw(kind, lo, hi)

    def unique_value(self, col: str, kind: str, used: set, n: int):
        """A value not in ``used`` (a key column)."""
        rng = self.rng
        cands = [v for v in self._candidates(col, kind) if v not in used]
        if cands and rng.random() < self.cfg.p_literal:
            return rng.choice(cands)
        for _ in range(50):
            if kind in ("int", "real"):
                v = rng.randint(1, 3 * n + 10)
            elif kind == "date":
                v = f"{rng.randint(1950, 2020)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
            else:
                v = f"{''.join(ch for ch in col.title() if ch.isalnum())[:6] or 'k'}{rng.randint(0, 9 * n + 50)}"
            if v not in used:
                return v
        return None


def _order(tables: Sequence[Table]) -> list[Table]:
    """Parents before children (foreign keys); cycles keep the schema order."""
    done, out, pending = set(), [], list(tables)
    while pending:
        ready = [
            t for t in pending if all(fk[1].lower() in done or fk[1].lower() == t.name.lower() for fk in t.foreign_keys)
        ]
        t = ready[0] if ready else pending[0]
        pending.remove(t)
        done.add(t.name.lower())
        out.append(t)
    return out


def _table_rows(t: Table, n: int, cols: _Columns, made: dict, pairs: dict) -> list[tuple]:
    """``n`` rows (fewer when keys run out) for table ``t``; ``made``: values of generated columns."""
    names = [c.name.lower() for c in t.columns]
    kinds = [_kind(c.type) for c in t.columns]
    parent = {}
    for src, ref, dst in t.foreign_keys:
        for k, s in enumerate(src):
            rcol = (dst[k] if k < len(dst) else s).lower()
            parent[s.lower()] = made.get((ref.lower(), rcol), [])
    keys = [tuple(x.lower() for x in t.primary_key)] + [tuple(x.lower() for x in u) for u in t.uniques]
    keys = [k for k in dict.fromkeys(keys) if k]
    single = {k[0] for k in keys if len(k) == 1}
    used = {k: set() for k in keys}
    shared = {
        c: [
            v
            for other in pairs.get(c, [])
            for (tb, cc), vs in made.items()
            if cc == other and tb != t.name.lower()
            for v in vs
        ]
        for c in names
    }
    rows, tname, rng = [], t.name.lower(), cols.rng
    seen = {c: set() for c in single}  # values taken by single-column keys
    for _ in range(n):
        for _attempt in range(10):
            row = []
            for c, kind in zip(names, kinds):
                if c in parent and c in single:
                    pool = [v for v in parent[c] if v not in seen[c]]
                    row.append(rng.choice(pool) if pool else None)
                elif c in parent:
                    row.append(rng.choice(parent[c]) if parent[c] else None)
                elif c in single:
                    row.append(cols.unique_value(c, kind, seen[c], n))
                else:
                    row.append(cols.value(tname, c, kind, shared[c]))
            vals = dict(zip(names, row))
            kv = [(k, tuple(vals[c] for c in k)) for k in keys]
            if all(v not in used[k] and None not in v for k, v in kv):
                break
        else:
            continue
        for k, v in kv:
            used[k].add(v)
        for c in single:
            seen[c].add(vals[c])
        rows.append(tuple(row))
    return rows


def _instance(
    tables: tuple[Table, ...],
    literals: tuple[Literal, ...],
    pairs: dict,
    order_cols: frozenset,
    seed: int,
    i: int,
    cfg: FuzzConfig,
) -> Instance:
    rng = random.Random(f"jaxrl_mt.sql_fuzz:{seed}:{i}")
    cols = _Columns(literals, rng, cfg, order_cols)
    lo, hi = cfg.sizes[i % len(cfg.sizes)]
    made: dict[tuple[str, str], list] = {}
    out = {}
    for t in _order(tables):
        rows = _table_rows(t, rng.randint(lo, hi), cols, made, pairs)
        for k, c in enumerate(t.columns):
            made[(t.name.lower(), c.name.lower())] = [r[k] for r in rows if r[k] is not None]
        out[t.name] = tuple(rows)
    ddl = sqlite_ddl(tables)
    rows = tuple((t.name, out[t.name]) for t in tables)
    conn = sqlite3.connect(":memory:")
    try:
        _fill(conn, ddl, rows)
        blob = conn.serialize() if hasattr(conn, "serialize") else None
    finally:
        conn.close()
    return Instance(ddl, rows, blob)


@functools.lru_cache(maxsize=512)
def _suite(schema_sql: str, sqls: tuple[str, ...], seed: int, cfg: FuzzConfig) -> tuple[Instance, ...]:
    tables = parse_schema(schema_sql)
    names = schema_names(tables)
    lits = {(repr(lit.value), lit.op, lit.column or ""): lit for s in sqls for lit in sql_literals(s, names)}
    literals = tuple(lits[k] for k in sorted(lits))
    pairs: dict[str, list[str]] = {}
    for s in sqls:
        for a, b in column_pairs(s, names):
            pairs.setdefault(a, []).append(b)
            pairs.setdefault(b, []).append(a)
    order_cols = frozenset(c for s in sqls for c in order_columns(s, names))
    return tuple(_instance(tables, literals, pairs, order_cols, seed, i, cfg) for i in range(cfg.n_instances))


def make_instances(
    schema_sql: str, sqls: Sequence[str], *, seed: int = 0, config: FuzzConfig = FuzzConfig()
) -> tuple[Instance, ...]:
    """The test suite of ``schema_sql`` for the queries ``sqls`` (their literals are seeded).

    Cached per (schema, queries, seed, config): the instances of one database and seed are
    built once.

    Raises:
      SchemaError: ``schema_sql`` cannot be read.
    """
    return _suite(schema_sql, tuple(sqls), int(seed), config)
