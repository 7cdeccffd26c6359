"""RLSTA's single-turn anchor reward, computed with the project's scorer.

R_s = exp(mean_t log p_ref(y_t | anchor prompt, y_<t)): the geometric-mean likelihood of the
sampled final answer y under the frozen reference model, given the clean full single-turn prompt
(rendered with the chat template, as a one-turn conversation).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.rewards.registry import RefLogprobs
from jaxrl_mt.scoring import Scorer


def anchor_contexts(tokenizer: Any, anchor_prompts: Sequence[str], *, system: str | None = None) -> list[list[int]]:
    """Token ids of each anchor prompt as a one-turn chat prompt (generation header included)."""
    return [encode_prompt(tokenizer, [{"role": "user", "content": p}], system=system) for p in anchor_prompts]


def anchor_scores(scorer: Scorer, tokenizer: Any, anchor_prompts: Sequence[str],
                  completions: Sequence[Sequence[int]], *, system: str | None = None
                  ) -> tuple[np.ndarray, RefLogprobs]:
    """Geometric-mean likelihood [N] of each completion (token ids) under its anchor prompt, and the
    per-token reference log-probs it computed (``RefLogprobs``; None for empty completions).

    Empty completions get 0 (nothing was answered). The scorer is called even when every
    completion is empty (a call of no rows costs nothing): under a multi-process mesh its call
    is collective, and every process must take part.
    """
    ctx = anchor_contexts(tokenizer, anchor_prompts, system=system)
    comps = [list(c) for c in completions]
    nonempty = [i for i, c in enumerate(comps) if c]
    out = np.zeros(len(comps), np.float64)
    r = scorer.score([ctx[i] for i in nonempty], [comps[i] for i in nonempty])
    out[nonempty] = r.geo_mean
    lps: list[np.ndarray | None] = [None] * len(comps)
    for i, lp in zip(nonempty, r.logprobs):
        lps[i] = np.asarray(lp, np.float32)
    return out, RefLogprobs(ctx, comps, lps)


def anchor_reward(scorer: Scorer, tokenizer: Any, anchor_prompts: Sequence[str],
                  completions: Sequence[Sequence[int]], *, system: str | None = None) -> np.ndarray:
    """Geometric-mean likelihood [N] of each completion under its anchor prompt (``anchor_scores``' first part)."""
    return anchor_scores(scorer, tokenizer, anchor_prompts, completions, system=system)[0]


def zero_anchor_for_wrong(anchor: np.ndarray, correct: np.ndarray, group_size: int) -> np.ndarray:
    """Zeroes R_s of wrong answers in groups that contain at least one correct answer.

    Args:
      anchor: [N] anchor rewards; correct: [N] 0/1 verifier outcomes; N = B * group_size.
    """
    a = anchor.reshape(-1, group_size).copy()  # [B, G]
    c = correct.reshape(-1, group_size) > 0
    has = c.any(axis=1, keepdims=True)
    a[has & ~c] = 0.0
    return a.reshape(-1)
