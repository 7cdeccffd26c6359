"""Experiment 3's problem files (issue 56; docs/results/experiment3_plan.md) and their checks.

    python -m experiments.exp3_data --out docs/results/exp3/data

Writes three tasks JSONL files (read with ``tasks:FILE``), each a pure function of the sizes below:

- ``train.jsonl``: ``arith`` problems of the ``train`` templates, seed 0 (stage 0's SFT and every
  arm's training problems);
- ``validation.jsonl``: the same templates, seed 1, with every problem whose text is also a
  training problem's dropped: the split every choice (stage-0 threshold, budget, LoRA-or-full,
  checkpoints) is made on;
- ``heldout.jsonl``: the ``heldout`` templates (no sentence, name or object shared), seed 0: only
  ever evaluated.

two subsets, the first problems of each step count of their split: ``arms.jsonl`` (128 of train: the
arms' multi-turn training problems, histories and rollouts) and ``probe.jsonl`` (96 of validation:
the probe every arm's checkpoint is selected on); and ``checks.json``: sizes, the share of problems
holding each operation, and the shortcut rules'
accuracy (add every number, the last, the first, the largest) per split, read by the plan's rules.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from experiments.exp2_audit import RULES, shortcut_scores
from experiments.heldout import check_disjoint, normalise
from jaxrl_mt.data.arith import OPS, arith_tasks
from jaxrl_mt.data.loaders import save_tasks_jsonl
from jaxrl_mt.data.records import ShardedTask

__all__ = ["SIZES", "build", "split_checks"]

# problems per number of steps (1, 2, 3); the step mix keeps every operation under 40% of problems
SIZES = {"train": (800, 800, 400), "validation": (104, 88, 48), "heldout": (160, 160, 96)}
SEEDS = {"train": 0, "validation": 1, "heldout": 0}
SUBSETS = {"arms": ("train", (60, 48, 20)), "probe": ("validation", (40, 40, 16))}  # per step count


def _split(name: str, skip: set[str] = frozenset()) -> list[ShardedTask]:
    """The split's problems per step count: the first SIZES[name] of the stream whose normalised text
    is not in ``skip``."""
    tset = "heldout" if name == "heldout" else "train"
    out = []
    for steps, n in zip((1, 2, 3), SIZES[name]):
        stream = [t for t in arith_tasks(tset, 4 * n, steps=steps, seed=SEEDS[name])
                  if normalise(t.full_prompt) not in skip]
        out += stream[:n]
    return out


def build() -> dict[str, list[ShardedTask]]:
    """The three splits (validation without any problem whose normalised text is a training problem's)
    and the two subsets."""
    train = _split("train")
    validation = _split("validation", {normalise(t.full_prompt) for t in train})
    heldout = _split("heldout")
    check_disjoint(heldout, train + validation)
    out = {"train": train, "validation": validation, "heldout": heldout}
    for name, (of, sizes) in SUBSETS.items():
        by_steps = {k: [x for x in out[of] if x.meta["steps"] == k] for k in (1, 2, 3)}
        out[name] = [t for k, n in zip((1, 2, 3), sizes) for t in by_steps[k][:n]]
    return out


def split_checks(tasks: list[ShardedTask]) -> dict[str, Any]:
    """Size, steps, the % of problems holding each operation, and each shortcut rule's accuracy (%)."""
    n = len(tasks)
    holding = Counter(op for t in tasks for op in set(t.meta["synthetic_ops"]))
    problems = [{"task_id": t.task_id, "answer": t.answer, "full_prompt": t.full_prompt} for t in tasks]
    rules = {r: sum(v.values()) for r, v in shortcut_scores(problems, {}).items()}
    return {"problems": n, "steps": dict(sorted(Counter(t.meta["steps"] for t in tasks).items())),
            "holding_op_pct": {op: round(100 * holding[op] / n, 1) for op in OPS},
            "shortcut_pct": {r: round(100 * rules[r] / n, 1) for r in RULES}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("docs/results/exp3/data"))
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    checks = {}
    for name, tasks in build().items():
        save_tasks_jsonl(a.out / f"{name}.jsonl", tasks)
        checks[name] = split_checks(tasks)
    (a.out / "checks.json").write_text(json.dumps(checks, indent=1) + "\n")
    print(json.dumps(checks, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
