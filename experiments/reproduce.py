"""Does a second evaluation of a model reproduce the first one exactly?

``python -m experiments.exp2 reproduce --arms rlsta_s0`` evaluates a committed adapter again (greedy,
the report's held-out set, budget and system prompt) into a separate folder; ``same_evaluation``
then compares the two evaluation folders: every conversation's record (the replies, token counts,
labels and scores) and the per-scenario numbers of the two ``report.json`` files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from experiments.common import load_records

__all__ = ["same_evaluation", "summary"]


def _scenarios(folder: Path) -> dict[str, Any]:
    """The per-scenario numbers of an evaluation's ``report.json`` (P, A90, U90-10, CIs, response types...)."""
    return json.loads((folder / "report.json").read_text())["scenarios"]


def same_evaluation(ref: Path, new: Path) -> dict[str, Any]:
    """Compares two evaluation folders (``transcripts.jsonl[.gz]`` and ``report.json`` each).

    Returns:
      ``{"n_ref", "n_new", "n_identical", "different": [conv_id, ...] (first 10), "missing": [...]
      (in one folder only, first 10), "scenarios_identical": bool, "identical": bool}``; ``identical``
      is every conversation's record and every scenario's numbers equal.
    """
    a = {r["conv_id"]: r for r in load_records(ref)}
    b = {r["conv_id"]: r for r in load_records(new)}
    common = sorted(set(a) & set(b))
    different = [c for c in common if a[c] != b[c]]
    missing = sorted(set(a) ^ set(b))
    scen = _scenarios(ref) == _scenarios(new)
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
