"""Experiment 3's evaluation (docs/results/experiment3_plan.md, section 5): the comparison it runs.

Every model answers the same problems (the held-out split, or any tasks file) with the plan's budget
and system prompt: greedy FULL / MT-Add / MT-Refine for all, LiC at T = 1 for the stage-0 model
(``base``: the adapters' base) and every trained arm's seed 0; the original embedded model as a
reference row (``original``); SeDT and RECAP as inference strategies on the stage-0 model; RLAAR's
arms with its abstain instruction and paired against their control (the stage-0 model with the same
instruction). A LoRA arm is evaluated from its committed adapter on the stage-0 model, which is not
committed (540 MB): ``python -m experiments.exp3 stage0`` rebuilds it deterministically.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.compare import Comparison
from experiments.exp2 import model_spec

__all__ = ["HELDOUT", "INFERENCE", "ORIGINAL", "REPORT", "comparison", "lic_models", "settings"]

ORIGINAL = "builtin:smollm2-135m-instruct"  # the model stage 0 was made from: a reference row
HELDOUT = Path("docs/results/exp3/data/heldout.jsonl")
REPORT = Path("docs/results/exp3/report.md")
TITLE = "Experiment 3: the arms from a model made capable in one turn (issue 56)"
ABSTAIN_CONTROL = "base_abstain"
INFERENCE = ("sedt", "recap", ABSTAIN_CONTROL)  # on the stage-0 model


def settings(names: Sequence[str], heldout: Path = HELDOUT) -> dict[str, Any]:
    """The ``Comparison`` fields every evaluation shares: the stage-0 model as base, the problems, the
    plan's budget and system prompt, RLAAR's abstain instruction for its arms and their control."""
    from configs.rlsta import EXP2_SYSTEM, EXP3_BUDGET, EXP3_MODEL

    abstain = tuple(n for n in names if n.startswith("rlaar") or n == ABSTAIN_CONTROL)
    return dict(base=EXP3_MODEL, abstain_models=abstain, heldout=str(heldout), max_new_tokens=EXP3_BUDGET,
                system=EXP2_SYSTEM, gzip=True)


def lic_models(names: Sequence[str]) -> list[str]:
    """The plan's LiC models among ``names``: the stage-0 model and every trained arm's seed 0."""
    return ["base", *(n for n in names if n.endswith("_s0"))]


def comparison(names: Sequence[str], runs: Path, results: Path, out: Path, heldout: Path = HELDOUT,
               lic: bool = True) -> Comparison:
    """The ``experiments.compare`` comparison of the stage-0 model, the original model, the arms ``names``
    (trained: their workdirs or committed adapters) and ``INFERENCE``; without ``lic``, greedy only."""
    from configs.rlsta import EXP3_MODEL as base
    models = ("base", f"original={ORIGINAL}", *(f"{n}={model_spec(n, runs, results, base)}" for n in names),
              *(f"{n}={base}" for n in INFERENCE))
    with_lic = set(lic_models(names)) if lic else set()
    every = ("base", "original", *names, *INFERENCE)
    return Comparison(title=TITLE, pairs_with=("base",), models=models,
                      pairs=tuple(f"{n}:{ABSTAIN_CONTROL}" for n in names if n.startswith("rlaar")),
                      strategy=("sedt=sedt",), recap=("recap",), run_files=str(results), out=str(out),
                      greedy_only=tuple(n for n in every if n not in with_lic), lic_runs=4 if with_lic else 0,
                      **settings([*names, *INFERENCE], heldout))
