"""Reward-honesty statistics of a batch of completions: is a lenient verifier being gamed?

The lenient verifier accepts a reply when any of its last three numbers equals the gold answer,
so a policy can raise its reward by listing several numbers. Logged next to the strict and
lenient rewards every step, these show whether that happens: the mean count of distinct numbers
on the reply's final line rises, and the lenient-minus-strict gap widens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jaxrl_mt.rewards.verifier import find_numbers, format_number, verify

__all__ = ["answer_stats", "distinct_numbers_final_line", "final_line"]


def final_line(text: str) -> str:
    """The last non-empty line of ``text`` (stripped), or "" when there is none."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def distinct_numbers_final_line(text: str) -> int:
    """How many distinct numeric values the final line of ``text`` holds."""
    return len({format_number(v) for v in find_numbers(final_line(text))})


def answer_stats(texts: Sequence[str], golds: Sequence[str]) -> dict[str, float]:
    """Batch statistics, keys ``answer/...``:

    - ``distinct_numbers_final_line``: mean count of distinct numbers on the final line;
    - ``multi_number_final_line_frac``: share of replies whose final line holds >= 2 numbers;
    - ``strict_acc`` / ``lenient_acc`` and ``lenient_minus_strict``: the two verifiers and their gap.

    Raises:
      ValueError: ``texts`` and ``golds`` differ in length, or a gold holds no number.
    """
    if len(texts) != len(golds):
        raise ValueError(f"answer_stats: {len(texts)} texts but {len(golds)} gold answers")
    if not texts:
        return {}
    counts = np.array([distinct_numbers_final_line(t) for t in texts], np.float64)
    strict = np.array([verify(t, g, "strict") for t, g in zip(texts, golds)], np.float64)
    lenient = np.array([verify(t, g, "lenient") for t, g in zip(texts, golds)], np.float64)
    return {"answer/distinct_numbers_final_line": float(counts.mean()),
            "answer/multi_number_final_line_frac": float((counts >= 2).mean()),
            "answer/strict_acc": float(strict.mean()), "answer/lenient_acc": float(lenient.mean()),
            "answer/lenient_minus_strict": float(lenient.mean() - strict.mean())}
