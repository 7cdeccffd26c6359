"""Calibration: single-turn (FULL) vs multi-turn (MT-Add, MT-Refine) strict accuracy of problem families.

    python -m experiments.calibrate --out /tmp/calib \\
        --families train1=family:train:48:1,heldout1=family:heldout:48:1 --temps 0,1 --max-new-tokens 64

Each family is a LABEL=SOURCE_SPEC pair (``jaxrl_mt.data.load_source``). For every temperature the
base model answers FULL, SHARDED (MT-Add) and MT-Refine conversations of every problem through
``jaxrl_mt.evaluate`` (``final_turn`` protocol, one run per problem and scenario; ``--runs K``: K
runs at T > 0), into ``OUT/T<temp>/``; the accuracy of each family and scenario is the strict (and
lenient) verifier on the last reply, recomputed from the transcripts. With K > 1 runs the tables add
the share of problems with at least one correct run (pass@K: what the latent-capability filter's k
samples and GRPO's groups need) and the filter's keep rule (FULL accuracy > multi-turn accuracy).
Writes ``OUT/calibration.json`` and ``OUT/calibration.md``; ``--recompute`` rebuilds both from the transcripts alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from experiments.analysis import bootstrap_mean, last_reply_scores
from experiments.common import eval_config, load_records, write_json

SCENARIOS = ("full", "sharded", "mt_refine")


def parse_families(text: str) -> dict[str, str]:
    """``"a=spec1,b=spec2"`` -> ``{"a": "spec1", "b": "spec2"}`` (specs may hold ':' but not ',')."""
    out = {}
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        label, sep, spec = part.partition("=")
        if not sep or not label or not spec:
            raise SystemExit(f"--families: expected LABEL=SOURCE_SPEC, got {part!r}")
        out[label] = spec
    return out


def any_correct(scores: dict[str, float]) -> dict[str, float]:
    """Per task: 1.0 when at least one of its runs was correct (its mean score is > 0), else 0.0."""
    return {t: float(v > 0) for t, v in scores.items()}


def more_correct(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """Per task both hold: 1.0 when ``a``'s mean score beats ``b``'s (the latent-capability filter's
    keep rule, single-turn accuracy > multi-turn accuracy), else 0.0."""
    return {t: float(a[t] > b[t]) for t in sorted(set(a) & set(b))}


def runs_per_task(records: list[dict[str, Any]], kind: str, keep: Any) -> int:
    """The largest number of ``kind`` conversations of one task among ``records`` (0 when none)."""
    counts: dict[str, int] = {}
    for r in records:
        if r["kind"] == kind and keep(r["task_id"]):
            counts[r["task_id"]] = counts.get(r["task_id"], 0) + 1
    return max(counts.values(), default=0)


def cut_shares(records: list[dict[str, Any]], kind: str, keep: Any, budgets: list[int]) -> dict[str, Any] | None:
    """The last replies of ``kind``: how many, their median length in new tokens, the share the run's
    reply budget cut (``finish_reason == "length"``) and, for each smaller budget B, the share of at
    least B tokens (the share B would cut; exact for greedy replies, whose first B tokens do not
    depend on the budget). None when no reply records its length."""
    lengths, cut = [], []
    for r in records:
        if r["kind"] != kind or not keep(r["task_id"]) or not r["turns"]:
            continue
        last = r["turns"][-1]
        if last.get("new_tokens") is None:
            continue
        lengths.append(int(last["new_tokens"]))
        cut.append(last.get("finish_reason") == "length")
    if not lengths:
        return None
    n = len(lengths)
    return {"n": n, "median_tokens": float(sorted(lengths)[n // 2]), "cut": sum(cut) / n,
            "cut_at": {str(b): sum(x >= b for x in lengths) / n for b in budgets}}


def summarize(out: Path, families: dict[str, str], temps: list[float], budgets: list[int] = ()) -> dict[str, Any]:
    """Per temperature, family and scenario: strict and lenient accuracy of the last reply, and the
    reply budget's cut share (`cut_shares`, ``<kind>_cut``; at each of ``budgets`` too).

    With several runs per problem (sampled temperatures), also ``<kind>_strict_any`` (share of
    problems with at least one correct run: pass@k, k = ``runs``) and ``full_gt_<kind>`` (share of
    problems whose single-turn accuracy over the k runs beats their multi-turn accuracy).
    """
    from jaxrl_mt.data.loaders import load_source

    ids = {label: {t.task_id for t in load_source(spec)} for label, spec in families.items()}
    table: dict[str, Any] = {}
    for temp in temps:
        recs = load_records(out / f"T{temp:g}")
        for label, tids in ids.items():
            row: dict[str, Any] = {"runs": runs_per_task(recs, "full", tids.__contains__)}
            strict = {}
            for kind in SCENARIOS:
                for mode in ("strict", "lenient"):
                    s = last_reply_scores(recs, kind, mode, keep=tids.__contains__)
                    row[f"{kind}_{mode}"] = bootstrap_mean(s) if s else None
                    if mode == "strict":
                        strict[kind] = s
                        row[f"{kind}_strict_any"] = bootstrap_mean(any_correct(s)) if s else None
            for kind in SCENARIOS:
                row[f"{kind}_cut"] = cut_shares(recs, kind, tids.__contains__, list(budgets))
            for kind in SCENARIOS[1:]:
                both = strict["full"] and strict[kind]
                row[f"full_gt_{kind}"] = bootstrap_mean(more_correct(strict["full"], strict[kind])) if both else None
            table[f"T{temp:g}/{label}"] = row
    return {"families": families, "temps": temps, "table": table}


def stored_settings(workdir: Path) -> dict[str, Any]:
    """Model, reply budget and system prompt an evaluation folder was run with (its ``eval_config.json``),
    so a ``--recompute`` reports the setting of the transcripts, not of its own flags; {} when absent."""
    path = workdir / "eval_config.json"
    if not path.is_file():
        return {}
    c = json.loads(path.read_text(encoding="utf-8"))
    return {k: c.get(k) for k in ("model", "max_new_tokens", "system_prompt")}


def _ci(x: Any) -> str:
    """``mean [lo, hi]`` in % of a bootstrap_mean result, "-" for None."""
    return "-" if x is None else f"{100 * x['mean']:.0f} [{100 * x['lo']:.0f}, {100 * x['hi']:.0f}]"


def markdown(summary: dict[str, Any], command: str) -> str:
    """The calibration table (strict accuracy with 95% CI, lenient in parentheses, n problems) and,
    for rows with several runs per problem, the pass@k table."""
    def cell(x: Any, y: Any) -> str:
        return "-" if x is None else f"{_ci(x)} ({100 * y['mean']:.0f})"

    lines = ["| T | family | n | runs | FULL | MT-Add | MT-Refine | MT-Add / FULL |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    multi = []
    for key, row in summary["table"].items():
        temp, label = key.split("/", 1)
        f, a = row["full_strict"], row["sharded_strict"]
        ratio = "-" if not f or not a or f["mean"] == 0 else f"{a['mean'] / f['mean']:.2f}"
        lines.append(f"| {temp[1:]} | {label} | {f['n'] if f else 0} | {row.get('runs', 1)} | "
                     f"{cell(f, row['full_lenient'])} | {cell(a, row['sharded_lenient'])} | "
                     f"{cell(row['mt_refine_strict'], row['mt_refine_lenient'])} | {ratio} |")
        if row.get("runs", 1) > 1:
            multi.append(f"| {temp[1:]} | {label} | {f['n'] if f else 0} | {row['runs']} | "
                         + " | ".join(_ci(row.get(k)) for k in ("full_strict_any", "sharded_strict_any",
                                                                  "mt_refine_strict_any", "full_gt_sharded",
                                                                  "full_gt_mt_refine")) + " |")
    cuts = [(key, kind, row[f"{kind}_cut"]) for key, row in summary["table"].items() for kind in SCENARIOS
            if row.get(f"{kind}_cut")]
    budgets = list(cuts[0][2]["cut_at"]) if cuts else []
    cut_lines: list[str] = []
    if cuts:
        cut_lines += ["Last replies: median length (new tokens), share cut by the run's budget, and share of at least "
                  "B tokens (what budget B would cut; exact for greedy replies), in %.", "",
                  "| T | family | scenario | n | median tokens | cut | " + " | ".join(f"≥ {b}" for b in budgets)
                  + " |", "|---|---|---|---:|---:|---:|" + "---:|" * len(budgets)]
        for key, kind, c in cuts:
            temp, label = key.split("/", 1)
            cut_lines.append(f"| {temp[1:]} | {label} | {kind} | {c['n']} | {c['median_tokens']:.0f} | "
                         f"{100 * c['cut']:.1f} | " + " | ".join(f"{100 * c['cut_at'][b]:.1f}" for b in budgets)
                         + " |")
        cut_lines.append("")
    src = ", ".join(f"`{k}` = `{v}`" for k, v in summary["families"].items())
    parts = ["Strict accuracy of the last reply in %, 95% bootstrap CI over problems in brackets (lenient "
             "in parentheses); with several runs, the mean over a problem's runs.", "", *lines, ""]
    if multi:
        parts += ["Several runs per problem: share of problems (%) with at least one strictly correct run "
                  "(pass@k, k = runs), and share whose FULL accuracy over the runs beats MT-Add's / "
                  "MT-Refine's (the latent-capability filter's keep rule).", "",
                  "| T | family | n | k | FULL pass@k | MT-Add pass@k | MT-Refine pass@k | FULL > MT-Add | "
                  "FULL > MT-Refine |", "|---|---|---:|---:|---:|---:|---:|---:|---:|", *multi, ""]
    return "\n".join([*parts, *cut_lines, f"Families: {src}.", "", f"Command: `{command}`", ""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--families", default="train1=family:train:48:1,heldout1=family:heldout:48:1")
    ap.add_argument("--temps", default="0,1", help="comma-separated sampling temperatures")
    ap.add_argument("--model", default="builtin:smollm2-135m-instruct")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--system", default="", help="system prompt ('' = the template's default)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--runs", type=int, default=1,
                    help="conversations per problem and scenario at T > 0 (T = 0 always 1): pass@k, k = runs")
    ap.add_argument("--budgets", default="",
                    help="comma-separated smaller reply budgets whose cut share to report (from the reply lengths)")
    ap.add_argument("--recompute", action="store_true", help="only rebuild the summary from the transcripts")
    a = ap.parse_args(argv)
    out = Path(a.out)
    families = parse_families(a.families)
    temps = [float(t) for t in a.temps.split(",")]
    if a.runs < 1:
        raise SystemExit(f"--runs must be >= 1, got {a.runs}")
    if not a.recompute:
        from jaxrl_mt.evaluate import evaluate, load_eval_model

        model = load_eval_model(a.model)
        for temp in temps:
            cfg = eval_config(model=a.model, dataset=tuple(families.values()), limit=0, scenarios=a.scenarios,
                              runs=a.runs if temp > 0 else 1, temperature=temp, max_new_tokens=a.max_new_tokens,
                              protocol="final_turn",
                              system_prompt=a.system, max_batch=a.max_batch, workdir=str(out / f"T{temp:g}"),
                              plots=False, bootstrap=200, reuse_cache=True)  # exact; W caches in flight
            evaluate(cfg, model=model)
    budgets = [int(b) for b in a.budgets.split(",") if b.strip()]
    summary = summarize(out, families, temps, budgets)
    summary["settings"] = {f"T{t:g}": stored_settings(out / f"T{t:g}") or {
        "model": a.model, "max_new_tokens": a.max_new_tokens, "system_prompt": a.system} for t in temps}
    write_json(out / "calibration.json", summary)
    md = markdown(summary, "python -m experiments.calibrate " + " ".join(
        f"'{x}'" if " " in x else x for x in (argv if argv is not None else sys.argv[1:])))
    (out / "calibration.md").write_text(md, encoding="utf-8")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
