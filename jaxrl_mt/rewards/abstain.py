r"""Abstention: reading ``\boxed{abstain}`` in a reply, and RLAAR's abstention reward.

A reply abstains when the last ``\boxed{...}`` of its answer holds the word "abstain" alone:
case-insensitive, any spaces, optionally wrapped in ``\text{}`` / ``\textbf{}`` / ``\mathrm{}``
(``\boxed{ Abstain }``, ``\boxed{\text{ABSTAIN}}``). The answer is what follows the last
``</think>`` when the reply has a think block (Qwen3 thinking); a think block that never closes
(a reply cut inside it) holds no answer. A ``\boxed{abstain}`` inside the think block, or followed
by another boxed answer, is no abstention.

RLAAR's reward: on an unsolvable sample (a history with its last shard dropped) 1 for abstaining,
else 0; on a solvable one 0 for abstaining, else the verifier.
"""

from __future__ import annotations

import re

from jaxrl_mt.rewards.verifier import MAX_CHECKED_CHARS, boxed_contents, verify

__all__ = ["abstention_reward", "answer_part", "is_abstain"]

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_WRAP_RE = re.compile(r"^\\(?:text|textbf|mathrm|textrm|texttt)\s*\{(.*)\}$", re.DOTALL)


def answer_part(reply: str) -> str:
    """The reply after its think block: the text after the last ``</think>``; ``""`` when a
    ``<think>`` never closes; the whole reply when there is no think block."""
    if _THINK_CLOSE in reply:
        return reply.rsplit(_THINK_CLOSE, 1)[1]
    if _THINK_OPEN in reply:
        return ""
    return reply


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
    return verify(answer_part(reply), gold, mode)
