"""Task-specific fields of LiC records (database, actions, ...): parsing and checks.

The RLSTA copy of the LiC benchmark stores nested fields (``function``, ``reference_answer``,
``schema_tables``, sometimes ``shards``) as *Python-literal strings*; other copies store them as
JSON values. :func:`parse_literal` accepts both (``ast.literal_eval`` first, JSON for ``null`` /
``true`` / ``false``), and every failure names the file, line, record and field.

:func:`lic_task_fields` returns what ``load_lic`` keeps of a non-math record: the full prompt,
the answer text, and the task-specific fields (parsed) for metadata ``lic_extra``.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from typing import Any

from jaxrl_mt.data.records import DataError

__all__ = ["LITERAL_FIELDS", "lic_task_fields", "parse_literal", "parse_literal_fields"]

LITERAL_FIELDS = ("function", "reference_answer", "schema_tables", "shards", "fully_specified_question")
_PROMPT_FIELDS = ("question", "fully_specified_question", "query", "instruction")
_ANSWER_FIELDS = ("answer", "reference_answer", "reference_sql", "solution")
BFCL_CATEGORIES = ("simple", "multiple", "parallel", "parallel_multiple")


def _short(value: Any, n: int = 60) -> str:
    r = repr(value)
    return r if len(r) <= n else r[: n - 3] + "..."


def parse_literal(text: str, where: str, field: str) -> Any:
    """Parses a Python-literal (or JSON) string.

    Args:
      text: the field's text, e.g. ``"[{'f': {'a': [1]}}]"``.
      where: ``path:line (record k)`` for messages.
      field: the field name, for messages.

    Raises:
      DataError: ``where: field 'name': not a Python literal (...)``.
    """
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
        first = e
    try:  # JSON spellings (null, true, false) are not Python literals
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    detail = f"{type(first).__name__}: {first.msg if isinstance(first, SyntaxError) else first}"
    if isinstance(first, SyntaxError) and first.lineno:
        detail += f" at line {first.lineno} column {first.offset}"
    raise DataError(f"{where}: field '{field}': not a valid Python literal ({detail}): {_short(text)}")


def parse_literal_fields(d: Mapping, where: str, fields: tuple[str, ...] = LITERAL_FIELDS) -> dict:
    """A copy of record ``d`` with the string-valued ``fields`` that hold literals parsed.

    A string is taken for a literal when it starts with ``[`` or ``{`` (a plain-text
    ``fully_specified_question`` stays text).
    """
    out = dict(d)
    for f in fields:
        v = out.get(f)
        if isinstance(v, str) and v.lstrip()[:1] in ("[", "{"):
            out[f] = parse_literal(v, where, f)
    return out


def _user_text(turns: Any) -> str | None:
    """The user contents of a BFCL-style ``[[{"role": "user", "content": ...}], ...]`` question."""
    texts = []
    stack = [turns]
    while stack:
        x = stack.pop(0)
        if isinstance(x, list):
            stack[:0] = x
        elif isinstance(x, Mapping) and x.get("role", "user") == "user" and isinstance(x.get("content"), str):
            c = x["content"].strip()
            if len(c) >= 2 and c[0] == c[-1] == '"':
                c = c[1:-1].strip()
            texts.append(c)
    return "\n".join(t for t in texts if t) or None


def _check_database(d: Mapping, where: str) -> None:
    for f in ("db_id", "schema_sql", "reference_sql"):
        if not isinstance(d.get(f), str) or not d[f].strip():
            raise DataError(f"{where}: field '{f}': expected a non-empty string, got {_short(d.get(f))}")
    if "schema_tables" in d and not isinstance(d["schema_tables"], Mapping):
        raise DataError(
            f"{where}: field 'schema_tables': expected an object of tables, got {_short(d['schema_tables'])}"
        )


def _check_actions(d: Mapping, where: str) -> None:
    fns = d.get("function")
    if not isinstance(fns, list) or not fns:
        raise DataError(f"{where}: field 'function': expected a non-empty list of function specs, got {_short(fns)}")
    for k, fn in enumerate(fns):
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"].strip():
            raise DataError(f"{where}: field 'function[{k}].name': expected a non-empty string, got {_short(fn)}")
        params = fn.get("parameters", {})
        if not isinstance(params, Mapping) or not isinstance(params.get("properties", {}), Mapping):
            raise DataError(
                f"{where}: field 'function[{k}].parameters': expected an object with 'properties', got {_short(params)}"
            )
    ref = d.get("reference_answer")
    if not isinstance(ref, list) or not ref:
        raise DataError(f"{where}: field 'reference_answer': expected a non-empty list of calls, got {_short(ref)}")
    for k, call in enumerate(ref):
        ok = isinstance(call, Mapping) and len(call) == 1
        args = next(iter(call.values())) if ok else None
        if not ok or not isinstance(args, Mapping) or not all(isinstance(v, list) for v in args.values()):
            raise DataError(
                f"{where}: field 'reference_answer[{k}]': expected {{function: {{param: [accepted values]}}}}, "
                f"got {_short(call)}"
            )
    cat = d.get("test_category", "simple")
    if cat not in BFCL_CATEGORIES:
        raise DataError(f"{where}: field 'test_category': expected one of {', '.join(BFCL_CATEGORIES)}, got {cat!r}")


_CHECKS = {"database": _check_database, "actions": _check_actions}


def lic_task_fields(d: Mapping, task: str, where: str) -> tuple[str | None, str, dict]:
    """The full prompt, answer text and extra fields of one non-math LiC record.

    ``d`` must already have gone through :func:`parse_literal_fields`.

    Returns:
      ``(full_prompt or None, answer text, extra fields)``; extra excludes ``task_id``,
      ``task`` and ``shards``.

    Raises:
      DataError: a task-specific field is malformed (database, actions).
    """
    check = _CHECKS.get(task)
    if check is not None:
        check(d, where)
    prompt = None
    for f in _PROMPT_FIELDS:
        v = d.get(f)
        if isinstance(v, str) and v.strip():
            prompt = v.strip()
        elif isinstance(v, list):
            prompt = _user_text(v)
        if prompt:
            break
    ans = next((d[f] for f in _ANSWER_FIELDS if f in d), "")
    answer = ans if isinstance(ans, str) else json.dumps(ans, ensure_ascii=False)
    extra = {k: v for k, v in d.items() if k not in ("task_id", "task", "shards")}
    return prompt, answer, extra
