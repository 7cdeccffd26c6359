"""The RLSTA reward and its GRPO baseline, as registered reward functions.

``rlsta``: R = R_v + alpha * R_s, with R_v the verifier (``rl.verifier_mode``) and R_s the
single-turn anchor (``jaxrl_mt.rewards.anchor``: geometric-mean likelihood of the answer under
the frozen reference model given the full single-turn prompt, or the merged user turns with
``rl.anchor_prompt = "merged"``), optionally zeroed for wrong answers in groups with a correct one
(``rl.zero_anchor_for_wrong``). ``grpo``: the same with alpha = 0. R_s is computed and logged in
both, so runs of the two log the same curves.

``rl.verifier_weight`` (default 1; absent from a config = 1) scales R_v: R = w R_v + alpha R_s.
w = 0 is RLSTA without a verifier (the paper's "w/o verifier" arm: the anchor alone). The verifier
still runs and is logged (``reward/verifier``), but the reward never reads it: with w = 0,
``zero_anchor_for_wrong`` (which needs the verdicts) is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl_mt.rewards.anchor import anchor_scores, zero_anchor_for_wrong
from jaxrl_mt.rewards.registry import RewardEnv, RewardFn, RewardOutput, group_rows, register_reward
from jaxrl_mt.rewards.verifier import verify


def rlsta_reward(env: RewardEnv, items: Sequence[Any], generations: Any, *, alpha: float) -> RewardOutput:
    """R = R_v + alpha * R_s of each generation (rows grouped by item, G each)."""
    rl, g = env.config.rl, env.group_size
    r = rl.reward
    w = r.verifier_weight
    if w == 0 and r.zero_anchor_for_wrong:
        raise ValueError("rl.verifier_weight = 0 (no verifier) cannot zero the anchor of wrong answers "
                         "(rl.zero_anchor_for_wrong needs the verifier's verdicts)")
    rows = group_rows(items, g)
    golds = [it.answer for it in rows]
    strict = np.array([verify(t, gold, "strict") for t, gold in zip(generations.texts, golds)], np.float64)
    lenient = np.array([verify(t, gold, "lenient") for t, gold in zip(generations.texts, golds)], np.float64)
    rv = strict if rl.verifier_mode == "strict" else lenient
    anchors = [it.anchor_prompt if r.anchor_prompt == "full" else it.merged_user for it in rows]
    rs, ref = anchor_scores(env.ref_scorer, env.tokenizer, anchors, generations.tokens, system=env.system)
    if r.zero_anchor_for_wrong:
        rs = zero_anchor_for_wrong(rs, rv, g)
    comps = {"verifier": rv, "anchor": rs, "verifier_strict": strict, "verifier_lenient": lenient}
    cols = {"gold": golds, "R_v": [f"{x:.0f}" for x in rv], "R_s": [f"{x:.3f}" for x in rs]}
    return RewardOutput(w * rv + alpha * rs, comps, cols, ref)


@register_reward("rlsta")
def build_rlsta(env: RewardEnv) -> RewardFn:
    """RLSTA: verifier + ``rl.alpha`` x anchor."""
    return lambda items, generations: rlsta_reward(env, items, generations, alpha=env.config.rl.reward.alpha)


@register_reward("grpo")
def build_grpo(env: RewardEnv) -> RewardFn:
    """The GRPO baseline: the verifier alone (the anchor is still logged)."""
    return lambda items, generations: rlsta_reward(env, items, generations, alpha=0.0)
