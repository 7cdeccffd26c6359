"""The per-task LiC table: single-turn (FULL) and multi-turn (SHARDED) scores per task and their ratio.

The RLSTA paper reports LiC per task (code, database, actions, math, ...) as the FULL score, the
SHARDED score and their ratio, the "LiC score". :func:`task_table` computes it from transcript
records alone (``report.json``'s ``tasks``): per task (the records' ``domain``) and scenario,
``P``, ``A90``, ``U90_10`` (0-100, per instruction over its runs, then over the task's
instructions, as ``jaxrl_mt.eval.metrics.aggregate``), the judge-free ``last_reply_accuracy``,
``ratio_to_full``, the counts, and the verifier statuses of the scored turns; ``full``,
``sharded`` and ``ratio`` repeat the paper's three numbers.

Several reports (one per model) make one table with
``python -m jaxrl_mt.eval.task_report A/report.json B/report.json``.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl_mt.data.loaders import LIC_TASKS
from jaxrl_mt.eval.metrics import METRICS, aggregate, lic_ratio, scores_by_task

__all__ = ["markdown_task_table", "plot_tasks", "shows_task_table", "task_table"]


def _scored_status(rec: Mapping[str, Any]) -> str:
    """The verifier status of the turn a conversation was scored on ("no_attempt" when none)."""
    k = rec.get("scored_turn")
    if not k:
        return "no_attempt"
    return str(rec["turns"][k - 1].get("status", "correct" if rec["turns"][k - 1].get("correct") else "wrong"))


def _scenario(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    by_task, last = scores_by_task(records)
    agg = aggregate(by_task, scale=100)
    return {
        **{m: agg[m] for m in METRICS},
        "last_reply_accuracy": aggregate(last, scale=100)["P"],
        "n_instructions": agg["n_instructions"],
        "n_runs": agg["n_runs"],
        "scored_status": dict(sorted(Counter(_scored_status(r) for r in records).items())),
    }


def _ratio(p: float | None, full: float | None) -> float | None:
    if p is None or full is None:
        return None
    r = lic_ratio(p, full)
    return None if np.isnan(r) else r


def task_table(records: Sequence[Mapping[str, Any]], scenarios: Sequence[str]) -> dict[str, Any]:
    """Per task and scenario metrics (see the module doc), tasks in LiC's order.

    Args:
      records: transcript records (``domain`` missing: math).
      scenarios: scenario kinds in report order (kinds without records for a task are left out).

    Returns:
      ``{task: {"scenarios": {kind: {...}}, "full", "sharded", "ratio", "n_instructions"}}``;
      ``full`` / ``sharded`` are P (None when the scenario was not run) and ``ratio`` is
      SHARDED / FULL (None without both, or when FULL is 0).
    """
    by: dict[str, dict[str, list[Mapping[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for rec in records:
        by[rec.get("domain") or "math"][rec["kind"]].append(rec)
    order = [t for t in LIC_TASKS if t in by] + sorted(t for t in by if t not in LIC_TASKS)
    out: dict[str, Any] = {}
    for task in order:
        scen = {k: _scenario(by[task][k]) for k in scenarios if by[task].get(k)}
        full = scen.get("full", {}).get("P")
        for s in scen.values():
            s["ratio_to_full"] = _ratio(s["P"], full)
        sharded = scen.get("sharded", {}).get("P")
        out[task] = {
            "full": full,
            "sharded": sharded,
            "ratio": _ratio(sharded, full),
            "n_instructions": len({r["task_id"] for recs in by[task].values() for r in recs}),
            "scenarios": scen,
        }
    return out


def shows_task_table(report: Mapping[str, Any]) -> bool:
    """Whether a report gets the per-task table and plot (any task other than math alone)."""
    tasks = report.get("tasks") or {}
    return bool(tasks) and list(tasks) != ["math"]


def _fmt(x: Any, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def markdown_task_table(reports: Sequence[Mapping[str, Any]]) -> str:
    """The paper-style table: one row per report (model), per task FULL, SHARDED and SHARDED / FULL."""
    tasks = [t for t in LIC_TASKS if any(t in (r.get("tasks") or {}) for r in reports)]
    tasks += sorted({t for r in reports for t in (r.get("tasks") or {})} - set(tasks))
    head = "| model | " + " | ".join(f"{t} FULL | {t} SHARDED | {t} ratio" for t in tasks) + " |"
    rows = [head, "|---|" + "---:|" * (3 * len(tasks))]
    for r in reports:
        cells = []
        for t in tasks:
            e = (r.get("tasks") or {}).get(t)
            cells += [_fmt(e["full"]), _fmt(e["sharded"]), _fmt(e["ratio"], 2)] if e else ["", "", ""]
        rows.append(f"| {r.get('model') or '?'} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def markdown_task_section(report: Mapping[str, Any]) -> list[str]:
    """The report.md lines of the per-task section (table, per-scenario detail, definitions)."""
    lines = [
        "",
        "## Per task (LiC score: SHARDED / FULL)",
        "",
        markdown_task_table([report]),
        "",
        "| task | scenario | instr. | runs | P | A90 | U90-10 | P / P(FULL) | last-reply acc. "
        "| scored turn's verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task, e in report["tasks"].items():
        for kind, s in e["scenarios"].items():
            verdicts = ", ".join(f"{k} {v}" for k, v in s["scored_status"].items())
            lines.append(
                f"| {task} | {kind} | {s['n_instructions']} | {s['n_runs']} | {_fmt(s['P'])} | "
                f"{_fmt(s['A90'])} | {_fmt(s['U90_10'])} | {_fmt(s['ratio_to_full'], 2)} | "
                f"{_fmt(s['last_reply_accuracy'])} | {verdicts} |"
            )
    lines += [
        "",
        (
            "Per task, P is averaged over that task's instructions (each over its N runs), 0-100. "
            "Scores: math, the numeric verifier; code, the HumanEval / LiveCodeBench tests in the sandbox; "
            "database, test-suite execution accuracy in SQLite; actions, BFCL's AST check."
        ),
    ]
    return lines


def plot_tasks(report: Mapping[str, Any], out_dir: Path) -> Path:
    """``p_by_task.png``: grouped bars, P per task for each scenario present."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(report["tasks"])
    kinds = [k for k in report["scenarios"] if any(k in report["tasks"][t]["scenarios"] for t in tasks)]
    width = 0.8 / max(1, len(kinds))
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(tasks) + 2), 3.5))
    for j, k in enumerate(kinds):
        p = [report["tasks"][t]["scenarios"].get(k, {}).get("P", 0.0) for t in tasks]
        ax.bar(np.arange(len(tasks)) + j * width - 0.4 + width / 2, p, width=width, label=k)
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set_ylabel("P (0-100)")
    ax.set_ylim(0, 100)
    ax.set_title(f"LiC per task ({report.get('model') or 'model'})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(out_dir) / "p_by_task.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the per-task table of several report.json files (one row each)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("reports", nargs="+", help="report.json files (one row per file)")
    a = ap.parse_args(argv)
    reports = [json.loads(Path(p).read_text(encoding="utf-8")) for p in a.reports]
    print(markdown_task_table(reports))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
