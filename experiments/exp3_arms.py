"""Experiment 3's arms (docs/results/experiment3_plan.md, section 4): the table, trained in its order.

Every arm starts from the stage-0 model at the plan's budget and system prompt (the presets'
``experiment3``: configs/rlsta.py's recipe, LoRA rank 16 at lr 1e-4, the validation probe and its
checkpoint selection). ``rlsta_s0`` runs the data stage (histories and the latent-capability filter
on ``arms.jsonl``); the arms training on histories share its filtered items; SFT and DPO share the
filter's samples; ICPO, RLAAR and conversation-level RL make their own prompts from the items'
problems (``arm_runs.PROBLEMS``). The order: every arm's seed 0, then seed 1, then the third seed of
SFT, GRPO and both RLSTA readings; workdirs ``runs/exp3/<arm>``, small files and adapters
``docs/results/exp3/runs/<arm>`` (``arm_runs``).
"""

from __future__ import annotations

from pathlib import Path

from experiments.arm_runs import PROBLEMS, Arm, ArmPlan

__all__ = ["ARMS", "DATA", "PLAN", "RESULTS", "RUNS", "SEEDS"]

RUNS = Path("runs/exp3")
RESULTS = Path("docs/results/exp3/runs")
DATA = Path("docs/results/exp3/items")  # the data stage's files, committed: a new checkout skips that stage
ARMS_CONFIG = "configs/rlsta.py:experiment3"  # the data stage's config (its problem sources)
ON_PROBLEMS = ("--config.data.add_source=tasks:{data}/" + PROBLEMS,)
# RLSTA without a verifier, as configs/rlsta.py's `no_verifier` (the mask of wrong answers needs verdicts: off)
NO_VERIFIER = ("--config.rl.verifier_weight=0.0", "--config.rl.zero_anchor_for_wrong=False")

# arm -> (config, overrides, shares the items, shares the filter's samples); the plan's seeds below
_RECIPES: dict[str, tuple[str, tuple[str, ...], bool, bool]] = {
    "rlsta": ("configs/rlsta.py:experiment3", (), True, False),  # as described: alpha 1, wrong answers' anchor 0
    "grpo": ("configs/grpo.py:experiment3", (), True, False),
    "rlsta_official": ("configs/rlsta.py:experiment3_official", (), True, False),  # alpha 1/G, no mask, dapo
    "sft": ("configs/sft.py:experiment3", (), True, True),
    "dpo": ("configs/dpo.py:experiment3", (), True, True),
    "rlsta_nv": ("configs/rlsta.py:experiment3", NO_VERIFIER, True, False),
    "icpo": ("configs/icpo.py:experiment3", ON_PROBLEMS, False, False),
    "rlaar": ("configs/rlaar.py:experiment3", ON_PROBLEMS, False, False),
    "conv": ("configs/rlsta_conv.py:experiment3", ON_PROBLEMS, False, False),
}
SEEDS = {"rlsta": 3, "grpo": 3, "rlsta_official": 3, "sft": 3, "dpo": 2, "rlsta_nv": 2, "icpo": 2, "rlaar": 2,
         "conv": 2}


def _table() -> dict[str, Arm]:
    """Seed 0 of every arm, then seed 1, then seed 2 of the arms with three (the plan's table)."""
    arms = {}
    for seed in range(max(SEEDS.values())):
        for name, (config, overrides, items, texts) in _RECIPES.items():
            if seed < SEEDS[name]:
                arms[f"{name}_s{seed}"] = Arm(config, seed, overrides, shares_items=items, shares_texts=texts)
    return arms


ARMS: dict[str, Arm] = _table()
PLAN = ArmPlan("exp3", ARMS, "rlsta_s0", ARMS_CONFIG)
