"""Append-only JSONL logs (``metrics.jsonl``, ``transcripts.jsonl``) read back after a crash.

Writers append whole records, one ``json.dumps(record) + "\\n"`` each, so a crash can damage only
the last line: cut short (no newline, perhaps inside a UTF-8 character), or, cut right after a
``}``, complete but without its newline. A last line that does not parse is dropped with one
warning (the resumed run redoes its record) and, when repairing, cut from the file so that the
next append starts a line of its own; a complete last record missing its newline is kept and
(repairing) given one. Any other unreadable line is an error naming the file and line.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

_log = logging.getLogger(__name__)


def _problem(e: Exception) -> str:
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 (byte {e.start})"
    assert isinstance(e, json.JSONDecodeError)
    return f"invalid JSON ({e.msg} at column {e.colno})"


def read_jsonl_log(path: str | Path, *, repair: bool = False, error: Callable[[str], Exception] = ValueError,
                   warn: Callable[[str], None] | None = None) -> list[tuple[int, Any]]:
    """The records of an append-only JSONL log with their 1-based line numbers.

    Args:
      path: the log (missing: no records).
      repair: cut a dropped last line from the file, and end a complete last line without its
        newline with one; only the log's owner repairs, at start-up (never while it is written).
      error: builds the exception raised for an unreadable line that is not the last.
      warn: receives the one warning line about a dropped last line (default: a logging warning).

    Returns:
      ``[(line_number, record), ...]`` in file order, blank lines skipped.

    Raises:
      The ``error(...)`` exception: ``path:line: invalid JSON (...)`` for a bad line before the last.
    """
    p = Path(path)
    if not p.exists():
        return []
    data = p.read_bytes()
    lines = data.split(b"\n")  # the last item is b"" when the file ends with a newline
    last = max((i for i, raw in enumerate(lines) if raw.strip()), default=-1)
    out: list[tuple[int, Any]] = []
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            out.append((i + 1, json.loads(raw.decode("utf-8"))))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            if i != last:
                raise error(f"{p}:{i + 1}: {_problem(e)}") from None
            (warn or _log.warning)(f"{p}:{i + 1}: dropping a truncated last line ({_problem(e)}; "
                                   "its record is redone)")
            if repair:
                with open(p, "r+b") as f:
                    f.truncate(sum(len(x) + 1 for x in lines[:i]))
            return out
    if repair and data and not data.endswith(b"\n"):
        with open(p, "ab") as f:
            f.write(b"\n")
    return out


def rewrite_jsonl(path: str | Path, records: list[Any]) -> None:
    """Replaces a JSONL log with ``records`` atomically: a kill mid-write leaves the old file whole.

    The records go to ``<path>.tmp`` (flushed and synced) and replace ``path`` with ``os.replace``.
    """
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
