"""The files of a `jaxrl_mt.eval.sedt_eval` run: its settings check and the resume of finished blocks.

``out`` holds ``settings.json`` (the settings of the run that wrote it), ``transcripts.jsonl``
(records of finished blocks, appended as each ends) and ``blocks.jsonl`` (one line per finished
block). A rerun with the same settings resumes after the blocks listed there.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Mapping

from jaxrl_mt.data.jsonl_log import read_jsonl_log


def read_jsonl(path: Path, log=lambda s: None) -> list[dict[str, Any]]:
    """The records of an append-only file in ``out`` (`data.jsonl_log`: a last line cut by a kill is
    dropped with one log line; an unreadable earlier line is an error)."""
    return [r for _, r in read_jsonl_log(path, warn=log)]


def stored_config(cfg: Any) -> dict[str, Any]:
    """A ``SeDTConfig`` as ``settings.json`` holds it: without ``ablations`` when there are none, so the
    folders of runs from before the ablation arms existed still resume."""
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k != "ablations" or v}


def check_settings(out: Path, settings: Mapping[str, Any]) -> None:
    """Writes ``settings.json``, or checks that an earlier run in ``out`` used the same settings.

    Raises:
      ValueError: naming the first setting that differs (resuming would mix two experiments), or
        when ``out`` holds transcripts but no settings (they would be overwritten).
    """
    path = out / "settings.json"
    settings = json.loads(json.dumps(settings))  # as stored: tuples become lists, so a resumed run compares equal
    if path.exists():
        old = json.loads(path.read_text(encoding="utf-8"))
        for k in sorted(set(old) | set(settings)):
            if old.get(k) != settings.get(k):
                raise ValueError(f"{out} holds a run with {k}={old.get(k)!r}, not {settings.get(k)!r}; "
                                 "use another --out or delete it")
    elif (out / "transcripts.jsonl").exists():
        raise ValueError(f"{out} holds transcripts of an evaluation without settings.json (an older run); "
                         "use another --out")
    else:
        path.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def resume(out: Path, settings: Mapping[str, Any], log) -> tuple[dict[int, dict], list[dict[str, Any]], str]:
    """The finished blocks and their records in ``out`` (files rewritten without a cut block), or an error."""
    out.mkdir(parents=True, exist_ok=True)
    try:
        check_settings(out, settings)
    except ValueError as e:
        return {}, [], str(e)
    done = {d["block"]: d for d in read_jsonl(out / "blocks.jsonl", log)}
    kept = [r for r in read_jsonl(out / "transcripts.jsonl", log) if r.get("block") in done]
    counts = Counter(r["block"] for r in kept)
    done = {i: d for i, d in done.items() if counts[i] == d["n"]}  # a block missing records runs again
    kept = [r for r in kept if r["block"] in done]
    for name, lines in (("transcripts", [json.dumps(r, ensure_ascii=False) for r in kept]),
                        ("blocks", [json.dumps(d) for d in done.values()])):
        tmp = out / f"{name}.jsonl.tmp"
        tmp.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
        os.replace(tmp, out / f"{name}.jsonl")  # atomic: a kill here loses nothing
    return done, kept, ""
