"""Does a second evaluation of a model reproduce the first one exactly?

``python -m experiments.exp2 reproduce --arms rlsta_s0`` evaluates a committed adapter again (greedy,
the report's held-out set, budget and system prompt) into a separate folder; ``same_evaluation``
then compares the two evaluation folders: every conversation's record (the replies, token counts,
labels and scores) and the per-scenario numbers: the two ``report.md`` files (committed with the
transcripts) and, where both folders still have one, the two ``report.json`` files (git-ignored: a
new checkout has none for an evaluation made in an earlier one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from experiments.common import load_records

__all__ = ["same_evaluation", "summary"]


def _numbers(folder: Path) -> dict[str, Any]:
    """An evaluation's per-scenario numbers: ``report.md``'s text and ``report.json``'s ``scenarios`` (None
    when the folder has no ``report.json``).

    Raises:
      FileNotFoundError: the folder has no ``report.md``.
    """
    md = folder / "report.md"
    if not md.is_file():
        raise FileNotFoundError(f"{md}: no report.md: not an evaluation folder")
    js = folder / "report.json"
    return {"md": md.read_text(encoding="utf-8"),
            "json": json.loads(js.read_text(encoding="utf-8"))["scenarios"] if js.is_file() else None}


def same_evaluation(ref: Path, new: Path) -> dict[str, Any]:
    """Compares two evaluation folders (``transcripts.jsonl[.gz]``, ``report.md`` and, if any,
    ``report.json`` each).

    Returns:
      ``{"n_ref", "n_new", "n_identical", "different": [conv_id, ...] (first 10), "missing": [...]
      (in one folder only, first 10), "scenarios_identical": bool, "identical": bool}``;
      ``scenarios_identical`` is the two ``report.md`` equal and, where both folders have a
      ``report.json``, their ``scenarios`` equal; ``identical`` is that and every conversation's record
      equal.
    """
    a = {r["conv_id"]: r for r in load_records(ref)}
    b = {r["conv_id"]: r for r in load_records(new)}
    common = sorted(set(a) & set(b))
    different = [c for c in common if a[c] != b[c]]
    missing = sorted(set(a) ^ set(b))
    x, y = _numbers(ref), _numbers(new)
    scen = x["md"] == y["md"] and (x["json"] is None or y["json"] is None or x["json"] == y["json"])
    return {"n_ref": len(a), "n_new": len(b), "n_identical": len(common) - len(different),
            "different": different[:10], "missing": missing[:10], "scenarios_identical": scen,
            "identical": not different and not missing and scen}


def summary(name: str, res: dict[str, Any], ref: Path, new: Path) -> str:
    """One line per finding, for the terminal and the closing note."""
    lines = [f"{name}: {res['n_identical']}/{res['n_ref']} conversations identical ({ref} vs {new}); "
             f"per-scenario numbers {'identical' if res['scenarios_identical'] else 'DIFFERENT'}"]
    if res["different"]:
        lines.append(f"  different records (first 10): {', '.join(res['different'])}")
    if res["missing"]:
        lines.append(f"  in one evaluation only (first 10): {', '.join(res['missing'])}")
    lines.append("  reproduced exactly" if res["identical"] else "  NOT reproduced")
    return "\n".join(lines)
