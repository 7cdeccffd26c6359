"""Text from outside (a model's HTTP reply, a client's request) made safe to encode as UTF-8.

JSON's ``\\ud800`` escapes decode to lone surrogates, which Python strings hold but UTF-8 cannot
encode: written to a file or a socket they raise ``UnicodeEncodeError`` far from where they came
in. ``clean_text`` replaces each lone surrogate with U+FFFD (a valid surrogate pair, if a JSON
parser left one unjoined, becomes its character); ``clean`` does so through nested records.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["REPLACEMENT", "clean", "clean_text", "first_lone_surrogate"]

REPLACEMENT = "\ufffd"


def first_lone_surrogate(text: str) -> int | None:
    """The index of the first character UTF-8 cannot encode (a surrogate), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def clean_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (the same object when there is none)."""
    if first_lone_surrogate(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def clean(value: Any) -> Any:
    """``value`` with ``clean_text`` applied to every string in it (dict keys included), iteratively.

    Mappings become dicts and tuples lists (what JSON writes anyway); other values are kept.
    """
    if isinstance(value, str):
        return clean_text(value)
    if not isinstance(value, (Mapping, list, tuple)):
        return value
    root: list[Any] = [None]
    todo: list[tuple[Any, Any, Any]] = [(value, root, 0)]  # (source, parent container, key in it)
    while todo:
        src, parent, key = todo.pop()
        if isinstance(src, str):
            parent[key] = clean_text(src)
        elif isinstance(src, Mapping):
            out: dict[Any, Any] = {}
            parent[key] = out
            for k, v in src.items():
                k = clean_text(k) if isinstance(k, str) else k
                out[k] = None
                todo.append((v, out, k))
        elif isinstance(src, (list, tuple)):
            items: list[Any] = [None] * len(src)
            parent[key] = items
            todo.extend((v, items, i) for i, v in enumerate(src))
        else:
            parent[key] = src
    return root[0]
