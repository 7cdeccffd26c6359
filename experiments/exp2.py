"""Issue 35's comparison, one command per stage: train the arms (resumable), keep their small files.

    python -m experiments.exp2 list                      # the arms, their commands and what is done
    python -m experiments.exp2 train [--arms a,b,...]    # train the arms not finished yet, in ARMS order
                                                         # (--again: also the fully fine-tuned arms trained
                                                         # in an earlier checkout, to evaluate them here)
    python -m experiments.exp2 evaluate [--lic-extra a]  # base, the finished arms, SeDT, RECAP, RLAAR's control
                                                         # (other arguments go to experiments.compare;
                                                         # --lic-extra best: the plan's best other arm)
    python -m experiments.exp2 reproduce --arms a        # arm a's committed adapter evaluated again (greedy,
                                                         # into RUNS/reproduce/): the same records and numbers?
    python -m experiments.exp2 all                       # train, evaluate, LiC of the best other arm, reproduce
                                                         # REPRODUCED: the whole comparison, resumable

The arm table (``ARMS``) and the seeds are the plan's (``docs/results/experiment2_plan.md``), fixed
before any run. ``rlsta_s0`` runs the data stage (histories and the latent-capability filter at the
chosen budget and system prompt); every arm that trains on histories starts from copies of its
``histories.jsonl*`` and ``train_items.jsonl*``, so all of them train on the same filtered items.
The filter's samples, which SFT and DPO turn into their rows, are written by the first of them and
kept in the data stage (``filter_texts.jsonl``): the other reads them instead of sampling them again
(under the same key: model, seed, k, budget, prompt and histories). ICPO and RLAAR make their own
prompts from the problems of those items (``train_problems.jsonl``, written into the data stage).
Each arm trains through ``experiments.train_arm`` (wall time, peak RSS and load in
``run_info.json``) in ``runs/exp2/<arm>``; a killed arm resumes from its last checkpoint when the
command is run again. A finished arm's small files (``RUN_FILES``) and, for a LoRA arm, its adapter
stored in bfloat16 (about 9.8 MB at rank 16) are copied to ``docs/results/exp2/runs/<arm>/`` for
commit: the comparison evaluates the committed adapter, so anyone can evaluate the same model again.
A fully fine-tuned arm (``FULL``: the plan's LoRA rule chose full fine-tuning) is evaluated from the policy
its workdir exports (the last checkpoint; SFT's and DPO's kept best by validation loss); its weights (270 MB
in bfloat16) are not committed. ``evaluate`` calls ``experiments.compare.run`` with the ``Comparison`` of the
held-out set at the chosen budget and prompt (``comparison``); a rerun resumes the evaluations already on disk.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

from experiments import arm_runs, compare
from experiments.arm_runs import (FILTER_TEXTS, PROBLEMS, Arm, ArmPlan, committed_adapter,  # noqa: F401
                                  copy_shared_items, finished, keep_small_files, same_training)
from experiments.common import ROOT, evaluation_finished  # noqa: F401
from experiments.compare import Comparison

__all__ = ["ARMS", "Arm", "DATA_ARM", "arm_command", "best_other_arm", "comparison", "finished", "main",
           "model_spec", "reproduction", "same_training", "unevaluable", "weights_here"]

RUNS = Path("runs/exp2")
RESULTS = Path("docs/results/exp2/runs")
DATA = Path("docs/results/exp2/data")  # the data stage's files, committed: a new checkout skips that stage
DATA_ARM = "rlsta_s0"
ARMS_CONFIG = "configs/rlsta.py:experiment2"  # the data stage's config (its problem sources)
BASE = "builtin:smollm2-135m-instruct"
HELDOUT = Path("docs/results/heldout.jsonl")
REPORT = Path("docs/results/exp2/report.md")
TITLE = "The seeds' arms at the embedded scale: base, SFT, DPO, GRPO, RLSTA, ICPO, RLAAR, SeDT, RECAP (issue 35)"
# LiC at T = 1 (the plan: base, GRPO, RLSTA; the LoRA arms' ran before the LoRA rule's outcome); the best
# other arm is added by name
LIC_MODELS = ("base", "grpo_full_s0", "rlsta_full_s0", "grpo_s0", "rlsta_s0")
NOT_OTHER = ("base", "grpo_", "rlsta_s", "rlsta_full_s")  # not candidates for the plan's "best other arm" (prefixes)
REPRODUCED = "rlsta_s0"  # the committed adapter evaluated a second time (`reproduce`) by `all`
PAIRS_WITH = ("base", "grpo_full_s0", "rlsta_full_s0")  # paired differences against these (seeds: "Seeds")
# inference-time arms on the base model (compare --strategy / --recap / --abstain-models): SeDT, RECAP, and
# RLAAR's control, the base model with RLAAR's abstain instruction (added after RLAAR's evaluation, see the plan)
ABSTAIN_CONTROL = "base_abstain"
INFERENCE = ("sedt", "recap", ABSTAIN_CONTROL)


ON_PROBLEMS = ("--config.data.add_source=tasks:{data}/" + PROBLEMS,)
# The plan's LoRA rule (session 19): GRPO fully fine-tuned beat LoRA-GRPO on held-out multi-turn accuracy by
# +5.5 points [+3.3, +7.8], a CI without 0, so every arm after them trains fully, at the full fine-tuning lr
FULL = ("--config.lora.rank=0", "--config.rl.lr=1e-05")
ARMS: dict[str, Arm] = {
    # LoRA (rank 16, lr 1e-4), trained before the rule's outcome: the data stage, and the LoRA comparison
    "rlsta_s0": Arm("configs/rlsta.py:experiment2", 0),
    "grpo_s0": Arm("configs/grpo.py:experiment2", 0),
    # full fine-tuning: the table's arms (seed 1 before the single-seed arms, seed 2 last)
    "grpo_full_s0": Arm("configs/grpo.py:experiment2", 0, FULL),
    "rlsta_full_s0": Arm("configs/rlsta.py:experiment2", 0, FULL),
    "grpo_full_s1": Arm("configs/grpo.py:experiment2", 1, FULL),
    "rlsta_full_s1": Arm("configs/rlsta.py:experiment2", 1, FULL),
    "rlsta_nv_full_s0": Arm("configs/rlsta.py:experiment2", 0, (*FULL, "--config.rl.verifier_weight=0.0")),
    "sft_full_s0": Arm("configs/sft.py:experiment2", 0, FULL, shares_texts=True),
    "dpo_full_s0": Arm("configs/dpo.py:experiment2", 0, FULL, shares_texts=True),
    # ICPO and RLAAR make their own prompts from the problems of the shared items (PROBLEMS)
    "icpo_full_s0": Arm("configs/icpo.py:experiment2", 0, (*FULL, *ON_PROBLEMS), shares_items=False),
    "rlaar_full_s0": Arm("configs/rlaar.py:experiment2", 0, (*FULL, *ON_PROBLEMS), shares_items=False),
    "grpo_full_s2": Arm("configs/grpo.py:experiment2", 2, FULL),
    "rlsta_full_s2": Arm("configs/rlsta.py:experiment2", 2, FULL),
}
PLAN = ArmPlan("exp2", ARMS, DATA_ARM, ARMS_CONFIG)


def arm_command(name: str, runs: Path = RUNS, data: Path = DATA, extra: Sequence[str] = ()) -> list[str]:
    """The ``experiments.train_arm`` arguments of arm ``name`` (``arm_runs.arm_command`` of ``PLAN``)."""
    return arm_runs.arm_command(PLAN, name, runs, data, extra)


def write_item_problems(data: Path, config: str = ARMS_CONFIG) -> Path:
    """``data/PROBLEMS``: the problems of the data stage's filtered items (``arm_runs.write_item_problems``)."""
    return arm_runs.write_item_problems(data, config)


def evaluated(report_dir: Path, name: str, sub: str = "greedy") -> bool:
    """Model ``name``'s evaluation ``sub`` (greedy, lic) is finished (``evaluation_finished``)."""
    return evaluation_finished(report_dir / "models" / name / sub)


def weights_here(name: str, runs: Path, results: Path) -> bool:
    """Arm ``name``'s model can be evaluated here: a committed adapter, or a finished workdir."""
    return committed_adapter(name, results) is not None or finished(runs / name)


def train(names: list[str], runs: Path, results: Path, data: Path = DATA, extra: Sequence[str] = (),
          again: bool = False) -> int:
    """Trains ``names`` in ``ARMS`` order, finished ones skipped (``arm_runs.train`` of ``PLAN``)."""
    return arm_runs.train(PLAN, names, runs, results, data, extra, again)


def model_spec(name: str, runs: Path, results: Path, base: str = BASE) -> str:
    """The model spec ``compare`` evaluates for arm ``name``: its committed bfloat16 adapter on the base
    model, or (full fine-tuning: too large to commit) the policy its workdir exports (``load_policy``: the kept
    best checkpoint of a run that keeps one, SFT's and DPO's lowest validation loss; else the latest)."""
    adapter = committed_adapter(name, results)
    if adapter is not None:
        return f"{base}+lora:{adapter}"
    return f"workdir:{runs / name}"


def best_other_arm(report_dir: Path, names: Sequence[str]) -> tuple[str, dict[str, float]]:
    """The plan's "best other arm" for LiC: among ``names`` not base, GRPO or RLSTA (``NOT_OTHER``), the one
    with the highest greedy strict multi-turn accuracy (the first in ``names`` on a tie; RECAP, without
    MT-Refine, has none); returns it and every candidate's accuracy.

    Raises:
      SystemExit: a candidate's greedy evaluation is not finished (run ``evaluate`` first), or none has one.
    """
    from experiments.common import load_records
    from experiments.report import kind_scores

    cands = [n for n in names if not n.startswith(NOT_OTHER)]
    todo = [n for n in cands if not evaluated(report_dir, n)]
    if todo:
        raise SystemExit(f"--lic-extra best: the greedy evaluations of {todo} are not finished; run evaluate first")
    acc = {}
    for n in cands:
        multi = kind_scores(load_records(report_dir / "models" / n / "greedy"), "strict")["multi"]
        if multi:
            acc[n] = sum(multi.values()) / len(multi)
    if not acc:
        raise SystemExit(f"--lic-extra best: no candidate with a multi-turn accuracy among {cands}")
    return max(acc, key=lambda n: (acc[n], -cands.index(n))), acc


def unevaluable(names: Sequence[str], runs: Path, results: Path, report_dir: Path, lic: set[str]) -> list[str]:
    """The arms among ``names`` with an evaluation still to run (greedy; LiC for those in ``lic``) whose
    weights are not here (``weights_here``)."""
    def todo(n: str) -> bool:
        subs = ("greedy", "lic") if n in lic else ("greedy",)
        return not all(evaluated(report_dir, n, s) for s in subs)

    return [n for n in names if todo(n) and not weights_here(n, runs, results)]


def _abstains(name: str) -> bool:
    """Arm ``name`` trains with RLAAR's abstain instruction (and so is evaluated with it)."""
    return name.startswith("rlaar")


def _settings(names: Sequence[str], base: str) -> dict[str, Any]:
    """The ``Comparison`` fields every evaluation of this comparison shares: base model, held-out set,
    the chosen budget and system prompt, RLAAR's abstain instruction (as in its training)."""
    from configs.rlsta import EXP2_BUDGET, EXP2_SYSTEM

    abstain = tuple(n for n in names if _abstains(n) or n == ABSTAIN_CONTROL)
    return dict(base=base, abstain_models=abstain, heldout=str(HELDOUT), max_new_tokens=EXP2_BUDGET,
                system=EXP2_SYSTEM, gzip=True)


def comparison(names: list[str], runs: Path, results: Path, out: Path, lic_extra: list[str],
               base: str = BASE) -> Comparison:
    """The ``experiments.compare`` comparison of base, the arms ``names`` and ``INFERENCE`` on the base model.

    Every model gets the chosen budget and system prompt (``_settings``); greedy FULL / MT-Add /
    MT-Refine for all (RECAP in place of MT-Add and MT-Refine), LiC at T = 1 for ``LIC_MODELS`` and
    ``lic_extra`` (the plan's "best other arm"). RLAAR's arms get the paired difference against their
    control (``ABSTAIN_CONTROL``: the base model with the same instruction).
    """
    models = ("base", *(f"{n}={model_spec(n, runs, results, base)}" for n in names),
              *(f"{n}={base}" for n in INFERENCE))
    lic = {*LIC_MODELS, *lic_extra}
    return Comparison(title=TITLE, pairs_with=tuple(n for n in PAIRS_WITH if n == "base" or n in names),
                      pairs=tuple(f"{n}:{ABSTAIN_CONTROL}" for n in names if _abstains(n)), models=models,
                      strategy=("sedt=sedt",), recap=("recap",), run_files=str(results), out=str(out),
                      greedy_only=tuple(n for n in ("base", *names, *INFERENCE) if n not in lic),
                      **_settings([*names, *INFERENCE], base))


def reproduction(name: str, runs: Path, results: Path, out: Path, base: str = BASE) -> Comparison:
    """The comparison that evaluates arm ``name`` again as ``evaluate`` did (greedy only, ``_settings``:
    the same held-out set, budget, system prompt, seed and batch)."""
    return Comparison(models=(f"{name}={model_spec(name, runs, results, base)}",), out=str(out), lic_runs=0,
                      **_settings([name], base))


def reproduce(names: list[str], runs: Path, results: Path, report: Path, base: str, passed: list[str]) -> int:
    """Evaluates each arm again into ``runs/reproduce/`` and compares it with ``report``'s evaluation;
    returns 1 when one differs. Each arm's earlier reproduction there is removed first: the evaluation
    is run whole, not resumed. ``passed``: more ``experiments.compare`` options (never LiC)."""
    from experiments.reproduce import same_evaluation, summary

    out = runs / "reproduce" / "report.md"
    bad = 0
    for name in names:
        shutil.rmtree(out.with_suffix("") / "models" / name, ignore_errors=True)
        c = compare.parse(passed, reproduction(name, runs, results, out, base))
        rc = compare.run(dataclasses.replace(c, lic_runs=0))
        if rc:
            return rc
        ref, new = (p.with_suffix("") / "models" / name / "greedy" for p in (report, out))
        res = same_evaluation(ref, new)
        print(summary(name, res, ref, new))
        bad += not res["identical"]
    return int(bad > 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=("list", "train", "evaluate", "reproduce", "all"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="train: a config override appended to every arm's command, e.g. --set rl.steps=2")
    ap.add_argument("--out", default=str(REPORT), help="evaluate: the report (files under OUT without .md); "
                    "reproduce: the report evaluated again")
    ap.add_argument("--base", default=BASE, help="evaluate: the base model (the adapters' base too)")
    ap.add_argument("--lic-extra", default="", help="evaluate: arms also run through LiC at T = 1 (comma-separated; "
                    "'best': the plan's best other arm, by greedy multi-turn accuracy once every greedy one is done)")
    ap.add_argument("--again", action="store_true", help="train: also train again the finished, fully fine-tuned "
                    "arms whose weights are not here (an earlier checkout's), checked against their committed metrics")
    ap.add_argument("--arms", default=",".join(ARMS), help="comma-separated arm names (default: all, in order)")
    ap.add_argument("--runs", default=str(RUNS), help="the arms' workdirs go under this folder")
    ap.add_argument("--results", default=str(RESULTS), help="the arms' small files are copied under this folder")
    ap.add_argument("--data", default=str(DATA), help="the data stage's files are kept in (and restored from) here")
    a, passed = ap.parse_known_args(argv)
    if passed and a.stage not in ("evaluate", "reproduce", "all"):
        ap.error(f"unrecognized arguments: {' '.join(passed)}")
    if a.again and a.stage not in ("train", "all"):
        ap.error("--again: only with train or all")
    names = [n.strip() for n in a.arms.split(",") if n.strip()]
    unknown = [n for n in names if n not in ARMS]
    if unknown:
        raise SystemExit(f"--arms: unknown {unknown}; expected names among {list(ARMS)}")
    runs, results = Path(a.runs), Path(a.results)
    extra = [f"--config.{kv}" for kv in a.set]
    if a.stage == "list":
        arm_runs.list_arms(PLAN, names, runs, results, Path(a.data), extra)
        return 0
    if a.stage == "evaluate":
        done = [n for n in names if finished(runs / n) or finished(results / n)]
        lic_extra = [n.strip() for n in a.lic_extra.split(",") if n.strip()]
        if "best" in lic_extra:  # the plan's rule, applied to the greedy evaluations on disk
            best, acc = best_other_arm(Path(a.out).with_suffix(""), [*done, *INFERENCE])
            print("exp2: best other arm by greedy multi-turn accuracy: " + best + " ("
                  + ", ".join(f"{n} {100 * v:.1f}" for n, v in sorted(acc.items(), key=lambda x: -x[1])) + ")",
                  file=sys.stderr, flush=True)
            lic_extra = [best if n == "best" else n for n in lic_extra]
        if set(lic_extra) - set(done) - set(INFERENCE):
            raise SystemExit(f"--lic-extra: {sorted(set(lic_extra) - set(done) - set(INFERENCE))} are not finished "
                             "arms")
        lost = unevaluable(done, runs, results, Path(a.out).with_suffix(""), {*LIC_MODELS, *lic_extra})
        if lost:
            raise SystemExit(f"evaluate: {lost} have evaluations to run but their weights are not here (fully "
                             f"fine-tuned in an earlier checkout): run `train --again --arms {','.join(lost)}` first")
        print(f"exp2: evaluating base, {', '.join(done)}, {', '.join(INFERENCE)}", file=sys.stderr, flush=True)
        return compare.run(compare.parse(passed, comparison(done, runs, results, Path(a.out), lic_extra, a.base)))
    if a.stage == "all":  # each stage resumes what an earlier invocation left
        where = ["--runs", a.runs, "--results", a.results, "--data", a.data, "--arms", a.arms]
        evaluate = [*where, "--out", a.out, "--base", a.base, *passed]
        train_args = ["train", *where, *(["--again"] if a.again else []), *(x for kv in a.set for x in ("--set", kv))]
        for stage in (train_args, ["evaluate", *evaluate],
                      ["evaluate", "--lic-extra", "best", *evaluate],
                      ["reproduce", *evaluate, "--arms", REPRODUCED if REPRODUCED in names else names[0]]):
            print(f"exp2 all: {' '.join(stage[:3])}", file=sys.stderr, flush=True)
            rc = main(stage)
            if rc:
                return rc
        return 0
    if a.stage == "reproduce":
        if a.arms == ap.get_default("arms"):
            ap.error("reproduce: name the arms (--arms a,b)")
        return reproduce(names, runs, results, Path(a.out), a.base, passed)
    return train(names, runs, results, Path(a.data), extra, again=a.again)


if __name__ == "__main__":
    sys.exit(main())
