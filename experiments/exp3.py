"""Experiment 3 (issue 56; the plan: docs/results/experiment3_plan.md), one command per stage.

    python -m experiments.exp3 stage0     # train the stage-0 model (resumable), keep its small files
    python -m experiments.exp3 premise    # the plan's gates on the validation split, and the budget
    python -m experiments.exp3 list       # the arms (experiments.exp3_arms), their commands and what is done
    python -m experiments.exp3 train [--arms a,b]  # train the arms not finished yet, in the table's order
    python -m experiments.exp3 evaluate [--problems FILE] [--arms a,b]  # the comparison (experiments.exp3_eval)
    python -m experiments.exp3 reproduce --arms a  # train arm a again from the stage-0 model and the committed
                                                   # data stage, in runs/exp3/reproduce/: the same metrics?

``stage0`` trains ``configs/sft.py:stage0`` through ``experiments.train_arm`` into ``runs/exp3/stage0``
(a killed run resumes when the command is run again) and copies its small files (``RUN_FILES``) to
``docs/results/exp3/stage0/``; the weights (540 MB) are not committed: the command rebuilds them.

``premise`` evaluates the stage-0 model on the validation split (never the held-out one) through
``experiments.calibrate``: greedy FULL, MT-Add (``sharded``) and MT-Refine, the plan's system prompt,
``CEILING`` tokens per reply; then applies the plan's rules and writes ``premise.json`` and
``premise.md`` under ``docs/results/exp3/premise/`` (transcripts gzipped beside them):

- threshold: FULL strict accuracy >= ``THRESHOLD``;
- premise: FULL - MT-Add strict accuracy (paired by problem) >= ``PREMISE_GAP`` with a 95% CI above 0;
- shortcuts: each rule (add every number, last, first, largest, echo MT-Add's last user message) at
  least ``SHORTCUT_MARGIN`` under FULL;
- budget: the smallest of ``BUDGETS`` that at most ``CUT_LIMIT`` of the FULL and of the MT-Add last
  replies reach (greedy: a reply's first B tokens do not depend on the budget), else ``CEILING``.

``--recompute`` rebuilds ``premise.json`` / ``premise.md`` from the committed transcripts alone.
"""

from __future__ import annotations

import argparse
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

from experiments.analysis import bootstrap_mean, bootstrap_paired, last_reply_scores
from experiments.calibrate import cut_shares
from experiments.common import ROOT, compress_transcripts, load_records, write_json
from experiments.arm_runs import finished, keep_small_files
from experiments.exp2_audit import RULES
from experiments.exp2_audit import shortcut_scores as audit_shortcuts

__all__ = ["BUDGETS", "decide", "main", "shortcut_scores"]

RUNS = Path("runs/exp3")
RESULTS = Path("docs/results/exp3")
VALIDATION = "docs/results/exp3/data/validation.jsonl"
STAGE0_CONFIG = "configs/sft.py:stage0"
THRESHOLD = 0.50
PREMISE_GAP = 0.10
SHORTCUT_MARGIN = 0.25
BUDGETS = (64, 96)
CEILING = 128
CUT_LIMIT = 0.05
SCENARIOS = "full,sharded,mt_refine"


def system_prompt() -> str:
    """The plan's one system prompt: experiment 2's S2, the one stage 0 trains under."""
    return runpy.run_path(str(ROOT / "configs/rlsta.py"))["EXP2_SYSTEM"]


def train_stage0(runs: Path, results: Path, extra: list[str]) -> int:
    """Trains (or resumes) stage 0 and copies its small files for commit; the exit status."""
    wd = runs / "stage0"
    if not finished(wd):
        rc = subprocess.call([sys.executable, "-m", "experiments.train_arm", "--config", STAGE0_CONFIG,
                              f"--config.workdir={wd}", *extra], cwd=ROOT)
        if rc != 0:
            return rc
    keep_small_files(wd, results / "stage0")
    return 0


def shortcut_scores(records: list[dict[str, Any]], tasks: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Rule -> task -> 0/1: ``exp2_audit.shortcut_scores``' rules on each FULL prompt, and ``echo`` (MT-Add's
    last user message in ``records`` taken as the reply)."""
    last_users = {r["task_id"]: r["turns"][-1]["user"] for r in records
                  if r["kind"] == "sharded" and r["task_id"] in tasks and r["turns"]}
    problems = [{"task_id": tid, "answer": t.answer, "full_prompt": t.full_prompt} for tid, t in tasks.items()]
    scores = audit_shortcuts(problems, last_users)
    return {**{r: scores[r] for r in RULES}, "echo": scores["echo_mt_add"]}


def decide(records: list[dict[str, Any]], tasks: dict[str, Any]) -> dict[str, Any]:
    """The plan's gates and budget from the stage-0 model's validation transcripts (``records``)."""
    full, multi = (last_reply_scores(records, k, "strict") for k in ("full", "sharded"))
    refine = last_reply_scores(records, "mt_refine", "strict")
    acc = {k: bootstrap_mean(s) for k, s in (("full", full), ("sharded", multi), ("mt_refine", refine))}
    gap = bootstrap_paired(multi, full)  # FULL - MT-Add ("diff"), paired by problem
    rules = {r: bootstrap_mean(s) for r, s in shortcut_scores(records, tasks).items()}
    cuts = {k: cut_shares(records, k, lambda _: True, list(BUDGETS)) for k in ("full", "sharded")}
    budget = next((b for b in BUDGETS if all(c is not None and c["cut_at"][str(b)] <= CUT_LIMIT
                                             for c in cuts.values())), CEILING)
    f = acc["full"]["mean"]
    return {
        "accuracy": acc, "full_minus_mt_add": gap, "shortcuts": rules, "cuts": cuts,
        "threshold_met": f >= THRESHOLD,
        "premise_met": gap["diff"] >= PREMISE_GAP and gap["lo"] > 0,
        "shortcuts_ok": all(r["mean"] <= f - SHORTCUT_MARGIN for r in rules.values()),
        "budget": budget,
        "rules": {"threshold": THRESHOLD, "premise_gap": PREMISE_GAP, "shortcut_margin": SHORTCUT_MARGIN,
                  "budgets": list(BUDGETS), "ceiling": CEILING, "cut_limit": CUT_LIMIT},
    }


def _pct(x: dict[str, float]) -> str:
    """``mean [lo, hi]`` in % of a bootstrap result (a mean's or a paired difference's)."""
    m = x["mean"] if "mean" in x else x["diff"]
    return f"{100 * m:+.1f} [{100 * x['lo']:+.1f}, {100 * x['hi']:+.1f}]" if "diff" in x else \
        f"{100 * m:.1f} [{100 * x['lo']:.1f}, {100 * x['hi']:.1f}]"


def markdown(d: dict[str, Any], n: int) -> str:
    """The gates' table (strict accuracy, 95% bootstrap CIs over the ``n`` validation problems)."""
    ok = {True: "met", False: "**not met**"}
    lines = [f"# Experiment 3: the stage-0 model on the validation split ({n} problems)", "",
             "Recomputed by `python -m experiments.exp3 premise --recompute` from the transcripts here. Greedy, "
             f"strict verifier, {d['rules']['ceiling']} tokens per reply, the plan's system prompt.", "",
             "| what | value | rule | verdict |", "|---|---|---|---|",
             f"| FULL | {_pct(d['accuracy']['full'])} | >= {100 * THRESHOLD:.0f} | {ok[d['threshold_met']]} |",
             f"| MT-Add | {_pct(d['accuracy']['sharded'])} | | |",
             f"| MT-Refine | {_pct(d['accuracy']['mt_refine'])} | | |",
             f"| FULL - MT-Add (paired) | {_pct(d['full_minus_mt_add'])} | >= {100 * PREMISE_GAP:.0f}, CI above 0 "
             f"| {ok[d['premise_met']]} |"]
    for rule, x in d["shortcuts"].items():
        lines.append(f"| shortcut: {rule} | {_pct(x)} | <= FULL - {100 * SHORTCUT_MARGIN:.0f} | "
                     f"{ok[x['mean'] <= d['accuracy']['full']['mean'] - SHORTCUT_MARGIN]} |")
    for kind, c in d["cuts"].items():
        shares = ", ".join(f">= {b}: {100 * v:.1f}%" for b, v in c["cut_at"].items())
        lines.append(f"| {kind} last replies: median {c['median_tokens']:.0f} tokens | {shares} | | |")
    lines += ["", f"Budget chosen by the plan's rule: **{d['budget']} tokens**."]
    return "\n".join(lines) + "\n"


def premise(runs: Path, results: Path, recompute: bool) -> int:
    """Evaluates the stage-0 model on the validation split (unless ``recompute``) and writes the gates."""
    from experiments import calibrate
    from jaxrl_mt.data.loaders import load_source

    out = results / "premise"
    if not recompute:
        model = runs / "stage0" / "export"
        if not (model / "config.json").is_file():
            raise SystemExit(f"{model}: no exported stage-0 model; run `python -m experiments.exp3 stage0` first")
        rc = calibrate.main(["--out", str(out), "--families", f"validation=tasks:{VALIDATION}", "--temps", "0",
                             "--model", str(model), "--max-new-tokens", str(CEILING), "--system", system_prompt(),
                             "--scenarios", SCENARIOS, "--budgets", ",".join(map(str, BUDGETS))])
        if rc:
            return rc
        compress_transcripts(out / "T0")
    tasks = {t.task_id: t for t in load_source(f"tasks:{VALIDATION}")}
    d = decide(load_records(out / "T0"), tasks)
    write_json(out / "premise.json", d)
    (out / "premise.md").write_text(markdown(d, len(tasks)), encoding="utf-8")
    print(markdown(d, len(tasks)))
    return 0


def stage0_here(runs: Path, results: Path) -> int:
    """Makes sure the stage-0 model is here (its weights are not committed): trains it again when it is
    not, saying so and how long that takes, and checks the run repeats the committed metrics."""
    from experiments.arm_runs import same_training

    wd = runs / "stage0"
    if (wd / "export" / "config.json").is_file():
        return 0
    print(f"exp3: the stage-0 model is not here ({wd}/export; its 540 MB are not committed): training it again "
          f"with `python -m experiments.exp3 stage0` (240 steps, about 2 h on 2 cores; deterministic)",
          file=sys.stderr, flush=True)
    rc = train_stage0(runs, results, [])
    if rc:
        return rc
    diff = same_training(results / "stage0", wd)
    if diff:
        print("exp3: the stage-0 model trained again differs from its committed run:\n  " + "\n  ".join(diff[:5]),
              file=sys.stderr, flush=True)
        return 1
    return 0


def evaluate(names: list[str], runs: Path, results: Path, problems: Path, out: Path | None, lic: bool,
             passed: list[str]) -> int:
    """``experiments.compare`` on ``problems`` for the finished arms among ``names`` (``exp3_eval``)."""
    from experiments import compare, exp3_eval

    done = [n for n in names if finished(runs / n) or finished(results / n)]
    if set(names) - set(done):
        print(f"exp3: not finished, not evaluated: {sorted(set(names) - set(done))}", file=sys.stderr, flush=True)
    rc = stage0_here(runs, results.parent)
    if rc:
        return rc
    if out is None:
        out = exp3_eval.REPORT if problems == exp3_eval.HELDOUT else runs / "eval" / problems.stem / "report.md"
    print(f"exp3: evaluating the stage-0 model, the original model, {', '.join(done) or 'no arm'} and "
          f"{', '.join(exp3_eval.INFERENCE)} on {problems} into {out}", file=sys.stderr, flush=True)
    c = exp3_eval.comparison(done, runs, results, out, problems, lic=lic)
    return compare.run(compare.parse(passed, c))


def reproduce(names: list[str], runs: Path, results: Path, data: Path) -> int:
    """Trains each arm again in ``runs/reproduce/<arm>`` (from the stage-0 model and the committed data
    stage) and compares its ``metrics.jsonl`` with the committed one; 1 when one differs."""
    from experiments import arm_runs
    from experiments.exp3_arms import PLAN

    rc = stage0_here(runs, results.parent)
    if rc:
        return rc
    out, bad = runs / "reproduce", 0
    for name in names:
        rc = arm_runs.train(PLAN, [name], out, out / "files", data)
        if rc:
            return rc
        diff = arm_runs.same_training(results / name, out / name)
        print(f"exp3 reproduce: {name}: " + ("the same metrics.jsonl as the committed run" if not diff else
              f"{len(diff)} differences, e.g.\n  " + "\n  ".join(diff[:5])), flush=True)
        bad += bool(diff)
    return int(bad > 0)


def main(argv: list[str] | None = None) -> int:
    from experiments import arm_runs, exp3_arms, exp3_eval

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=("stage0", "premise", "list", "train", "evaluate", "reproduce"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="stage0, train: a config override (every arm's), e.g. --set rl.steps=2")
    ap.add_argument("--recompute", action="store_true", help="premise: rebuild the verdicts from the transcripts")
    ap.add_argument("--arms", default=",".join(exp3_arms.ARMS), help="list, train: comma-separated arm names "
                    "(default: all, in the table's order)")
    ap.add_argument("--runs", default=str(RUNS))
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--data", default=str(exp3_arms.DATA), help="the data stage's files are kept in (and restored "
                    "from) here")
    ap.add_argument("--problems", default=str(exp3_eval.HELDOUT), help="evaluate: a tasks JSONL file (default: "
                    "the held-out split)")
    ap.add_argument("--out", default=None, help="evaluate: the report (default: docs/results/exp3/report.md for "
                    "the held-out split, else runs/exp3/eval/<file stem>/report.md)")
    ap.add_argument("--no-lic", action="store_true", help="evaluate: greedy only (no LiC at T = 1)")
    a, passed = ap.parse_known_args(argv)
    if passed and a.stage != "evaluate":
        ap.error(f"unrecognized arguments: {' '.join(passed)}")
    runs, results, extra = Path(a.runs), Path(a.results), [f"--config.{kv}" for kv in a.set]
    if a.stage == "stage0":
        return train_stage0(runs, results, extra)
    if a.stage == "premise":
        return premise(runs, results, a.recompute)
    names = [n.strip() for n in a.arms.split(",") if n.strip()]
    unknown = [n for n in names if n not in exp3_arms.ARMS]
    if unknown:
        raise SystemExit(f"--arms: unknown {unknown}; expected names among {list(exp3_arms.ARMS)}")
    if a.stage == "list":
        arm_runs.list_arms(exp3_arms.PLAN, names, runs, results / "runs", Path(a.data), extra)
        return 0
    if a.stage == "reproduce":
        if a.arms == ap.get_default("arms"):
            ap.error("reproduce: name the arms (--arms a,b)")
        return reproduce(names, runs, results / "runs", Path(a.data))
    if a.stage == "evaluate":
        return evaluate(names, runs, results / "runs", Path(a.problems), Path(a.out) if a.out else None,
                        not a.no_lic, passed)
    return arm_runs.train(exp3_arms.PLAN, names, runs, results / "runs", Path(a.data), extra)


if __name__ == "__main__":
    sys.exit(main())
