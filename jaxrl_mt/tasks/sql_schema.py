"""SQL text helpers for the database task: a tokenizer, a CREATE TABLE parser, SQLite DDL, literals.

Spider's ``schema_sql`` is MySQL-flavoured text that SQLite mostly accepts, but not all of it:
reserved ``sqlite_*`` tables, several column-level ``PRIMARY KEY`` s next to a table-level one,
column names such as ``18_49_Rating_Share`` or ``Official_ratings_(millions)``. The parser reads
it into :class:`Table` records, and :func:`sqlite_ddl` writes them back as SQLite DDL with every
identifier quoted and one (possibly composite) primary key per table.

:func:`sql_literals` finds the literal values of a query (``'USA'``, ``"Asia"``, ``10``) and the
column each one is compared with, so the instance generator can put them into the rows.
"""

from __future__ import annotations

import dataclasses
import itertools
import re

__all__ = [
    "Column",
    "Literal",
    "SchemaError",
    "Table",
    "Token",
    "has_top_level",
    "parse_schema",
    "quote_ident",
    "split_statements",
    "sql_literals",
    "sqlite_ddl",
    "strip_comments",
    "tokenize",
]

_TOKEN_RE = re.compile(
    r"""(?P<ws>\s+)
      | (?P<comment>--[^\n]*|/\*.*?(?:\*/|$))
      | (?P<str>'(?:[^']|'')*'?)
      | (?P<qid>"(?:[^"]|"")*"?|`[^`]*`?|\[[^\]]*\]?)
      | (?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![A-Za-z_0-9.]))
      | (?P<word>[A-Za-z_0-9$]+)
      | (?P<op><=|>=|!=|<>|==|\|\||[^\sA-Za-z_0-9])""",
    re.X | re.S,
)


@dataclasses.dataclass(frozen=True)
class Token:
    """One SQL token: ``kind`` in ws, comment, str, qid, num, word, op; ``start`` offset."""

    kind: str
    text: str
    start: int

    @property
    def upper(self) -> str:
        """The text in upper case (keyword comparisons)."""
        return self.text.upper()

    @property
    def value(self) -> str:
        """The text of a string or quoted identifier without its quotes."""
        t = self.text
        if self.kind == "str":
            return t[1:-1].replace("''", "'") if len(t) > 1 and t.endswith("'") else t[1:]
        if self.kind == "qid":
            return t[1:-1].replace('""', '"') if len(t) > 1 else t
        return t


def tokenize(sql: str, *, keep_space: bool = False) -> list[Token]:
    """Tokens of ``sql`` (whitespace and comments dropped unless ``keep_space``)."""
    out = []
    for m in _TOKEN_RE.finditer(sql):
        tok = Token(m.lastgroup or "op", m.group(), m.start())
        if keep_space or tok.kind not in ("ws", "comment"):
            out.append(tok)
    return out


def strip_comments(sql: str) -> str:
    """``sql`` without ``--`` and ``/* */`` comments."""
    return "".join(t.text for t in tokenize(sql, keep_space=True) if t.kind != "comment")


def split_statements(sql: str) -> list[str]:
    """The non-empty statements of ``sql`` split at ``;`` outside strings and comments."""
    parts, cur = [], []
    for t in tokenize(sql, keep_space=True):
        if t.kind == "op" and t.text == ";":
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(t.text)
    parts.append("".join(cur))
    return [p.strip() for p in parts if strip_comments(p).strip()]


def has_top_level(sql: str, *words: str) -> bool:
    """Whether the keyword sequence ``words`` (e.g. ``"ORDER", "BY"``) occurs outside parentheses."""
    toks, depth, n = tokenize(sql), 0, len(words)
    for i, t in enumerate(toks):
        if t.text == "(":
            depth += 1
        elif t.text == ")":
            depth -= 1
        elif depth == 0 and [x.upper for x in toks[i : i + n]] == list(words):
            return True
    return False


# --------------------------------------------------------------------------- schema


class SchemaError(ValueError):
    """``schema_sql`` that cannot be read (names the statement)."""


@dataclasses.dataclass(frozen=True)
class Column:
    name: str
    type: str  # declared type text, e.g. "char(3)", "" when none
    notnull: bool = False
    default: str | None = None  # default clause text


@dataclasses.dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...] = ()
    uniques: tuple[tuple[str, ...], ...] = ()
    foreign_keys: tuple[tuple[tuple[str, ...], str, tuple[str, ...]], ...] = ()  # (cols, ref table, ref cols)

    def column(self, name: str) -> Column | None:
        """The column called ``name`` (case-insensitive), or None."""
        low = name.lower()
        return next((c for c in self.columns if c.name.lower() == low), None)


_COL_STOP = {
    "NOT",
    "NULL",
    "DEFAULT",
    "PRIMARY",
    "UNIQUE",
    "REFERENCES",
    "CHECK",
    "COLLATE",
    "CONSTRAINT",
    "AUTOINCREMENT",
    "AUTO_INCREMENT",
    "GENERATED",
    "ON",
    "KEY",
}
_NAME_RE = re.compile(r'\s*("(?:[^"]|"")+"|`[^`]+`|\[[^\]]+\]|\S+)\s*(.*)', re.S)


def _unquote(name: str) -> str:
    name = name.strip()
    if len(name) > 1 and (name[0], name[-1]) in (('"', '"'), ("`", "`"), ("[", "]")):
        return name[1:-1].replace('""', '"')
    return name


def _split_items(body: list[Token], text: str) -> list[str]:
    """Top-level comma-separated items of a CREATE TABLE body, as text."""
    items, depth, start = [], 0, body[0].start if body else 0
    for t in body:
        if t.text == "(":
            depth += 1
        elif t.text == ")":
            depth -= 1
        elif t.text == "," and depth == 0:
            items.append(text[start : t.start])
            start = t.start + 1
    if body:
        last = body[-1]
        items.append(text[start : last.start + len(last.text)])
    return [i.strip() for i in items if i.strip()]


def _paren_names(toks: list[Token], i: int) -> tuple[tuple[str, ...], int]:
    """Names in the parenthesised list starting at ``toks[i] == "("``; returns (names, next index)."""
    names, i = [], i + 1
    while i < len(toks) and toks[i].text != ")":
        if toks[i].text != ",":
            names.append(_unquote(toks[i].text))
        i += 1
    return tuple(names), i + 1


def _column(item: str) -> tuple[Column, bool, tuple | None]:
    """(column, is a column-level primary key, column-level reference or None)."""
    m = _NAME_RE.match(item)
    name, rest = _unquote(m.group(1)), m.group(2)
    toks = tokenize(rest)
    k = next((i for i, t in enumerate(toks) if t.upper in _COL_STOP), len(toks))
    type_text = rest[: toks[k].start].strip() if k < len(toks) else rest.strip()
    words = [t.upper for t in toks]
    default = None
    if "DEFAULT" in words:
        j = words.index("DEFAULT") + 1
        default = toks[j].text if j < len(toks) else None
        if default == "-" and j + 1 < len(toks):
            default += toks[j + 1].text
    ref = None
    if "REFERENCES" in words:
        j = words.index("REFERENCES") + 1
        cols, _ = _paren_names(toks, j + 1) if j + 1 < len(toks) and toks[j + 1].text == "(" else ((), 0)
        ref = ((name,), _unquote(toks[j].text), cols)
    pk = ("PRIMARY", "KEY") in itertools.pairwise(words)
    notnull = ("NOT", "NULL") in itertools.pairwise(words)
    return Column(name, type_text, notnull, default), pk, ref


def _table(stmt: str) -> Table | None:
    toks = tokenize(stmt)
    words = [t.upper for t in toks]
    if words[:2] != ["CREATE", "TABLE"]:
        return None
    i = 2 + (3 if words[2:5] == ["IF", "NOT", "EXISTS"] else 0)
    name = _unquote(toks[i].text)
    if i + 1 >= len(toks) or toks[i + 1].text != "(" or toks[-1].text != ")":
        raise SchemaError(f"CREATE TABLE {name}: expected '(' column definitions ')'")
    cols, col_pk, pk, uniques, fks = [], [], (), [], []
    for item in _split_items(toks[i + 2 : -1], stmt):
        it = tokenize(item)
        head = [t.upper for t in it[:2]]
        if head[0] == "CONSTRAINT":
            it, head = it[2:], [t.upper for t in it[2:4]]
        if head == ["PRIMARY", "KEY"]:
            pk = _paren_names(it, 2)[0]
        elif head[0] == "UNIQUE":
            uniques.append(_paren_names(it, 1)[0])
        elif head == ["FOREIGN", "KEY"]:
            src, j = _paren_names(it, 2)  # it[j] is REFERENCES
            ref_cols = _paren_names(it, j + 2)[0] if j + 2 < len(it) and it[j + 2].text == "(" else ()
            fks.append((src, _unquote(it[j + 1].text), ref_cols))
        elif head[0] == "CHECK":
            continue
        else:
            col, is_pk, ref = _column(item)
            cols.append(col)
            col_pk += [col.name] if is_pk else []
            fks += [ref] if ref else []
    if not cols:
        raise SchemaError(f"CREATE TABLE {name}: no columns")
    pk = pk or tuple(col_pk)
    fks = list(dict.fromkeys(fks))  # Spider repeats some foreign keys
    return Table(name, tuple(cols), tuple(pk), tuple(dict.fromkeys(uniques)), tuple(fks))


def parse_schema(schema_sql: str) -> tuple[Table, ...]:
    """The tables of ``schema_sql`` (CREATE TABLE statements; ``sqlite_*`` tables skipped).

    Foreign keys to tables that are not in the schema are dropped.

    Raises:
      SchemaError: a CREATE TABLE statement that cannot be read, or no tables at all.
    """
    tables = []
    for stmt in split_statements(schema_sql):
        t = _table(stmt)
        if t is not None and not t.name.lower().startswith("sqlite_"):
            tables.append(t)
    if not tables:
        raise SchemaError("schema_sql has no CREATE TABLE statement")
    names = {t.name.lower() for t in tables}
    return tuple(
        dataclasses.replace(t, foreign_keys=tuple(fk for fk in t.foreign_keys if fk[1].lower() in names))
        for t in tables
    )


def quote_ident(name: str) -> str:
    """``name`` as a double-quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def sqlite_ddl(tables: tuple[Table, ...]) -> str:
    """SQLite CREATE TABLE statements for ``tables`` (identifiers quoted, one primary key each)."""
    stmts = []
    for t in tables:
        parts = []
        for c in t.columns:
            s = f"  {quote_ident(c.name)} {c.type}".rstrip()
            s += " NOT NULL" if c.notnull else ""
            s += f" DEFAULT {c.default}" if c.default is not None else ""
            parts.append(s)
        if t.primary_key:
            parts.append(f"  PRIMARY KEY ({', '.join(map(quote_ident, t.primary_key))})")
        parts += [f"  UNIQUE ({', '.join(map(quote_ident, u))})" for u in t.uniques if u]
        for src, ref, dst in t.foreign_keys:
            to = f"({', '.join(map(quote_ident, dst))})" if dst else ""
            parts.append(f"  FOREIGN KEY ({', '.join(map(quote_ident, src))}) REFERENCES {quote_ident(ref)}{to}")
        stmts.append(f"CREATE TABLE {quote_ident(t.name)} (\n" + ",\n".join(parts) + "\n);")
    return "\n".join(stmts)


# --------------------------------------------------------------------------- literals


@dataclasses.dataclass(frozen=True)
class Literal:
    """A literal of a query, with the column it is compared with (lower-case) when known."""

    value: str | int | float
    op: str  # "=", "!=", "<", ">", "<=", ">=", "LIKE", "IN", "BETWEEN", "" (unknown)
    column: str | None = None


_CMP = {"=", "==", "!=", "<>", "<", ">", "<=", ">="}
_FLIP = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}


def _literal_value(t: Token, names: set[str]) -> str | int | float | None:
    if t.kind == "str":
        return t.value
    if t.kind == "qid" and t.text.startswith('"') and t.value.lower() not in names:
        return t.value  # SQLite reads a double-quoted non-identifier as a string
    if t.kind == "num":
        return int(t.text) if re.fullmatch(r"\d+", t.text) else float(t.text)
    return None


def _column_before(toks: list[Token], j: int, names: set[str]) -> str | None:
    """The column ending at ``toks[j]`` (``col``, ``T1.col``, or ``f(T1.col)``)."""
    if j < 0:
        return None
    if toks[j].text == ")":
        depth, k = 0, j
        while k >= 0:
            depth += toks[k].text == ")"
            depth -= toks[k].text == "("
            if depth == 0:
                break
            k -= 1
        inner = [t for t in toks[k + 1 : j] if t.kind in ("word", "qid") and _unquote(t.text).lower() in names]
        return _unquote(inner[-1].text).lower() if inner else None
    name = _unquote(toks[j].text).lower()
    return name if toks[j].kind in ("word", "qid") and name in names else None


def _column_after(toks: list[Token], j: int, names: set[str]) -> str | None:
    k = j
    while k + 2 < len(toks) and toks[k + 1].text == ".":
        k += 2
    return _column_before(toks, k, names) if k < len(toks) else None


def sql_literals(sql: str, column_names: set[str]) -> list[Literal]:
    """The literals of ``sql`` (except LIMIT/OFFSET counts), each with its compared column.

    Args:
      sql: a query.
      column_names: lower-case column and table names of the schema (a double-quoted name in
        this set is an identifier, otherwise a string).
    """
    toks = tokenize(sql)
    out = []
    for i, t in enumerate(toks):
        val = _literal_value(t, column_names)
        if val is None or (i and toks[i - 1].upper in ("LIMIT", "OFFSET")):
            continue
        if i and toks[i - 1].text == "-" and isinstance(val, (int, float)):
            val = -val
        prev = [x.upper for x in toks[max(0, i - 2) : i]]
        j = i - (2 if prev[-1:] == ["-"] else 1)
        op, col = "", None
        if j >= 0 and toks[j].text in _CMP:
            op, col = toks[j].text, _column_before(toks, j - 1, column_names)
        elif j >= 0 and toks[j].upper in ("LIKE", "GLOB"):
            op, col = "LIKE", _column_before(toks, j - 1 - (toks[j - 1].upper == "NOT"), column_names)
        elif i + 1 < len(toks) and toks[i + 1].text in _CMP:
            op, col = _FLIP.get(toks[i + 1].text, toks[i + 1].text), _column_after(toks, i + 2, column_names)
        else:
            k = i - 1
            while k >= 0 and (toks[k].text == "," or _literal_value(toks[k], column_names) is not None):
                k -= 1
            if k >= 1 and toks[k].text == "(" and toks[k - 1].upper == "IN":
                op = "IN"
                col = _column_before(toks, k - 2 - (toks[k - 2].upper == "NOT"), column_names)
            elif k >= 0 and toks[k].upper in ("BETWEEN", "AND"):
                b = k if toks[k].upper == "BETWEEN" else k - 2
                if b >= 1 and toks[b].upper == "BETWEEN":
                    op, col = "BETWEEN", _column_before(toks, b - 1 - (toks[b - 1].upper == "NOT"), column_names)
        out.append(Literal(val, "!=" if op == "<>" else op, col))
    return out
