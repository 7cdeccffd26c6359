"""Wrong variants of a reference SQL query, made by token rewriting (test helper).

Kinds: ``column`` (a selected column replaced by another column of the same table),
``drop_where`` / ``drop_having`` (one clause removed), ``literal`` (one string literal gets a
suffix, one number +1, a LIMIT +1), ``order`` (ORDER BY direction flipped), ``agg`` (max<->min,
sum<->avg), ``op`` (one comparison flipped: > <-> <, >= <-> <=, = <-> !=).
"""

from __future__ import annotations

from jaxrl_mt.tasks.sql_fuzz import schema_names
from jaxrl_mt.tasks.sql_schema import Table, Token, tokenize

_CLAUSE_END = {"GROUP", "ORDER", "LIMIT", "EXCEPT", "UNION", "INTERSECT", "HAVING"}
_AGG = {"MAX": "MIN", "MIN": "MAX", "SUM": "AVG", "AVG": "SUM"}
_OPS = {">": "<", "<": ">", ">=": "<=", "<=": ">=", "=": "!=", "!=": "=", "<>": "="}


def _replace(sql: str, start: int, end: int, text: str) -> str:
    return sql[:start] + text + sql[end:]


def _clause_span(sql: str, toks: list[Token], i: int) -> tuple[int, int]:
    """Text span of the clause starting at ``toks[i]`` (up to the next clause at its depth)."""
    depth = 0
    for t in toks[i + 1 :]:
        if t.text == "(":
            depth += 1
        elif t.text == ")":
            if depth == 0:
                return toks[i].start, t.start
            depth -= 1
        elif depth == 0 and t.upper in _CLAUSE_END:
            return toks[i].start, t.start
    return toks[i].start, len(sql)


def _other_column(tables: tuple[Table, ...], name: str) -> str | None:
    for t in tables:
        col = t.column(name)
        if col is not None:
            others = [c.name for c in t.columns if c.name.lower() != name.lower()]
            return others[0] if others else None
    return None


def variants(sql: str, tables: tuple[Table, ...]) -> list[tuple[str, str]]:
    """``(kind, variant sql)`` pairs for ``sql``, each differing in text from it."""
    toks, names = tokenize(sql), schema_names(tables)
    cols = {c.name.lower() for t in tables for c in t.columns}
    out = []
    sel = next(i for i, t in enumerate(toks) if t.upper == "SELECT")
    frm = next((i for i, t in enumerate(toks) if t.upper == "FROM" and i > sel), len(toks))
    for t in toks[sel + 1 : frm]:
        if t.kind in ("word", "qid") and t.text.strip('"`').lower() in cols:
            other = _other_column(tables, t.text.strip('"`'))
            if other:
                out.append(("column", _replace(sql, t.start, t.start + len(t.text), f'"{other}"')))
            break
    for i, t in enumerate(toks):
        if t.upper in ("WHERE", "HAVING"):
            a, b = _clause_span(sql, toks, i)
            out.append((f"drop_{t.text.lower()}", _replace(sql, a, b, " ")))
        elif t.kind == "str" or (t.kind == "qid" and t.text.startswith('"') and t.value.lower() not in names):
            q, v = t.text[0], t.value.strip("%") + "Zz"
            out.append(
                (
                    "literal",
                    _replace(sql, t.start, t.start + len(t.text), f"{q}%{v}%{q}" if "%" in t.value else f"{q}{v}{q}"),
                )
            )
        elif t.kind == "num":
            out.append(("literal", _replace(sql, t.start, t.start + len(t.text), str(int(float(t.text)) + 1))))
        elif t.upper in ("DESC", "ASC"):
            out.append(("order", _replace(sql, t.start, t.start + len(t.text), "ASC" if t.upper == "DESC" else "DESC")))
        elif t.upper in _AGG and i + 1 < len(toks) and toks[i + 1].text == "(":
            out.append(("agg", _replace(sql, t.start, t.start + len(t.text), _AGG[t.upper])))
        elif t.kind == "op" and t.text in _OPS:
            out.append(("op", _replace(sql, t.start, t.start + len(t.text), _OPS[t.text])))
    if any(t.upper == "ORDER" for t in toks) and not any(t.upper in ("DESC", "ASC") for t in toks):
        by = next(i for i, t in enumerate(toks) if t.upper == "ORDER") + 1
        a, b = _clause_span(sql, toks, by)
        end = min((x.start for x in toks[by + 1 :] if x.upper == "LIMIT"), default=b)
        out.append(("order", sql[:end].rstrip() + " DESC " + sql[end:]))
    return [(k, v) for k, v in dict.fromkeys(out) if v.strip() != sql.strip()]
