"""The per-turn reward of RL over whole conversations (``method = "rlsta_conv"``), a registered reward.

Its items are the rollout's assistant turns (``rl.conv_rollout.TurnItem``, one generation each),
its generations their replies (``texts``, ``tokens``). A turn's reward is

    r = w * R_v + alpha * R_s + c * R_c + o * R_o

- ``R_v``, the verifier on answer attempts: +1 for a right answer, ``rlsta_conv.wrong_penalty`` for a
  wrong one, 0 when the answer-attempt judge called the reply no attempt (a question, a hedge);
- ``R_s``, the turn anchor: the frozen reference model's geometric-mean likelihood of the reply
  under the single-turn prompt made of the shards revealed so far (RLSTA's anchor, per turn);
- ``R_c``, ICPO-style credit for not answering while the problem is still underspecified (a
  non-answer response type before the last shard), 0 once every shard is revealed;
- ``R_o``, the outcome: the last turn's verifier (1 right, 0 otherwise), on the last turn only.

``w`` is ``rl.verifier_weight`` and ``alpha`` ``rl.alpha`` (as RLSTA's), ``c``
``rlsta_conv.clarify_weight`` and ``o`` ``rlsta_conv.outcome_weight``. A verifier that raises on a (hostile)
reply gives that turn no verifier term; no reply ends a run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxrl_mt.rewards.anchor import anchor_scores
from jaxrl_mt.rewards.judge import NON_ANSWER_TYPES
from jaxrl_mt.rewards.registry import RewardEnv, RewardFn, RewardOutput, register_reward
from jaxrl_mt.rewards.verifier import verify

__all__ = ["TurnGenerations", "conversation_turn_reward", "verifier_terms"]

log = logging.getLogger(__name__)


class TurnGenerations(NamedTuple):
    """The replies of a rollout's turns (what the reward reads of a ``GenerationResult``)."""

    texts: Sequence[str]
    tokens: Sequence[Sequence[int]]


def _right(text: str, gold: str, mode: str) -> float | None:
    """The verifier's verdict (1.0 / 0.0), None when it raises on the reply."""
    try:
        return float(verify(text, gold, mode))
    except Exception as e:  # a reply never ends the run
        log.warning("the verifier raised on a %d-character reply: %s", len(text), type(e).__name__)
        return None


def verifier_terms(items: Sequence[Any], texts: Sequence[str], mode: str, wrong_penalty: float
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(R_v [N], right [N]): the verifier term of each turn and whether it is a right answer attempt."""
    rv, right = np.zeros(len(items)), np.zeros(len(items))
    for i, (it, text) in enumerate(zip(items, texts)):
        if not it.attempt:
            continue
        ok = _right(text, it.answer, mode)
        if ok is None:
            continue
        right[i] = ok
        rv[i] = 1.0 if ok else wrong_penalty
    return rv, right


def conversation_turn_reward(env: RewardEnv, items: Sequence[Any], generations: Any) -> RewardOutput:
    """The reward of each turn (see the module doc); components and sample-table columns per turn."""
    c, r = env.config, env.config.rl.reward
    conv = c.rlsta_conv
    rv, right = verifier_terms(items, generations.texts, c.rl.verifier_mode, conv.wrong_penalty)
    rs, _ = anchor_scores(env.ref_scorer, env.tokenizer, [it.revealed for it in items], generations.tokens,
                          system=env.system)
    rc = np.array([float(not it.complete and it.label in NON_ANSWER_TYPES) for it in items])
    ro = np.array([float(it.last) * ok for it, ok in zip(items, right)])
    total = r.verifier_weight * rv + r.alpha * rs + conv.clarify_weight * rc + conv.outcome_weight * ro
    comps = {"verifier": rv, "anchor": rs, "clarify": rc, "outcome": ro,
             "attempt": np.array([float(it.attempt) for it in items])}
    cols = {"turn": [str(it.turn) for it in items], "gold": [it.answer for it in items],
            "R_v": [f"{x:+.1f}" for x in rv], "R_s": [f"{x:.3f}" for x in rs]}
    return RewardOutput(total, comps, cols)


@register_reward("rlsta_conv")
def build_conversation(env: RewardEnv) -> RewardFn:
    """RL over whole conversations: the per-turn reward (one generation per item)."""
    return lambda items, generations: conversation_turn_reward(env, items, generations)
