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
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
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


_FENCE_RE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.S)
_INLINE_RE = re.compile(r"`([^`\n]+)`")
_OPEN_RE = re.compile(r"[\[{]")
_CALL_START_RE = re.compile(r"(?<![\w.])[A-Za-z_][\w.]*\(")


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


_JSON_NAMES = {"true": True, "false": False, "null": None}


class _JsonNames(ast.NodeTransformer):
    """``true`` / ``false`` / ``null`` written JSON-style become Python constants."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.copy_location(ast.Constant(_JSON_NAMES[node.id]), node) if node.id in _JSON_NAMES else node


def _value(node: ast.AST) -> Any:
    node = _JsonNames().visit(node)
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return Expr(ast.unparse(node))


def _call(node: ast.AST, order: Mapping[str, Sequence[str]]) -> Call | None:
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
        args.update({p: _value(a) for p, a in zip(params, node.args)})
    for k in node.keywords:
        args[k.arg] = _value(k.value)
    return Call(name, args)


def _python_calls(text: str, order: Mapping[str, Sequence[str]]) -> list[Call] | None:
    try:
        tree = ast.parse(text.strip())
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    calls: list[Call] = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Expr):
            return None
        nodes = stmt.value.elts if isinstance(stmt.value, (ast.List, ast.Tuple)) else [stmt.value]
        for n in nodes:
            c = _call(n, order)
            if c is None:
                return None
            calls.append(c)
    return calls or None


def _json_call(obj: Any) -> list[Call] | None:
    if isinstance(obj, list):
        out = [_json_call(o) for o in obj]
        return [c for cs in out for c in cs] if out and all(out) else None
    if not isinstance(obj, Mapping):
        return None
    if isinstance(obj.get("tool_calls"), list):
        return _json_call(obj["tool_calls"])
    if isinstance(obj.get("function"), Mapping):
        return _json_call(obj["function"])
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return None
    if not isinstance(name, str) or not name.strip() or not isinstance(args, Mapping):
        return None
    return [Call(name.strip(), dict(args))]


def _json_calls(text: str) -> list[Call] | None:
    try:
        return _json_call(json.loads(text.strip()))
    except (json.JSONDecodeError, RecursionError):
        return None


def parse_calls(text: str, order: Mapping[str, Sequence[str]] | None = None) -> list[Call] | None:
    """Calls written in ``text`` as a whole (Python syntax or JSON), or None."""
    order = order or {}
    return _python_calls(text, order) or _json_calls(text)


def _scan_json(text: str) -> list[Call]:
    dec, out, pos = json.JSONDecoder(), [], 0
    while True:
        m = _OPEN_RE.search(text, pos)
        if m is None:
            return out
        try:
            obj, end = dec.raw_decode(text, m.start())
        except json.JSONDecodeError:
            pos = m.start() + 1
            continue
        calls = _json_call(obj)
        out += calls or []
        pos = end if calls else m.start() + 1


def _scan_python(text: str, order: Mapping[str, Sequence[str]]) -> list[Call]:
    """Calls embedded in prose (``I'll call f(a=1) now``): each ``name(`` up to the first ``)``
    that closes a parseable call."""
    out, pos = [], 0
    while True:
        m = _CALL_START_RE.search(text, pos)
        if m is None:
            return out
        pos = m.end()
        for end in [i for i, ch in enumerate(text[m.end() :], m.end()) if ch == ")"][:20]:
            calls = _python_calls(text[m.start() : end + 1], order)
            if calls:
                out += calls
                pos = end + 1
                break


def find_calls(reply: str, order: Mapping[str, Sequence[str]] | None = None) -> list[Call] | None:
    """The function calls of a model reply (see module doc for where they are looked for).

    Args:
      reply: the reply text.
      order: parameter names in spec order per function (maps positional arguments).
    """
    if not isinstance(reply, str) or not reply.strip():
        return None
    for block in reversed(_FENCE_RE.findall(reply)):
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
