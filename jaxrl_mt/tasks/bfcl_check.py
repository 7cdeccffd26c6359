"""BFCL's AST checker rules (own implementation): predicted calls against possible answers.

A reference answer is BFCL's possible-answer form: a list of ``{function: {param: [accepted
values]}}``; ``""`` in a value list means the parameter may be omitted. One predicted call
matches one reference call when:

* the function name is the reference's (a ``.`` written as ``_`` is accepted: OpenAI-style
  tool names cannot contain dots);
* every parameter the spec marks required is present, and no parameter is unknown to the spec
  or absent from the reference;
* every value has the spec's type (integer, float, string, boolean, array, tuple, dict, any;
  an int is accepted where a float is expected, a bool never counts as a number; array items
  and dict properties are checked recursively);
* every value is among the accepted ones: strings compared case-insensitively with spaces and
  ``,./-_*^'"`` removed, numbers by value, lists element by element, dicts key by key (their
  values again lists of accepted values);
* every reference parameter the call omits has ``""`` among its accepted values.

``simple`` and ``multiple`` need exactly one call; ``parallel`` and ``parallel_multiple`` need
as many calls as the reference, matched in any order (a perfect bipartite matching).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from jaxrl_mt.tasks.calls import Call, Expr

__all__ = ["check_call", "check_calls", "check_type", "normalize_string"]

_STRIP_RE = re.compile(r"[\s,./\-_*^'\"]")
_TYPE_ALIASES = {
    "number": "float",
    "double": "float",
    "int": "integer",
    "str": "string",
    "bool": "boolean",
    "list": "array",
    "object": "dict",
    "": "any",
}


def normalize_string(s: str) -> str:
    """BFCL-style string normalisation: lower-case, spaces and ``,./-_*^'"`` removed."""
    return _STRIP_RE.sub("", s).lower()


def _tname(v: Any) -> str:
    if isinstance(v, Expr):
        return f"the expression {v.source!r}"
    return {
        bool: "boolean",
        int: "integer",
        float: "float",
        str: "string",
        list: "array",
        tuple: "tuple",
        dict: "dict",
        type(None): "null",
    }.get(type(v), type(v).__name__)


def _type_ok(v: Any, t: str) -> bool:
    if isinstance(v, Expr):
        return False
    if t == "integer":
        return type(v) is int
    if t == "float":
        return type(v) in (int, float)
    if t == "string":
        return isinstance(v, str)
    if t == "boolean":
        return type(v) is bool
    if t == "array":
        return isinstance(v, list)
    if t == "tuple":
        return isinstance(v, (list, tuple))
    if t == "dict":
        return isinstance(v, Mapping)
    return True  # any / unknown type names


def check_type(v: Any, spec: Mapping, path: str) -> str | None:
    """None when ``v`` has the type of ``spec`` (recursively), else a reason naming ``path``."""
    t = str(spec.get("type", "any")).lower()
    t = _TYPE_ALIASES.get(t, t)
    if not _type_ok(v, t):
        return f"wrong type for '{path}': expected {t}, got {_tname(v)}"
    if t in ("array", "tuple") and isinstance(spec.get("items"), Mapping):
        for i, x in enumerate(v):
            err = check_type(x, spec["items"], f"{path}[{i}]")
            if err:
                return err
    if t == "dict" and isinstance(spec.get("properties"), Mapping):
        for k, x in v.items():
            if k in spec["properties"]:
                err = check_type(x, spec["properties"][k], f"{path}.{k}")
                if err:
                    return err
    return None


def _eq(v: Any, a: Any) -> bool:
    if isinstance(v, Expr):
        return False
    if isinstance(a, str) or isinstance(v, str):
        return isinstance(a, str) and isinstance(v, str) and normalize_string(v) == normalize_string(a)
    if isinstance(a, bool) or isinstance(v, bool):
        return type(a) is bool and type(v) is bool and a == v
    if isinstance(a, (int, float)) and isinstance(v, (int, float)):
        return float(v) == float(a)
    if isinstance(a, (list, tuple)) and isinstance(v, (list, tuple)):
        return len(a) == len(v) and all(_eq(x, y) for x, y in zip(v, a))
    if isinstance(a, Mapping) and isinstance(v, Mapping):
        return _dict_match(v, a)
    return v == a


def _dict_match(v: Mapping, a: Mapping) -> bool:
    """A dict value against one accepted dict whose values are lists of accepted values."""
    if any(k not in a for k in v):
        return False
    for k, acc in a.items():
        accs = acc if isinstance(acc, list) else [acc]
        if k not in v:
            if "" not in accs:
                return False
        elif not (any(_eq(v[k], x) for x in accs if not (isinstance(x, str) and x == "")) or _eq(v[k], acc)):
            return False
    return True


def _accepted(v: Any, accepted: Sequence) -> bool:
    return any(_eq(v, a) for a in accepted if not (isinstance(a, str) and a == ""))


def _same_name(got: str, want: str) -> bool:
    return got == want or got == want.replace(".", "_")


def check_call(call: Call, ref_name: str, ref_args: Mapping[str, Sequence], spec: Mapping | None) -> str | None:
    """None when ``call`` matches the reference call ``ref_name(ref_args)``, else the reason.

    Args:
      call: the predicted call.
      ref_name, ref_args: one entry of the possible answer.
      spec: the function's BFCL spec (``parameters.properties``, ``parameters.required``), or
        None when the record has no spec for it (then only the reference is used).
    """
    if not _same_name(call.name, ref_name):
        return f"wrong function: expected {ref_name}, got {call.name}"
    params = (spec or {}).get("parameters", {}) or {}
    props = params.get("properties", {}) or {}
    for r in params.get("required", []) or []:
        if r not in call.arguments:
            return f"missing required argument '{r}' in {ref_name}"
    for k, v in call.arguments.items():
        if (props and k not in props) or k not in ref_args:
            return f"unexpected argument '{k}' in {ref_name}"
        if k in props:
            err = check_type(v, props[k], k)
            if err:
                return f"{err} in {ref_name}"
        if not _accepted(v, ref_args[k]):
            shown = [a for a in ref_args[k] if a != ""]
            return f"wrong value for '{k}' in {ref_name}: got {v!r}, accepted {shown!r}"
    for k, acc in ref_args.items():
        if k not in call.arguments and "" not in acc:
            return f"missing argument '{k}' in {ref_name} (the reference needs it)"
    return None


def _matching(ok: list[list[bool]]) -> list[int]:
    """Maximum bipartite matching (Kuhn): ``match[j]`` = reference index of prediction j or -1."""
    n_ref, n_pred = len(ok), len(ok[0]) if ok else 0
    match = [-1] * n_pred

    def augment(i: int, seen: list[bool]) -> bool:
        for j in range(n_pred):
            if ok[i][j] and not seen[j]:
                seen[j] = True
                if match[j] < 0 or augment(match[j], seen):
                    match[j] = i
                    return True
        return False

    for i in range(n_ref):
        augment(i, [False] * n_pred)
    return match


def check_calls(
    calls: Sequence[Call], reference: Sequence[Mapping], specs: Sequence[Mapping], category: str = ""
) -> str | None:
    """None when ``calls`` answer the reference, else the reason.

    The number of calls must equal the reference's (one for ``simple`` / ``multiple``), and the
    calls are matched to the reference calls in any order. ``category`` is informative only:
    the reference's length decides.
    """
    by_name = {s.get("name"): s for s in specs if isinstance(s, Mapping)}
    refs = [next(iter(r.items())) for r in reference]
    if len(calls) != len(refs):
        return f"wrong number of calls: expected {len(refs)}, got {len(calls)}"
    errors = [[check_call(c, name, args, by_name.get(name)) for c in calls] for name, args in refs]
    match = _matching([[e is None for e in row] for row in errors])
    if all(i >= 0 for i in match):
        return None
    # pair the first unmatched reference call with the first unmatched predicted call
    i = next(i for i in range(len(refs)) if i not in match)
    j = next(j for j in range(len(calls)) if match[j] < 0)
    why = errors[i][j] or "matches only calls that other reference calls need"
    if len(refs) == 1:
        return why
    return f"reference call {i + 1} ({refs[i][0]}) unmatched, predicted call {j + 1}: {why}"
