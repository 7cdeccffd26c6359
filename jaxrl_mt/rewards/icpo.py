"""ICPO's reward: the verifier on complete prompts, a non-answer on underspecified ones.

On an underspecified prompt (1-2 required conditions removed) a reply earns 1 when it does not
commit to an answer: clarification, interrogation, discussion, hedging or refusal, as judged by
the response-type judge (rule-based, or an LLM backend with ``icpo.judge``); else 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl_mt.rewards.judge import NON_ANSWER_TYPES, RESPONSE_TYPES, classify_llm, classify_rule_based
from jaxrl_mt.rewards.registry import RewardEnv, RewardFn, RewardOutput, group_rows, register_reward
from jaxrl_mt.rewards.verifier import verify

COMPLETE, UNDERSPECIFIED = "complete", "underspecified"


def icpo_reward(kind: str, text: str, gold: str, response_type: str, *, mode: str = "strict") -> float:
    """The ICPO reward of one reply.

    Args:
      kind: "complete" or "underspecified".
      text: the reply; gold: the gold answer of the (complete) problem.
      response_type: the judge's verdict (one of RESPONSE_TYPES).
      mode: verifier mode for complete prompts.
    """
    if kind == COMPLETE:
        return float(verify(text, gold, mode))
    if kind == UNDERSPECIFIED:
        if response_type not in RESPONSE_TYPES:
            raise ValueError(f"unknown response type {response_type!r}")
        return 1.0 if response_type in NON_ANSWER_TYPES else 0.0
    raise ValueError(f"unknown ICPO prompt kind {kind!r}; expected {COMPLETE!r} or {UNDERSPECIFIED!r}")


class ResponseJudge:
    """The response-type judge of ICPO: rule-based, or an LLM behind a backend spec."""

    def __init__(self, spec: str = "rule"):
        self.backend = None
        if spec != "rule":
            from jaxrl_mt.backends import make_backend

            self.backend = make_backend(spec)

    def __call__(self, texts: Sequence[str], questions: Sequence[str]) -> list[str]:
        if self.backend is None:
            return [classify_rule_based(t, question=q, user=q) for t, q in zip(texts, questions)]
        return classify_llm(self.backend, list(texts), list(questions))


def icpo_rewards(judge: ResponseJudge, items: Sequence[Any], generations: Any, group_size: int, mode: str
                 ) -> RewardOutput:
    """ICPO rewards of the generations (rows grouped by item, G each), their type fractions and columns."""
    rows = group_rows(items, group_size)
    types = judge(generations.texts, [it.last_user for it in rows])
    reward = np.array([icpo_reward(it.kind, t, it.answer, ty, mode=mode)
                       for it, t, ty in zip(rows, generations.texts, types)], np.float64)
    complete = np.array([it.kind == COMPLETE for it in rows])
    comps = {f"type_{t}": np.array([ty == t for ty in types], np.float64) for t in RESPONSE_TYPES}
    if complete.any():
        comps["complete_acc"] = reward[complete]
    if (~complete).any():
        comps["underspecified_non_answer"] = reward[~complete]
    cols = {"kind": [it.kind for it in rows], "type": types, "gold": [it.answer for it in rows]}
    return RewardOutput(reward, comps, cols)


@register_reward("icpo")
def build_icpo(env: RewardEnv) -> RewardFn:
    """ICPO with the judge ``icpo.judge`` and the verifier mode ``rl.verifier_mode``."""
    judge = ResponseJudge(env.config.icpo.judge)
    mode = env.config.rl.verifier_mode
    return lambda items, generations: icpo_rewards(judge, items, generations, env.group_size, mode)
