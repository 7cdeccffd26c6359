"""Function calls in a model reply: Python call syntax or JSON, parsed into ``Call`` records.

Accepted forms (BFCL / LiC actions):

* Python: ``[f(a=1, b="x"), ns.g(c=[1, 2])]``, a tuple of calls, bare calls one per line;
  arguments are keyword arguments with literal values (``ast.literal_eval``); positional
  arguments are mapped to the spec's parameter order when the spec is known; a non-literal
  argument is kept as :class:`Expr` (it fails the type check later).
* JSON: ``{"name": ..., "arguments": {...}}`` (or ``"parameters"``), lists of them,
  ``{"function": {...}}``, and OpenAI-style ``{"tool_calls": [{"function": {"name": ...,
  "arguments": "<json text>"}}]}``.

Where: the last fenced block that parses; else the whole reply; else every line or inline code
span that parses as calls (in order); else calls embedded in prose (``name(`` ... ``)``); else
JSON objects found in the text.

Hostile replies: every scan is linear in the reply (brackets are matched once,
:mod:`jaxrl_mt.tasks.brackets`), nothing recurses on the reply's nesting, and values nested
deeper than ``MAX_DEPTH`` are not read as calls (a JSON value) or kept as :class:`Expr` (a
Python argument); such a reply gets a verdict, never an exception.
"""

from __future__ import annotations

import ast
import bisect
import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from jaxrl_mt.tasks.brackets import json_matcher, python_matcher
from jaxrl_mt.tasks.fences import backtick_fences

__all__ = [
    "MAX_DEPTH",
    "Call",
    "Expr",
    "calls_from_json",
    "calls_to_json",
    "find_calls",
    "parse_calls",
    "render_json",
    "render_python",
]


@dataclasses.dataclass(frozen=True)
class Expr:
    """A non-literal argument (``x``, ``5 * 2``): its source text."""

    source: str


@dataclasses.dataclass(frozen=True)
class Call:
    """One function call: dotted name and keyword arguments."""

    name: str
    arguments: Mapping[str, Any]


_INLINE_RE = re.compile(r"`([^`\n]+)`")
_OPEN_RE = re.compile(r"[\[{]")
_CALL_START_RE = re.compile(r"(?<![\w.])[A-Za-z_][\w.]*\(")
MAX_DEPTH = 64  # deepest JSON value / Python argument read (BFCL arguments nest a few levels)
_MAX_TRIES = 20  # closing parentheses tried per call embedded in prose


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


_JSON_NAMES = {"true": True, "false": False, "null": None}


def _json_name(node: Any) -> Any:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return ast.copy_location(ast.Constant(_JSON_NAMES[node.id]), node)
    return node


def _json_names(node: ast.AST) -> ast.AST:
    """``true`` / ``false`` / ``null`` written JSON-style become Python constants (in place)."""
    for parent in ast.walk(node):
        for field, value in ast.iter_fields(parent):
            if isinstance(value, list):
                value[:] = [_json_name(v) for v in value]
            elif isinstance(value, ast.Name):
                setattr(parent, field, _json_name(value))
    return _json_name(node)


def _too_deep(node: ast.AST, limit: int = MAX_DEPTH) -> bool:
    stack = [(node, 1)]
    while stack:
        n, d = stack.pop()
        if d > limit:
            return True
        stack.extend((c, d + 1) for c in ast.iter_child_nodes(n))
    return False


_MAX_INT_BITS = 4000 * 3  # fewer than 4,000 decimal digits: str() and json.dumps() work (their cap is 4,300)


def _plain_value(v: Any) -> bool:
    """Whether a literal holds only values that print and serialize: no ``...`` (Ellipsis) and no
    integer of thousands of digits (``0x`` + 5,000 ``f``: ``repr`` of it raises ValueError)."""
    todo = [v]
    while todo:
        x = todo.pop()
        if x is Ellipsis or (isinstance(x, int) and x.bit_length() > _MAX_INT_BITS):
            return False
        if isinstance(x, Mapping):
            todo += [*x.keys(), *x.values()]
        elif isinstance(x, (list, tuple, set, frozenset)):
            todo += x
    return True


def _value(node: ast.AST, source: str) -> Any:
    """An argument's value: the literal, or an :class:`Expr` of its source (a non-literal, one
    nested too deeply, or one holding ``...`` or a huge integer)."""
    if _too_deep(node):
        return Expr(ast.get_source_segment(source, node) or "<too deeply nested>")
    node = _json_names(node)
    try:
        v = ast.literal_eval(node)
        if _plain_value(v):
            return v
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    try:
        return Expr(ast.unparse(node))
    except (ValueError, RecursionError):  # a huge integer inside: repr() refuses it
        return Expr((ast.get_source_segment(source, node) or "<not a literal>")[:10_000])


def _call(node: ast.AST, order: Mapping[str, Sequence[str]], source: str) -> Call | None:
    if not isinstance(node, ast.Call):
        return None
    name = _dotted(node.func)
    if name is None or any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
        return None
    args: dict[str, Any] = {}
    if node.args:
        params = order.get(name)
        if params is None or len(node.args) > len(params):
            return None
        args.update({p: _value(a, source) for p, a in zip(params, node.args)})
    for k in node.keywords:
        args[k.arg] = _value(k.value, source)
    return Call(name, args)


def _python_calls(text: str, order: Mapping[str, Sequence[str]]) -> list[Call] | None:
    source = text.strip()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    calls: list[Call] = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Expr):
            return None
        nodes = stmt.value.elts if isinstance(stmt.value, (ast.List, ast.Tuple)) else [stmt.value]
        for n in nodes:
            c = _call(n, order, source)
            if c is None:
                return None
            calls.append(c)
    return calls or None


def _one_json_call(obj: Mapping) -> Call | None:
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        args = _loads(args) if args.strip() else {}
    if not isinstance(name, str) or not name.strip() or not isinstance(args, Mapping):
        return None
    return Call(name.strip(), dict(args))


def _json_call(obj: Any) -> list[Call] | None:
    """The calls of a decoded JSON value: a call object, a list of them (nested lists flatten,
    an empty one fails), ``{"tool_calls": [...]}`` or ``{"function": {...}}``; None unless
    every leaf is a call."""
    out: list[Call] = []
    todo = [obj]
    while todo:
        o = todo.pop()
        if isinstance(o, list):
            if not o:
                return None
            todo.extend(reversed(o))
        elif not isinstance(o, Mapping):
            return None
        elif isinstance(o.get("tool_calls"), list):
            todo.append(o["tool_calls"])
        elif isinstance(o.get("function"), Mapping):
            todo.append(o["function"])
        else:
            call = _one_json_call(o)
            if call is None:
                return None
            out.append(call)
    return out or None


_NOT_JSON = object()


def _json_int(digits: str) -> int | Expr:
    """A JSON integer; one of thousands of digits (``int()`` refuses it) as an :class:`Expr`."""
    return int(digits) if len(digits) < 4000 else Expr(digits[:10_000])


def _decode(text: str) -> Any:
    try:
        return json.loads(text, parse_int=_json_int)
    except (ValueError, RecursionError, MemoryError):  # JSONDecodeError is a ValueError
        return _NOT_JSON


def _loads(text: str) -> Any:
    """``json.loads(text)``, or ``_NOT_JSON`` when it fails or nests deeper than ``MAX_DEPTH``."""
    text = text.strip()
    if text[:1] in ("[", "{") and json_matcher(text, MAX_DEPTH).close(0) < 0:
        return _NOT_JSON  # unbalanced or too deep: json would fail or recurse
    return _decode(text)


def _json_calls(text: str) -> list[Call] | None:
    obj = _loads(text)
    return None if obj is _NOT_JSON else _json_call(obj)


def parse_calls(text: str, order: Mapping[str, Sequence[str]] | None = None) -> list[Call] | None:
    """Calls written in ``text`` as a whole (Python syntax or JSON), or None."""
    order = order or {}
    return _python_calls(text, order) or _json_calls(text)


def _scan_json(text: str) -> list[Call]:
    """JSON calls anywhere in the text: at each ``[`` / ``{`` (left to right) the value that
    starts there, when it decodes to calls (then the scan goes on after it)."""
    brackets, out, pos = json_matcher(text, MAX_DEPTH), [], 0
    while True:
        m = _OPEN_RE.search(text, pos)
        if m is None:
            return out
        end = brackets.close(m.start())
        obj = _decode(text[m.start() : end + 1]) if end >= 0 else _NOT_JSON  # balanced, not too deep
        calls = None if obj is _NOT_JSON else _json_call(obj)
        out += calls or []
        pos = end + 1 if calls else m.start() + 1


def _scan_python(text: str, order: Mapping[str, Sequence[str]]) -> list[Call]:
    """Calls embedded in prose (``I'll call f(a=1) now``): each ``name(`` up to the ``)`` that
    closes it, when that is one of the first 20 after it and the span parses as calls (a span
    ending at an earlier ``)`` leaves the parenthesis open, one ending later cannot parse when
    this one does not)."""
    brackets, out, pos = python_matcher(text), [], 0
    closers = [c.start() for c in re.finditer(r"\)", text)]
    while True:
        m = _CALL_START_RE.search(text, pos)
        if m is None:
            return out
        pos = m.end()
        end = brackets.close(m.end() - 1)
        if end < 0 or bisect.bisect_right(closers, end) - bisect.bisect_left(closers, m.end()) > _MAX_TRIES:
            continue
        calls = _python_calls(text[m.start() : end + 1], order)
        if calls:
            out += calls
            pos = end + 1


def find_calls(reply: str, order: Mapping[str, Sequence[str]] | None = None) -> list[Call] | None:
    """The function calls of a model reply (see module doc for where they are looked for).

    Args:
      reply: the reply text.
      order: parameter names in spec order per function (maps positional arguments).
    """
    if not isinstance(reply, str) or not reply.strip():
        return None
    for _, block in reversed(backtick_fences(reply)):  # linear: no regular expression to backtrack
        calls = parse_calls(block, order)
        if calls:
            return calls
    calls = parse_calls(reply, order)
    if calls:
        return calls
    found: list[Call] = []
    for line in reply.splitlines():
        spans = _INLINE_RE.findall(line) or [line.strip().rstrip(".;,")]
        for span in spans:
            found += _python_calls(span, order or {}) or []
    return found or _scan_python(reply, order or {}) or _scan_json(reply) or None


def _plain(v: Any) -> Any:
    if isinstance(v, Expr):
        return {"__expr__": v.source}
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (set, frozenset, bytes, complex)):
        return {"__expr__": repr(v)}
    return v


def calls_to_json(calls: Sequence[Call]) -> str:
    """Canonical JSON text of calls: ``[{"name": ..., "arguments": {...}}, ...]``."""
    return json.dumps([{"name": c.name, "arguments": _plain(dict(c.arguments))} for c in calls], ensure_ascii=False)


def _unplain(v: Any) -> Any:
    if isinstance(v, Mapping):
        if set(v) == {"__expr__"}:
            return Expr(str(v["__expr__"]))
        return {k: _unplain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_unplain(x) for x in v]
    return v


def calls_from_json(text: str) -> list[Call]:
    """Inverse of :func:`calls_to_json`."""
    return [Call(d["name"], _unplain(d["arguments"])) for d in json.loads(text)]


def render_python(calls: Sequence[Call]) -> str:
    """``[f(a=1, b='x'), g()]``."""
    return (
        "["
        + ", ".join(f"{c.name}(" + ", ".join(f"{k}={v!r}" for k, v in c.arguments.items()) + ")" for c in calls)
        + "]"
    )


def render_json(calls: Sequence[Call]) -> str:
    """``[{"name": "f", "arguments": {"a": 1}}]``."""
    return calls_to_json(calls)
