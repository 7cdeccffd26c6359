"""The LiC report: metrics per scenario from transcript records, report.json, report.md, PNG plots.

``report.html`` (``jaxrl_mt.eval.html_report``) adds a conversation browser.

Everything here is a function of the transcript records (``simulator.transcript_record``), so a
report can be rebuilt from ``transcripts.jsonl`` alone. Per scenario:

- ``P``, ``A90``, ``U90_10``: per instruction over its N runs, then averaged over instructions,
  on a 0-100 scale (``jaxrl_mt.eval.metrics.aggregate``; percentiles with
  ``np.percentile(method="linear")``);
- ``ci``: percentile-bootstrap 95% intervals of the three, resampling instructions;
- ``ratio_to_full``: the LiC ratio P(scenario) / P(FULL) (null without FULL or when P(FULL) = 0);
- ``first_answer_turn``: statistics of the 1-based turn of the first answer attempt;
- ``response_types``: per 1-based turn, the count of each judge category;
- ``last_reply_accuracy``: the judge-free cross-check, the strict verifier's accuracy of each
  conversation's last reply, averaged like P (per instruction over its runs, then over
  instructions, 0-100), and ``judge_gap`` = P - last_reply_accuracy. A gap over
  ``JUDGE_GAP_WARN`` points is listed in the report's ``warnings``: P rests on the answer-attempt
  judge, the cross-check does not, so a large gap points at the judge (or at a protocol
  difference worth reading the transcripts for).

``tasks`` holds the same per task (FULL, SHARDED, their ratio: ``jaxrl_mt.eval.task_report``);
report.md and ``p_by_task.png`` show it when the run has a task other than math.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl_mt.eval.metrics import (
    METRICS,
    PERCENTILE_METHOD,
    aggregate,
    bootstrap_ci,
    first_answer_turn_stats,
    instruction_metrics,
    lic_ratio,
    scores_by_task,
)
from jaxrl_mt.eval.task_report import (
    markdown_task_section,
    plot_tasks,
    shows_task_table,
    task_table,
)
from jaxrl_mt.rewards.judge import RESPONSE_TYPES

__all__ = ["PERCENTILE_NOTE", "build_report", "markdown_report", "scenario_report", "write_report"]

PERCENTILE_NOTE = (f"A90 and U90-10 use numpy.percentile(method='{PERCENTILE_METHOD}') (linear interpolation: "
                   "the q-th percentile of N sorted scores sits at position q/100*(N-1)); per instruction over "
                   "its N runs, then averaged over instructions; 0-100 scale.")
CI_LEVEL = 0.95
JUDGE_GAP_WARN = 10.0  # points of |P - last-reply accuracy| above which the report warns


def _clean(x: Any) -> Any:
    """JSON-safe copy: NaN/inf -> None, numpy scalars -> Python, int keys -> str."""
    if isinstance(x, Mapping):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return None if not math.isfinite(float(x)) else float(x)
    if isinstance(x, np.integer):
        return int(x)
    return x


def scenario_report(records: Sequence[Mapping[str, Any]], *, n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Metrics of one scenario's transcript records (see the module docstring)."""
    by_task, last_by_task = scores_by_task(records)
    agg = aggregate(by_task, scale=100)
    last_acc = aggregate(last_by_task, scale=100)["P"]
    ci = {m: list(bootstrap_ci(by_task, m, n_boot=n_boot, alpha=1 - CI_LEVEL, seed=seed, scale=100))
          for m in METRICS}
    types: dict[int, Counter] = defaultdict(Counter)
    for rec in records:
        for k, t in enumerate(rec["turns"]):
            types[k + 1][t.get("label", "unknown")] += 1
    per_instruction = {t: {"scores": s, **instruction_metrics(s, scale=100)} for t, s in by_task.items()}
    return {
        **{m: agg[m] for m in METRICS},
        "ci": ci,
        "last_reply_accuracy": last_acc,
        "judge_gap": agg["P"] - last_acc,
        "n_instructions": agg["n_instructions"],
        "n_runs": agg["n_runs"],
        "first_answer_turn": first_answer_turn_stats([rec["first_answer_turn"] for rec in records]),
        "response_types": {k: {lab: c[lab] for lab in (*RESPONSE_TYPES, "unknown") if c[lab]}
                           for k, c in sorted(types.items())},
        "stop_reasons": dict(Counter(rec["stop_reason"] for rec in records)),
        "mean_turns": float(np.mean([rec["n_turns"] for rec in records])),
        "per_instruction": per_instruction,
    }


def build_report(records: Sequence[Mapping[str, Any]], *, scenarios: Sequence[str], protocol: str,
                 n_boot: int = 1000, seed: int = 0, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The whole report (JSON-ready: NaN written as null).

    Args:
      records: transcript records of every conversation.
      scenarios: scenario kinds in report order (kinds without records are listed as missing).
      protocol: the scoring protocol the records were scored with.
      n_boot: bootstrap replicates of the confidence intervals.
      seed: bootstrap seed.
      extra: added at the top level (config, model, timings, ...).
    """
    by_kind: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for rec in records:
        by_kind[rec["kind"]].append(rec)
    out: dict[str, Any] = {"protocol": protocol, "scale": "0-100", "percentile_method": PERCENTILE_METHOD,
                           "metrics_note": PERCENTILE_NOTE, "ci_level": CI_LEVEL, "n_bootstrap": n_boot,
                           "n_conversations": len(records), "scenarios": {}, "missing_scenarios": []}
    for kind in scenarios:
        if by_kind.get(kind):
            out["scenarios"][kind] = scenario_report(by_kind[kind], n_boot=n_boot, seed=seed)
        else:
            out["missing_scenarios"].append(kind)
    full = out["scenarios"].get("full")
    out["warnings"] = []
    for kind, s in out["scenarios"].items():
        s["ratio_to_full"] = lic_ratio(s["P"], full["P"]) if full else None
        if abs(s["judge_gap"]) > JUDGE_GAP_WARN:
            out["warnings"].append(
                f"{kind}: P = {s['P']:.1f} but the judge-free last-reply accuracy is "
                f"{s['last_reply_accuracy']:.1f} ({s['judge_gap']:+.1f} points, more than {JUDGE_GAP_WARN:g}): "
                "check the answer-attempt judge's labels in the transcripts")
    out["tasks"] = task_table(records, scenarios)
    if extra:
        out.update(extra)
    return _clean(out)


def _fmt(x: Any, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def markdown_report(report: Mapping[str, Any]) -> str:
    """A markdown summary: one table row per scenario, then the metric definitions."""
    head = ("| scenario | instr. | runs | P | P 95% CI | A90 | U90-10 | P / P(FULL) | first answer turn (mean) "
            "| never answered | last-reply acc. (judge-free) |")
    rows = [f"# LiC evaluation ({report['protocol']} protocol)", ""]
    if report.get("model"):
        rows += [f"Model: `{report['model']}`", ""]
    rows += [head, "|" + "---|" * 11]
    for kind, s in report["scenarios"].items():
        fa = s["first_answer_turn"]
        ci = s["ci"]["P"]
        rows.append(f"| {kind} | {s['n_instructions']} | {s['n_runs']} | {_fmt(s['P'])} | "
                    f"[{_fmt(ci[0])}, {_fmt(ci[1])}] | {_fmt(s['A90'])} | {_fmt(s['U90_10'])} | "
                    f"{_fmt(s['ratio_to_full'], 2)} | {_fmt(fa['mean'], 2)} | {_fmt(fa['frac_never'], 2)} | "
                    f"{_fmt(s.get('last_reply_accuracy'))} |")
    for w in report.get("warnings") or []:
        rows += ["", f"**Warning**: {w}"]
    if report.get("missing_scenarios"):
        rows += ["", f"No conversations for: {', '.join(report['missing_scenarios'])}."]
    rows += ["", PERCENTILE_NOTE,
             f"Confidence intervals: percentile bootstrap over instructions, {report['n_bootstrap']} replicates.",
             "Scoring: " + ("`lic`: each run scores its last answer attempt (the conversation stops at the first "
                            "correct one); no attempt scores 0." if report["protocol"] == "lic" else
                            "`final_turn`: each run scores its last turn only."),
             ("Last-reply accuracy: the strict verifier on each conversation's last reply, averaged like P; it "
              "does not use the answer-attempt judge."), ""]
    if shows_task_table(report):
        rows[-1:-1] = markdown_task_section(report)
    return "\n".join(rows)


def _plots(report: Mapping[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scen = report["scenarios"]
    kinds = list(scen)
    paths = []
    if not kinds:
        return paths
    # P by scenario, with the bootstrap CI as error bars.
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(kinds) + 2), 3.5))
    p = np.array([scen[k]["P"] for k in kinds])
    lo = np.array([scen[k]["ci"]["P"][0] for k in kinds])
    hi = np.array([scen[k]["ci"]["P"][1] for k in kinds])
    ax.bar(kinds, p, color="tab:blue", yerr=np.stack([p - lo, hi - p]), capsize=3)
    ax.set_ylabel("P (0-100)")
    ax.set_ylim(0, 100)
    ax.set_title(f"Performance by scenario ({report['protocol']}, {int(CI_LEVEL * 100)}% CI)")
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    paths.append(out_dir / "p_by_scenario.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    # Aptitude against unreliability.
    fig, ax = plt.subplots(figsize=(4.5, 4))
    for k in kinds:
        ax.scatter(scen[k]["U90_10"], scen[k]["A90"], s=30)
        ax.annotate(k, (scen[k]["U90_10"], scen[k]["A90"]), fontsize=8, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("unreliability U90-10")
    ax.set_ylabel("aptitude A90")
    ax.set_xlim(-5, 105)
    ax.set_ylim(-5, 105)
    ax.set_title("Aptitude vs unreliability")
    fig.tight_layout()
    paths.append(out_dir / "aptitude_unreliability.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    # First-answer-turn histogram (fraction of conversations; "never" as the last bin).
    max_turn = max([int(t) for k in kinds for t in scen[k]["first_answer_turn"]["histogram"]] or [1])
    bins = list(range(1, max_turn + 1))
    width = 0.8 / len(kinds)
    fig, ax = plt.subplots(figsize=(max(5, 0.6 * (max_turn + 1) + 2), 3.5))
    for j, k in enumerate(kinds):
        fa = scen[k]["first_answer_turn"]
        n = fa["n"]
        frac = [fa["histogram"].get(str(t), 0) / n for t in bins] + [fa["frac_never"]]
        ax.bar(np.arange(len(bins) + 1) + j * width - 0.4 + width / 2, frac, width=width, label=k)
    ax.set_xticks(range(len(bins) + 1), [str(b) for b in bins] + ["never"])
    ax.set_xlabel("turn of the first answer attempt")
    ax.set_ylabel("fraction of conversations")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    paths.append(out_dir / "first_answer_turn.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths


def write_report(report: Mapping[str, Any], out_dir: str | Path, *, plots: bool = True,
                 records: Sequence[Mapping[str, Any]] = ()) -> dict[str, Path]:
    """Writes ``report.json``, ``report.md``, (optionally) the PNG plots and ``report.html`` into ``out_dir``.

    Args:
      report: ``build_report``'s report.
      out_dir: the folder.
      plots: write the PNG plots (they are inlined in report.html too).
      records: the transcript records, for report.html's conversation browser.

    Returns:
      Name -> path of every file written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {"report.json": out / "report.json", "report.md": out / "report.md"}
    files["report.json"].write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    files["report.md"].write_text(markdown_report(report), encoding="utf-8")
    if plots:
        for p in _plots(report, out) + ([plot_tasks(report, out)] if shows_task_table(report) else []):
            files[p.name] = p
    from jaxrl_mt.eval.html_report import write_html_report

    files["report.html"] = write_html_report(report, records, out, [p for p in files.values() if p.suffix == ".png"])
    return files
