"""Judging LiC replies: the response-type judge (rule or LLM) and the per-turn verdict.

Both guard against hostile replies: a judge or verifier that raises on a reply labels it a
non-answer (``checker_error`` for the verifier) and logs why; no reply ends a run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from jaxrl_mt.eval.task_scoring import CHECKER_ERROR, NO_ANSWER_LABEL
from jaxrl_mt.rewards.abstain import is_abstain
from jaxrl_mt.rewards.judge import classify_rule_based, judge_llm
from jaxrl_mt.rewards.verifier import extract_answer, verify

__all__ = ["Judge", "checked_judge_turn", "judge_turn", "make_judge"]

log = logging.getLogger(__name__)

ABSTAIN_LABEL = "refusal"  # the response type of a \boxed{abstain} reply (it declines to answer)


class Judge:
    """Labels assistant replies with the LiC response types (``jaxrl_mt.rewards.judge``)."""

    def __init__(self, backend: Any = None, *, max_new_tokens: int = 32, name: str = "rule"):
        """Args:
          backend: None for the rule-based judge, else a ChatBackend for ``judge_llm``.
          max_new_tokens: the LLM judge's reply budget.
          name: how the report names this judge.
        """
        self.backend = backend
        self.max_new_tokens = max_new_tokens
        self.name = name
        self.stats: dict[str, int] = {}

    def judge(self, texts: Sequence[str], questions: Sequence[str], domains: Sequence[str],
              users: Sequence[str] | None = None) -> list[tuple[str, str | None]]:
        """``(label, extracted answer or None)`` per reply; the rule-based judge extracts nothing
        (the verifier does) and reads the question and the user message the reply answers as
        context; an LLM judge is asked once per domain present (once in math)."""
        if self.backend is None:
            users = users if users is not None else [None] * len(texts)
            return [(_rule_label(t, d, q, u), None) for t, q, d, u in zip(texts, questions, domains, users)]
        out: list[tuple[str, str | None]] = [("", None)] * len(texts)
        for dom in dict.fromkeys(domains):
            idx = [i for i, d in enumerate(domains) if d == dom]
            got = judge_llm(self.backend, [texts[i] for i in idx], [questions[i] for i in idx],
                            domain=dom, max_new_tokens=self.max_new_tokens, stats=self.stats)
            for i, v in zip(idx, got):
                out[i] = (v.label, v.answer)
        return out

    def classify(self, texts: Sequence[str], questions: Sequence[str], domains: Sequence[str]) -> list[str]:
        """One label per reply."""
        return [label for label, _ in self.judge(texts, questions, domains)]


def _why(e: Exception) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:300]


def _rule_label(text: str, domain: str, question: str, user: str | None) -> str:
    """The rule judge's label; a judge that raises on a (hostile) reply labels it a non-answer."""
    if is_abstain(text):  # "+ Abstain" / RLAAR: a withheld answer is a non-answer
        return ABSTAIN_LABEL
    try:
        return classify_rule_based(text, domain, question=question, user=user)
    except Exception as e:  # a reply never ends the run
        log.warning("the rule judge raised on a %d-character reply: %s", len(text), _why(e))
        return NO_ANSWER_LABEL


def checked_judge_turn(text: str, gold: str, label: str, mode: str, answer: str | None) -> dict[str, Any]:
    """:func:`judge_turn`, or a ``checker_error`` verdict (score 0) when the verifier raises."""
    try:
        return judge_turn(text, gold, label, mode, answer)
    except Exception as e:  # a reply never ends the run
        log.warning("the verifier raised on a %d-character reply: %s", len(text), _why(e))
        return {"label": label if label != "answer_attempt" else NO_ANSWER_LABEL, "answer_attempt": False,
                "extracted": None, "correct": 0.0, "correct_strict": 0.0, "status": CHECKER_ERROR,
                "reason": f"the checker raised {_why(e)}"}


def make_judge(spec: str, *, model: Any = None, max_new_tokens: int = 32, **backend_kw: Any) -> Judge:
    """``"rule"`` or a backend spec (``"local"``, ``"local:MODEL"``, ``"http:URL#MODEL"``)."""
    if spec == "rule":
        return Judge(name="rule")
    from jaxrl_mt.eval.user_sim import backend_for

    return Judge(backend_for(spec, model=model, role="judge", **backend_kw), max_new_tokens=max_new_tokens, name=spec)


def judge_turn(text: str, gold: str, label: str, mode: str, judge_answer: str | None = None) -> dict[str, Any]:
    """The verdict stored in ``turn.info``: the judge's label and the verifier's check.

    Args:
      text: the reply.
      gold: the gold answer.
      label: the judge's response type.
      mode: the verifier mode of ``correct``.
      judge_answer: the answer an LLM judge extracted (LiC's answer extraction), or None. When
        given, ``extracted`` is that answer and ``correct`` checks it; else the verifier extracts.

    Returns:
      ``{"label", "answer_attempt", "extracted", "correct", "correct_strict"}``; ``correct`` is
      the verifier's score of the answer (0/1) in ``mode`` whatever the label, ``correct_strict``
      the strict verifier's score of the reply itself (the report's judge-free cross-check).
    """
    strict = float(verify(text, gold, "strict"))
    if judge_answer is not None:
        extracted, correct = judge_answer, float(verify(f"The answer is {judge_answer}", gold, mode))
    else:
        extracted = extract_answer(text)
        correct = strict if mode == "strict" else float(verify(text, gold, mode))
    return {"label": label, "answer_attempt": label == "answer_attempt",
            "extracted": extracted, "correct": correct, "correct_strict": strict}
