"""Field checks and readers shared by the loaders: every bad value names ``path:line`` and the field."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from jaxrl_mt.data.records import DataError

# --------------------------------------------------------------------------- field checks


def short(value: Any, n: int = 60) -> str:
    r = repr(value)
    return r if len(r) <= n else r[: n - 3] + "..."


def str_field(d: Mapping, field: str, where: str, *, nonempty: bool = True) -> str:
    if field not in d:
        raise DataError(f"{where}: field '{field}': missing")
    v = d[field]
    if not isinstance(v, str) or (nonempty and not v.strip()):
        raise DataError(f"{where}: field '{field}': expected a non-empty string, got {short(v)}")
    return v


def str_list_field(d: Mapping, field: str, where: str, *, min_len: int = 1) -> list[str]:
    if field not in d:
        raise DataError(f"{where}: field '{field}': missing")
    v = d[field]
    if not isinstance(v, list) or len(v) < min_len or not all(isinstance(s, str) and s.strip() for s in v):
        what = "a non-empty list of strings" if min_len <= 1 else f"a list of at least {min_len} non-empty strings"
        raise DataError(f"{where}: field '{field}': expected {what}, got {short(v)}")
    return v


def shard_objs(d: Mapping, field: str, where: str, *, allow_empty_list: bool = False, text: bool = True) -> list[dict]:
    """A list of ``{"shard_id": int, "shard": str}``; ids unique. Returned sorted by id."""
    if field not in d:
        raise DataError(f"{where}: field '{field}': missing")
    v = d[field]
    if not isinstance(v, list) or (not v and not allow_empty_list):
        raise DataError(f"{where}: field '{field}': expected a non-empty list of shard objects, got {short(v)}")
    seen = set()
    for k, s in enumerate(v):
        if not isinstance(s, Mapping):
            raise DataError(f"{where}: field '{field}[{k}]': expected an object, got {short(s)}")
        sid = s.get("shard_id")
        if not isinstance(sid, int) or isinstance(sid, bool):
            raise DataError(f"{where}: field '{field}[{k}].shard_id': expected an integer, got {short(sid)}")
        if sid in seen:
            raise DataError(f"{where}: field '{field}[{k}].shard_id': duplicate id {sid}")
        seen.add(sid)
        if text and (not isinstance(s.get("shard"), str) or not s["shard"].strip()):
            raise DataError(
                f"{where}: field '{field}[{k}].shard': expected a non-empty string, got {short(s.get('shard'))}"
            )
    return sorted(v, key=lambda s: s["shard_id"])


def gold_from_gsm8k_answer(answer: str) -> str:
    """The final answer of a GSM8K solution: the text after ``####``, commas removed.

    Raises:
      DataError: no ``####`` or nothing after it.
    """
    if not isinstance(answer, str) or "####" not in answer:
        raise DataError(f"expected a GSM8K solution ending in '#### <answer>', got {short(answer)}")
    gold = answer.rsplit("####", 1)[1].strip().replace(",", "")
    if not gold:
        raise DataError(f"empty final answer after '####' in {short(answer)}")
    return gold


def gold_field(d: Mapping, field: str, where: str) -> str:
    try:
        return gold_from_gsm8k_answer(str_field(d, field, where))
    except DataError as e:
        if str(e).startswith(where):
            raise
        raise DataError(f"{where}: field '{field}': {e}") from None


# --------------------------------------------------------------------------- readers


def read_jsonl(path) -> Iterator[tuple[str, int, dict]]:
    """Yields ``(where, index, obj)`` per non-blank line; ``where`` is ``path:line`` (a ``.gz`` path is
    read through gzip)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file")
    index = 0
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise DataError(f"{where}: expected a JSON object, got {short(obj)}")
            yield where, index, obj
            index += 1


def read_json_array(path) -> Iterator[tuple[str, dict]]:
    """Yields ``(path:line, obj)`` for each element of a top-level JSON list (line = its start)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file")
    text = Path(path).read_text(encoding="utf-8")
    dec = json.JSONDecoder()

    def line_of(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    def skip(pos: int) -> int:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        return pos

    pos = skip(0)
    if not text.startswith("[", pos):
        raise DataError(f"{path}:{line_of(pos)}: expected a JSON list of records")
    pos = skip(pos + 1)
    if text.startswith("]", pos):
        return
    while True:
        where = f"{path}:{line_of(pos)}"
        try:
            obj, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise DataError(f"{where}: expected a JSON object, got {short(obj)}")
        yield where, obj
        pos = skip(pos)
        if text.startswith(",", pos):
            pos = skip(pos + 1)
        elif text.startswith("]", pos):
            break
        else:
            raise DataError(f"{path}:{line_of(pos)}: invalid JSON (expected ',' or ']')")
