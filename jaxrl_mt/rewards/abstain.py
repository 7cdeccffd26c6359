r"""Abstention: reading ``\boxed{abstain}`` in a reply, and RLAAR's abstention reward.

A reply abstains when the last ``\boxed{...}`` of its answer holds the word "abstain" alone:
case-insensitive, any spaces, optionally wrapped in ``\text{}`` / ``\textbf{}`` / ``\mathrm{}``
(``\boxed{ Abstain }``, ``\boxed{\text{ABSTAIN}}``). The answer is what follows the last
``</think>`` when the reply has a think block (Qwen3 thinking); a think block that never closes
(a reply cut inside it) holds no answer. A ``\boxed{abstain}`` inside the think block, or followed
by another boxed answer, is no abstention.

RLAAR's reward: on an unsolvable sample (a history with its last shard dropped) 1 for abstaining,
else 0; on a solvable one 0 for abstaining, else the verifier. Registered as the reward ``rlaar``:
an item is unsolvable when its ``kind`` is ``"unsolvable"`` (as ICPO's ``"underspecified"``),
solvable otherwise; the verifier mode is ``rl.verifier_mode``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl_mt.rewards.registry import RewardEnv, RewardFn, RewardOutput, group_rows, register_reward
from jaxrl_mt.rewards.think import answer_part
from jaxrl_mt.rewards.verifier import MAX_CHECKED_CHARS, boxed_contents, verify

__all__ = ["UNSOLVABLE", "abstention_reward", "answer_part", "is_abstain", "rlaar_rewards"]

UNSOLVABLE = "unsolvable"  # the kind of an item whose last shard was dropped

_WRAP_RE = re.compile(r"^\\(?:text|textbf|mathrm|textrm|texttt)\s*\{(.*)\}$", re.DOTALL)


def _unwrap(content: str) -> str:
    s = content.strip()
    while (m := _WRAP_RE.match(s)) is not None:
        s = m.group(1).strip()
    return s


def is_abstain(reply: str) -> bool:
    r"""Whether the reply's final boxed answer is ``\boxed{abstain}`` (see the module docstring).

    Replies longer than the verifier's ``MAX_CHECKED_CHARS`` are not read (no abstention), as the verifier.
    """
    if len(reply) > MAX_CHECKED_CHARS:
        return False
    boxes = boxed_contents(answer_part(reply))
    return bool(boxes) and re.fullmatch(r"abstain", _unwrap(boxes[-1]), re.IGNORECASE) is not None


# The "+ Abstain" instruction (RLSTA's Table 2 evaluation arm; our wording, the paper's is not published)
# and RLAAR's training system prompt: withhold an answer, as \boxed{abstain}, while information is incomplete.
ABSTAIN_INSTRUCTION = ("If the information given so far is not enough to determine the answer, reply with "
                       "\\boxed{abstain}; otherwise put the final answer in \\boxed{}.")


def with_abstain(system: str | None) -> str:
    """``system`` with the abstain instruction appended (alone when there is no system prompt)."""
    return f"{system}\n\n{ABSTAIN_INSTRUCTION}" if system else ABSTAIN_INSTRUCTION


def abstention_reward(reply: str, *, solvable: bool, gold: str, mode: str = "strict") -> float:
    """RLAAR's reward of one reply.

    Args:
      reply: the model's final reply.
      solvable: whether the sample holds every shard (False: its last shard was dropped).
      gold: the gold answer (read on solvable samples only).
      mode: the verifier mode on solvable samples.

    Returns:
      1.0 / 0.0 for abstaining or not on an unsolvable sample; on a solvable one 0.0 for
      abstaining, else ``verify(answer, gold, mode)`` on the answer after any think block.
    """
    if not solvable:
        return 1.0 if is_abstain(reply) else 0.0
    if is_abstain(reply):
        return 0.0
    return verify(reply, gold, mode)  # the verifier reads the answer after any think block


def rlaar_rewards(items: Sequence[Any], generations: Any, group_size: int, mode: str) -> RewardOutput:
    """RLAAR rewards [N] of the generations (rows grouped by item, G each), with their rates and columns.

    Components: ``abstain`` (all rows), ``solvable_acc`` and ``unsolvable_abstain`` (the rows of
    each kind, when present). Columns: ``kind``, ``abstain``, ``gold``.
    """
    rows = group_rows(items, group_size)
    solvable = np.array([it.kind != UNSOLVABLE for it in rows])
    abstain = np.array([is_abstain(t) for t in generations.texts], np.float64)
    reward = np.array([abstention_reward(t, solvable=bool(s), gold=it.answer, mode=mode)
                       for it, t, s in zip(rows, generations.texts, solvable)], np.float64)
    comps = {"abstain": abstain}
    if solvable.any():
        comps["solvable_acc"] = reward[solvable]
    if (~solvable).any():
        comps["unsolvable_abstain"] = reward[~solvable]
    cols = {"kind": [it.kind for it in rows], "abstain": [f"{a:.0f}" for a in abstain],
            "gold": [it.answer for it in rows]}
    return RewardOutput(reward, comps, cols)


@register_reward("rlaar")
def build_rlaar(env: RewardEnv) -> RewardFn:
    """RLAAR: abstention on unsolvable items, the verifier (``rl.verifier_mode``) on solvable ones."""
    mode = env.config.rl.verifier_mode
    return lambda items, generations: rlaar_rewards(items, generations, env.group_size, mode)
