"""The comparison report as markdown (every number taken from the report dict)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from experiments.cells import diff as _diff
from experiments.cells import pct as _pct
from experiments.cells import ratio as _ratio
from experiments.common import DYNAMICS_KEYS, GREEDY_KINDS, KIND_NAMES, ROOT, TABLE_KINDS
from experiments.markdown_behaviour import behaviour
from experiments.plots import dynamics_keys

__all__ = ["render"]


def _accuracy(report: dict[str, Any]) -> list[str]:
    kinds = list(TABLE_KINDS)
    out = [
        "## Held-out accuracy (greedy, strict verifier on the last reply)",
        "",
        "| model | "
        + " | ".join(KIND_NAMES[k] for k in kinds)
        + " | MT-Add / FULL | MT-Refine / FULL | multi / FULL |",
        "|---|" + "---:|" * (len(kinds) + 3),
    ]
    for n, m in report["models"].items():
        r = m["strict"]["ratio"]
        out.append(
            f"| {n} | "
            + " | ".join(_pct(m["strict"][k]) for k in kinds)
            + f" | {_ratio(r['sharded'])} | {_ratio(r['mt_refine'])} | {_ratio(r['multi'])} |"
        )
    recap = [m["name"] for m in report["manifest"]["models"] if m.get("recap")]
    if recap:
        out += ["", f"{', '.join(recap)}: LiC's RECAP in the MT-Add column (MT-Add's turns, then one that recaps "
                    "every shard; no MT-Refine), so its differences there are RECAP against MT-Add."]
    out += [
        "",
        "Lenient verifier (any of the last three numbers), for comparison:",
        "",
        "| model | " + " | ".join(KIND_NAMES[k] for k in kinds) + " |",
        "|---|" + "---:|" * len(kinds),
    ]
    for n, m in report["models"].items():
        out.append(f"| {n} | " + " | ".join(_pct(m["lenient"][k]) for k in kinds) + " |")
    fams = sorted({f for m in report["models"].values() for f in m["families"]})
    out += [
        "",
        "Per problem family (strict):",
        "",
        "| model | family | n | FULL | MT-Add | MT-Refine |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for n, m in report["models"].items():
        for f in fams:
            c = m["families"].get(f)
            if c:
                out.append(
                    f"| {n} | {f} | {c['full']['n']} | {_pct(c['full'])} | {_pct(c['sharded'])} | "
                    f"{_pct(c['mt_refine'])} |"
                )
    return out


def _uncut(report: dict[str, Any]) -> list[str]:
    """Per scenario: the share of last replies the reply budget cut, and the accuracy of the others."""
    out = [
        f"Cut by the {report['manifest']['max_new_tokens']}-token reply budget (last reply; greedy) and strict "
        "accuracy of the conversations whose last reply was not cut (n = their problems):",
        "",
        "| model | " + " | ".join(f"{KIND_NAMES[k]} cut | {KIND_NAMES[k]} acc. uncut | n" for k in GREEDY_KINDS) + " |",
        "|---|" + "---:|---:|---:|" * len(GREEDY_KINDS),
    ]
    for n, m in report["models"].items():
        if m.get("uncut_strict"):
            out.append(f"| {n} | " + " | ".join(
                f"{_pct(m['final_reply'][k]['cut'])} | {_pct(m['uncut_strict'][k])} | {m['uncut_strict'][k]['n']}"
                for k in GREEDY_KINDS) + " |")
    return out


def _pairs(report: dict[str, Any]) -> list[str]:
    kinds = list(TABLE_KINDS)
    out = [
        "## Paired differences (percentage points, 95% paired bootstrap CI; * = excludes 0)",
        "",
        "| difference | " + " | ".join(KIND_NAMES[k] for k in kinds) + " |",
        "|---|" + "---:|" * len(kinds),
    ]
    for name, p in report["pairs"].items():
        out.append(f"| {name} | " + " | ".join(_diff(p[k]) for k in kinds) + " |")
    return out


def _lic(report: dict[str, Any]) -> list[str]:
    rows = [(n, k, s) for n, m in report["models"].items() for k, s in m.get("lic", {}).items()]
    if not rows:
        return []
    out = [
        "## LiC metrics (T = 1, N runs per problem, `lic` protocol, rule-based answer-attempt judge)",
        "",
        "| model | scenario | problems | runs | P [95% CI] | A90 | U90-10 | P / P(FULL) | last-reply strict acc |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, k, s in rows:
        ci = s["ci"]["P"]
        ratio = "-" if s["ratio_to_full"] is None else f"{s['ratio_to_full']:.2f}"
        out.append(
            f"| {n} | {KIND_NAMES.get(k, k)} | {s['n_instructions']} | {s['n_runs']} | {s['P']:.1f} "
            f"[{ci[0]:.1f}, {ci[1]:.1f}] | {s['A90']:.1f} | {s['U90_10']:.1f} | {ratio} | "
            f"{_pct(s['last_reply_strict'])} |"
        )
    return out + [""] + _pass_k(rows)


def _pass_k(rows: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    """pass@k and pass^k of the LiC runs (unbiased estimators per problem, then the mean over problems)."""
    ks = sorted({int(j) for _, _, s in rows for j in s.get("pass@k", {})})
    if not ks:
        return []
    out = [
        "pass@k (at least one of k runs right) and pass^k (all k runs right), % of problems: the unbiased "
        "estimators from the N runs of each problem (a run is right when the strict verifier accepts its last "
        "reply, so k = 1 is the last-reply accuracy), averaged over problems; 95% CIs in `report.json`.",
        "",
        "| model | scenario | " + " | ".join(f"pass@{j} / pass^{j}" for j in ks) + " |",
        "|---|---|" + "---:|" * len(ks),
    ]
    for n, k, s in rows:
        cells = []
        for j in map(str, ks):
            at, hat = s.get("pass@k", {}).get(j), s.get("pass^k", {}).get(j)
            ok = at is not None and at["mean"] is not None
            cells.append(f"{100 * at['mean']:.1f} / {100 * hat['mean']:.1f}" if ok else "-")
        out.append(f"| {n} | {KIND_NAMES.get(k, k)} | " + " | ".join(cells) + " |")
    return out


def _seeds(report: dict[str, Any]) -> list[str]:
    """The arms of several seeds: mean over seeds [two-level CI], sd over seeds, each seed; differences."""
    seeds = report.get("seeds")
    if not seeds:
        return []
    kinds = list(TABLE_KINDS)
    head = " | ".join(KIND_NAMES[k] for k in kinds)
    out = [
        "## Seeds (strict, greedy; 95% two-level bootstrap CI: seeds and problems resampled)",
        "",
        "An arm's value is the mean over its seeds (`<arm>_s<N>` models) of each seed's accuracy; sd = the standard "
        "deviation over seeds.",
        "",
        f"| arm | statistic | {head} |",
        "|---|---|" + "---:|" * len(kinds),
    ]
    for arm, g in seeds["groups"].items():
        c = g["strict"]
        out.append(f"| {arm}_s* | mean of {len(g['models'])} | " + " | ".join(_pct(c[k]) for k in kinds) + " |")
        out.append(f"| {arm}_s* | sd over seeds | "
                   + " | ".join("-" if c[k]["std"] is None else f"{100 * c[k]['std']:.1f}" for k in kinds) + " |")
        for m in g["models"]:
            out.append(f"| {arm}_s* | {m} | "
                       + " | ".join("-" if m not in c[k]["seeds"] else f"{100 * c[k]['seeds'][m]:.1f}"
                                    for k in kinds) + " |")
    out += [
        "",
        "Differences (percentage points; paired by problem, each side's seeds resampled; * = excludes 0):",
        "",
        f"| difference | {head} |",
        "|---|" + "---:|" * len(kinds),
    ]
    for name, p in seeds["pairs"].items():
        out.append(f"| {name} | " + " | ".join(_diff(p[k]) for k in kinds) + " |")
    return out


def _code(code: dict[str, Any] | None) -> str:
    """A code version (`provenance.code_version`) in words."""
    if not code:
        return "not recorded"
    dirty = code.get("dirty") or []
    return f"commit {code['commit'][:12]}" + (f", changed files {', '.join(dirty)}" if dirty else "")


def _evaluated_on(report: dict[str, Any]) -> list[str]:
    """Which code wrote each model's evaluations (``code.json`` per evaluation folder)."""
    if not report.get("code"):
        return []
    out = ["Code that wrote each evaluation (`models/<name>/<evaluation>/code.json`; a resumed evaluation "
           "lists every invocation with the conversations already on disk when it started):", ""]
    notes: list[str] = []
    greedy_only = set(report.get("manifest", {}).get("greedy_only") or [])
    for name, subs in report.get("code", {}).items():
        parts = []
        for sub, entries in subs.items():
            if not entries:
                parts.append(f"{sub} not run (--greedy-only)" if sub == "lic" and name in greedy_only
                             else f"{sub} not recorded")
                continue
            steps = [_code(e["code"]) + (f", decode engine {e['engine']}" if "engine" in e else "")
                     + (f" (from conversation {e['conversations_on_disk']})"
                                         if e.get("conversations_on_disk") else "")
                     + (f", {e['n_generated']} conversations in {e['seconds']:.0f} s" if "seconds" in e else
                        f", killed after {e['seconds_to_last_write']:.0f} s (to its last write)"
                        if "seconds_to_last_write" in e else "")
                     for e in entries]
            note = entries[0].get("note")
            if note and note not in notes:
                notes.append(note)
            mark = f" [{notes.index(note) + 1}]" if note else ""
            parts.append(f"{sub} {'; then '.join(steps)}{mark}")
        out.append(f"- {name}: " + "; ".join(parts))
    if notes:
        out += [""] + [f"[{i}] {n}" for i, n in enumerate(notes, 1)]
    return out


def _seconds(entry: dict[str, Any]) -> float | None:
    """An evaluation invocation's wall time: measured, or (killed) to its last write; None: not timed."""
    return entry.get("seconds", entry.get("seconds_to_last_write"))


def _compute(report: dict[str, Any]) -> list[str]:
    """The comparison's total compute: training wall time (``run_info.json``, every invocation) and the
    evaluations' (``code.json``). An invocation killed before it ended is counted to its last write and
    listed; one that left no time (killed before the code recorded starts) is listed as not timed."""
    runs = report.get("runs", {})
    train = {n: r.get("info", {}).get("wall_s") for n, r in runs.items()}
    entries = {f"{n}/{sub}": en for n, subs in report.get("code", {}).items() for sub, en in subs.items() if en}
    evals = {k: sum(_seconds(e) or 0.0 for e in en) for k, en in entries.items()
             if any(_seconds(e) is not None for e in en)}
    if not any(train.values()) and not evals:
        return []
    t, e = sum(v for v in train.values() if v), sum(evals.values())
    untimed = [n for n, v in train.items() if not v] + [k for k, en in entries.items()
                                                        if any(_seconds(x) is None for x in en)]
    killed = [n for n, r in runs.items() if any(i.get("killed") for i in r.get("info", {}).get("invocations", []))] \
        + [k for k, en in entries.items() if any("seconds" not in x and _seconds(x) is not None for x in en)]
    parts = ([f"training {t / 3600:.2f} h ({sum(1 for v in train.values() if v)} runs)"] if t else []) + \
        ([f"evaluation {e / 3600:.2f} h ({len(evals)} evaluations)"] if evals else [])
    return ["Total compute: " + ", ".join(parts) + (f", {(t + e) / 3600:.2f} h in all" if len(parts) == 2 else "")
            + " (wall time: each run's `run_info.json`, each evaluation's `code.json`)"
            + (f"; killed and resumed, timed to the last write before the kill: {', '.join(killed)}" if killed else "")
            + (f"; not timed (or an invocation of it): {', '.join(untimed)}" if untimed else "") + "."]


def _runs(report: dict[str, Any]) -> list[str]:
    runs = report.get("runs", {})
    if not runs:
        return []
    out = [
        "## Training runs",
        "",
        "| run | method | alpha | steps | B x G | lr | T | kept histories | wall (min) | "
        "peak RSS (GB) | load avg | reward first -> last | probe multi-turn first -> last |",
        "|---|---|---:|---:|---|---:|---:|---|---:|---:|---:|---|---|",
    ]
    for n, r in runs.items():
        c, info, flt = r.get("config", {}), r.get("info", {}), r.get("filter", {})
        kept = f"{flt.get('n_kept', '-')}/{flt.get('n_items', '-')}" if flt else "-"
        cur = r["curves"]

        def fl(k: str, cur: dict[str, Any] = cur) -> str:
            pts = cur.get(k)
            return f"{pts[0][1]:.3f} -> {pts[-1][1]:.3f}" if pts else "-"

        wall, rss = info.get("wall_s"), info.get("peak_rss_gb")
        wall_s = "-" if wall is None else f"{wall / 60:.1f}"
        rss_s = "-" if rss is None else f"{rss:.2f}"
        # SFT and DPO sample nothing while they train: no group, temperature or anchor weight to show.
        rl = c.get("method") not in ("sft", "dpo")
        alpha, temp = (c.get("alpha"), c.get("temperature")) if rl else ("-", "-")
        batch = f"{c.get('batch_size')} x {c.get('group_size')}" if rl else f"{c.get('batch_size')}"
        out.append(
            f"| {n} | {c.get('method')} | {alpha} | {c.get('steps')} | {batch} | {c.get('lr')} | {temp} | "
            f"{kept} | {wall_s} | {rss_s} | "
            f"{info.get('load_avg_mean', '-')} | {fl('reward/total')} | {fl('probe/multi_turn_strict')} |"
        )
    codes = [(n, r.get("info", {}).get("code")) for n, r in runs.items()]
    if any(code for _, code in codes):
        out += ["", "Code each run trained on (`run_info.json`, `code`):", ""]
        for n, code in codes:
            out.append(f"- {n}: {_code(code)}")
    best_runs = [(n, r["best"]) for n, r in runs.items() if r.get("best")]
    if best_runs:
        out += ["", "Runs that keep a best checkpoint (`best.json`: the policy evaluated, not the last step):", ""]
        out += [f"- {n}: step {b['step']} of {runs[n].get('config', {}).get('steps')}, {b['metric']} {b['value']:.4f}"
                for n, b in best_runs]
    reasons = [(n, r["filter"]) for n, r in runs.items() if r.get("filter", {}).get("kept") is not None]
    if reasons:
        out += ["", "Latent-capability filtering (why histories were kept or dropped):", ""]
        for n, f in reasons:
            out.append(f"- {n}: " + ", ".join(f"{k} {v}" for k, v in f.items() if k.startswith(("kept", "dropped"))))
    return out


def _md_arg(out_dir: Path) -> str:
    """The report's path as `--out` takes it: relative to the repository root when inside it."""
    md = Path(out_dir).resolve().with_suffix(".md")
    try:
        return str(md.relative_to(ROOT))
    except ValueError:
        return str(md)


def _how(m: dict[str, Any]) -> str:
    """What a manifest model adds to its spec: its strategy, RECAP, the abstain instruction."""
    how = [*([f"strategy {m['strategy']}"] if m.get("strategy") else []), *(["RECAP"] if m.get("recap") else []),
           *(["with the abstain instruction"] if m.get("abstain") else [])]
    return "".join(f", {h}" for h in how)


def render(report: dict[str, Any], out_dir: Path, md_dir: Path) -> str:
    """The whole markdown report; image links are relative to ``md_dir``."""
    man = report["manifest"]
    rel = os.path.relpath(out_dir, md_dir)
    img = lambda name: f"![{name}]({rel}/{name})"  # noqa: E731
    lines = [
        f"# {report['manifest'].get('title') or 'RLSTA on CPU: held-out multi-turn reliability'}",
        "",
        "Models: " + ", ".join(f"`{m['name']}` (`{m['spec']}`{_how(m)})" for m in man["models"]) + ".",
        f"Held-out set: `{man['heldout']}` ({man['n_problems']} problems, families "
        f"{', '.join(man['families'])}; each as FULL, MT-Add and MT-Refine).",
        f"Greedy replies of at most {man['max_new_tokens']} tokens; LiC: {man['lic_runs']} runs at T = 1 on "
        f"{man['lic_problems']} problems"
        + (f" (not run for {', '.join(f'`{n}`' for n in man['greedy_only'])}: greedy only)"
           if man.get("greedy_only") else "")
        + f". Bootstrap: {report['n_bootstrap']} replicates over problems.",
        "",
        f"Command: `{man['command']}`",
        f"Last invocation on: {_code(man.get('code'))}.",
        "",
        *_evaluated_on(report),
        "",
        *(c + [""] if (c := _compute(report)) else []),
        "Every number below is recomputed from the files under "
        f"`{rel}/` by `python -m experiments.compare --recompute --out {_md_arg(out_dir)}`.",
        "",
    ]
    lines += _accuracy(report) + [""] + _uncut(report) + ["", img("accuracy.png"), ""] + _pairs(report) + [""]
    seeds = _seeds(report)
    lines += (seeds + [""] if seeds else []) + _lic(report) + [""]
    lines += behaviour(report) + ["", img("lic_score_inertia.png"), "", img("response_types.png"), ""]
    if report.get("runs"):
        lines += _runs(report) + ["", img("curves.png"), ""]
    keys = dynamics_keys(report)
    if keys:
        lines += ["## Training dynamics", "",
                  "Held-out accuracy (strict) over training steps, one line per run; an arm of several seeds as the "
                  "mean of its runs (thick) over its seeds (thin). Panels: "
                  + "; ".join(f"`{k}` ({DYNAMICS_KEYS[k]})" for k in keys) + ".", "",
                  img("training_dynamics.png"), ""]
    return "\n".join(lines) + "\n"
