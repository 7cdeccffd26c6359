"""``transcripts.jsonl``: the evaluation's finished conversations, appended and flushed, read back on resume."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxrl_mt.data.jsonl_log import read_jsonl_log
from jaxrl_mt.eval.errors import EvalError
from jaxrl_mt.text_safety import clean, first_lone_surrogate

log = logging.getLogger(__name__)
_REQUIRED = ("conv_id", "task_id", "kind", "run", "score", "turns")


class TranscriptStore:
    """``transcripts.jsonl``: one JSON line per finished conversation, appended and flushed."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def load(self) -> dict[str, dict[str, Any]]:
        """The records already written, by conv_id (a later duplicate replaces an earlier one).

        A last line cut short by an interruption (even one ending in ``}``) is dropped with one
        warning and removed from the file (its conversation is run again); any other unreadable
        line is an error (see ``data.jsonl_log``).

        Raises:
          EvalError: ``path:line: ...`` for a malformed line or a record missing a field.
        """
        out: dict[str, dict[str, Any]] = {}
        for n, rec in read_jsonl_log(self.path, repair=True, error=EvalError, warn=log.warning):
            missing = [f for f in _REQUIRED if not isinstance(rec, dict) or f not in rec]
            if missing:
                raise EvalError(f"{self.path}:{n}: field '{missing[0]}': missing")
            out[rec["conv_id"]] = rec
        return out

    def append(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Appends records, one line each, and flushes them to disk.

        Text UTF-8 cannot encode (a lone surrogate in a model's reply) is written as U+FFFD, with
        one warning per record, never an error.
        """
        if not records:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            for rec in records:
                line = json.dumps(rec, ensure_ascii=False)
                if first_lone_surrogate(line) is not None:
                    log.warning("%s: conversation %s: lone surrogates written as U+FFFD", self.path,
                                str(rec.get("conv_id"))[:80].encode("utf-8", "replace").decode("utf-8"))
                    line = json.dumps(clean(rec), ensure_ascii=False)
                f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
