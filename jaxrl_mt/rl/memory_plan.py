"""The memory planner's choices kept in the workdir, so that a resumed run is the same run.

``rl.remat = "auto"`` picks a rematerialisation per prompt bucket from the memory free at the
time (``rl.step.choose_remat``); a resume on a host with less free memory would pick another one
and compute different steps. The first choice for each bucket is recorded in
``<workdir>/memory_plan.json`` (with the vocabulary chunk of the loss, fixed today; SFT's and DPO's
buckets are their row lengths, keyed ``sft:0x160``, ``dpo:64x32``: ``rl.objective``) and reused by
every later start. An explicit ``rl.remat`` (not "auto") overrides the record; a change is logged
in one line and recorded (the run uses it from then on).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

__all__ = ["PLAN_FILE", "REMAT_ORDER", "MemoryPlan"]

PLAN_FILE = "memory_plan.json"
REMAT_ORDER = (False, "dots", True)  # the cheapest first: more memory saved, more recomputed


class MemoryPlan:
    """``<workdir>/memory_plan.json``: ``{"buckets": {"P": {"remat", "chunk", "source"}}}``."""

    def __init__(self, workdir: str | os.PathLike, *, chunk: int, log: Callable[[str], None] = print,
                 write: bool = True, agree: Callable[[list[int]], list[int]] | None = None):
        """Args:
          workdir: the run's folder.
          chunk: the loss's vocabulary chunk (``LossConfig.chunk``), recorded beside each choice.
          log: where a reuse or an override is reported (one line each).
          write: whether this process writes the file (process 0).
          agree: the processes' element-wise maximum of a list of ints (``parallel.agree_max_many``)
            in a multi-process run, so that every process uses the same choice; None: one process.
        """
        self.path = Path(workdir) / PLAN_FILE
        self.chunk, self.log, self.write, self.agree = chunk, log, write, agree
        self.buckets: dict[str, dict[str, Any]] = {}
        if self.path.is_file():
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
                self.buckets = {str(k): dict(v) for k, v in data["buckets"].items()
                                if isinstance(v, dict) and v.get("remat") in REMAT_ORDER}
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                self.log(f"{self.path}: unreadable ({type(e).__name__}: {e}); the memory plan is decided again")

    def recorded(self, prompt_len: int | str) -> bool | str | None:
        """The recorded rematerialisation of bucket ``prompt_len`` (agreed across processes), or None."""
        entry = self.buckets.get(str(prompt_len))
        index = -1 if entry is None else REMAT_ORDER.index(entry["remat"])
        if self.agree is not None:
            index = self.agree([index])[0]
        return None if index < 0 else REMAT_ORDER[index]

    def remat(self, prompt_len: int | str, configured: bool | str, decide: Callable[[], bool | str]) -> bool | str:
        """The rematerialisation of bucket ``prompt_len``: an explicit ``configured`` value, else the
        recorded one, else ``decide()`` (the planner), recorded."""
        had = self.recorded(prompt_len)
        if configured != "auto":
            if had is not None and had != configured:
                self.log(f"rl.remat={configured!r} overrides the recorded plan {had!r} for prompt bucket {prompt_len} "
                         f"({self.path}); recorded")
            return self._record(prompt_len, configured, "rl.remat") if had != configured else configured
        if had is not None:
            self.log(f"rl.remat auto: prompt bucket {prompt_len} -> {had!r}, as recorded at the first start "
                     f"({self.path})")
            return had
        return self._record(prompt_len, decide(), "auto")

    def _record(self, prompt_len: int | str, remat: bool | str, source: str) -> bool | str:
        self.buckets[str(prompt_len)] = {"remat": remat, "chunk": self.chunk, "source": source}
        if self.write:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps({"buckets": self.buckets}, indent=2) + "\n", encoding="utf-8")
            os.replace(tmp, self.path)
        return remat
