"""The answer part of a reply that may hold a think block (Qwen3 thinking, DeepSeek-R1 style).

A thinking model writes ``<think>\\n...reasoning...\\n</think>\\n\\nanswer``; the verifier, the
rule-based judge, the LLM judge and the abstention reader all read only the answer: the text
after the last ``</think>``. A think block that never closes (a reply cut inside it by the token
budget) holds no answer: ``""``. A reply without either tag is all answer. A template whose
generation prompt already opens the block (the reply then has ``</think>`` only) reads the same.
"""

from __future__ import annotations

__all__ = ["THINK_CLOSE", "THINK_OPEN", "answer_part", "has_think_block"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def answer_part(reply: str) -> str:
    """The reply after its think block.

    Args:
      reply: a model reply.

    Returns:
      The text after the last ``</think>``; ``""`` when a ``<think>`` is open at the end (none
      closes it, or one opens again after the last ``</think>``); the whole reply when it has
      neither tag. Idempotent: the result holds neither tag.
    """
    close = reply.rfind(THINK_CLOSE)
    if reply.rfind(THINK_OPEN) > close:
        return ""
    return reply if close < 0 else reply[close + len(THINK_CLOSE):]


def has_think_block(reply: str) -> bool:
    """Whether the reply holds a think tag (open or closed)."""
    return THINK_OPEN in reply or THINK_CLOSE in reply
