"""The LLM judge: LiC-style response-type classification and answer extraction by a chat model.

Like the Lost-in-Conversation harness, one prompt asks the judge model for two things about an
assistant reply: which response type it is (the categories of ``judge_rules.RESPONSE_TYPES``)
and, for an answer attempt, the answer it commits to, extracted verbatim. The reply format is
two lines, ``Category: NAME`` and ``Answer: TEXT`` (``none`` when there is no answer).

A judge reply that names no category falls back to the rule-based verdict; the fallbacks are
counted in ``stats["fallback"]`` so a report can flag them.

Think blocks (``rewards.think.answer_part``): the judge is shown only the answer after the
assistant's think block (a reply whose think block never closes is ``missing``, not asked), and
a judge that thinks itself is read after its own think block.
"""

from __future__ import annotations

import logging
import re
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass

from jaxrl_mt.rewards.judge_rules import clean_reply, classify_rule_based
from jaxrl_mt.rewards.think import answer_part
from jaxrl_mt.rewards.verifier import MAX_CHECKED_CHARS

__all__ = ["JUDGE_PROMPT", "LLMVerdict", "classify_llm", "judge_llm", "parse_judge_answer", "parse_judge_reply"]

log = logging.getLogger(__name__)

JUDGE_PROMPT = """\
You are reviewing one reply that an AI assistant wrote in a conversation with a user. The user \
gave the assistant a task (for example, a math word problem), possibly over several messages. \
Your job has two parts.

1. Decide which ONE category describes the reply:
answer_attempt: the reply commits to an answer to the task, in any form, right or wrong: for a \
math problem, one value for the quantity asked ("The answer is 17", "She has 17 apples.", a bare \
"17", a value reached at the end of a calculation, or an estimate such as "about 20"). An answer \
built on an assumption the assistant states itself is still an answer attempt.
clarification: no answer; the reply asks the user exactly one question about the task.
interrogation: no answer; the reply asks the user two or more questions.
discussion: no answer and no question to the user: it restates the task, plans or explains the \
steps, or stops before reaching a final value.
hedging: the reply offers two or more alternative or conditional answers ("if X then 5, if Y then 7").
refusal: the reply declines, or says the task cannot be done, without asking the user anything.
missing: empty, only special tokens, or degenerate text such as endless repetition.

2. If the category is answer_attempt, extract the answer the reply commits to, exactly as written \
(for math: the final number only, without units). Otherwise write none.

The task:
<task>
{question}
</task>

The assistant's reply:
<reply>
{response}
</reply>

Reply with exactly two lines:
Category: NAME
Answer: ANSWER or none"""

_SYNONYMS = {
    "answer": "answer_attempt", "answer_attempt": "answer_attempt", "attempt": "answer_attempt",
    "clarification": "clarification", "clarifying_question": "clarification",
    "clarification_question": "clarification", "interrogation": "interrogation",
    "discussion": "discussion", "hedging": "hedging", "hedge": "hedging", "refusal": "refusal",
    "refuse": "refusal", "missing": "missing", "empty": "missing",
}
_CATEGORY_LINE_RE = re.compile(r"category\s*[:=\-]\s*[*_`\"']*\s*([a-z][a-z_ \-]*)", re.IGNORECASE)
# "^[^\w\n]*" (not "^\W*", which crosses lines and backtracks quadratically): the same lines match.
_ANSWER_LINE_RE = re.compile(r"^[^\w\n]*answer\s*[:=]\s*(.*?)\s*$", re.IGNORECASE | re.MULTILINE)
_LABEL_WORD_RE = re.compile(
    r"answer[_ \-]attempt|clarification|interrogation|discussion|hedging|refusal|missing", re.IGNORECASE)
_LEADING_LABEL_RE = re.compile(r"answer[_ \-]attempt|[a-z_]+", re.IGNORECASE)
_NONE_RE = re.compile(r"^[\W_]*(?:none|n/?a|null|no answer|-)?[\W_]*$", re.IGNORECASE)


@dataclass(frozen=True)
class LLMVerdict:
    """What the LLM judge said about one reply."""

    label: str  # one of RESPONSE_TYPES
    answer: str | None  # the extracted answer of an answer attempt, else None
    source: str  # "llm", "fallback" (rule-based: the judge named no category) or "empty"


def _normalise_label(raw: str) -> str | None:
    """The category a short string names exactly ("Answer attempt", "hedge."), else None."""
    key = re.sub(r"[\s\-]+", "_", raw.strip().lower()).strip("_.*`'\"")
    return _SYNONYMS.get(key)


def parse_judge_reply(reply: str) -> str | None:
    """Reads the category out of an LLM judge's reply.

    Accepts ``Category: NAME`` anywhere (markdown and case ignored), a reply that is just a
    category name, or a reply that mentions exactly one category name (the ``Answer:`` line is
    ignored for this).

    Returns:
      One of ``RESPONSE_TYPES``, or None if the reply names no category unambiguously (or is
      longer than ``MAX_CHECKED_CHARS``: not read).
    """
    if len(reply) > MAX_CHECKED_CHARS:
        return None
    reply = answer_part(reply)
    for m in reversed(list(_CATEGORY_LINE_RE.finditer(reply))):
        label = _normalise_label(_LEADING_LABEL_RE.match(m.group(1)).group(0))
        if label is not None:
            return label
    label = _normalise_label(reply)
    if label is not None:
        return label
    body = _ANSWER_LINE_RE.sub("", reply)
    found = {_normalise_label(m.group(0)) for m in _LABEL_WORD_RE.finditer(body)}
    return found.pop() if len(found) == 1 else None


def parse_judge_answer(reply: str) -> str | None:
    """The text of the last ``Answer:`` line, or None when absent or ``none`` (or the reply is
    longer than ``MAX_CHECKED_CHARS``)."""
    if len(reply) > MAX_CHECKED_CHARS:
        return None
    found = _ANSWER_LINE_RE.findall(answer_part(reply))
    if not found:
        return None
    ans = found[-1].strip().strip("*`\"'").strip()
    return None if _NONE_RE.match(ans) else ans


def judge_llm(backend, texts: Sequence[str], questions: Sequence[str] | None = None, *, domain: str = "math",
              max_new_tokens: int = 32, stats: MutableMapping[str, int] | None = None) -> list[LLMVerdict]:
    """Classifies replies and extracts their answers with an LLM judge behind a ``ChatBackend``.

    Empty replies (and replies whose think block never closes) are ``missing`` without asking
    the backend; the judge sees the answer after a think block. A judge reply that names no
    category falls back to ``classify_rule_based`` (counted in ``stats["fallback"]`` and
    logged); ``stats["llm"]`` counts the verdicts taken from the judge. Only an answer attempt
    keeps an extracted answer.

    Args:
      backend: a ``jaxrl_mt.backends.ChatBackend``.
      texts: ``B`` assistant replies.
      questions: ``B`` task statements shown to the judge (optional).
      domain: passed to the rule-based fallback.
      max_new_tokens: the judge's reply budget (two short lines).
      stats: optional counter dict updated in place.

    Returns:
      ``B`` verdicts.
    """
    if questions is not None and len(questions) != len(texts):
        raise ValueError(f"judge_llm: {len(texts)} texts but {len(questions)} questions")
    texts = [answer_part(t) for t in texts]  # the answer after a think block
    counts = stats if stats is not None else {}
    for key in ("llm", "fallback", "empty"):
        counts.setdefault(key, 0)
    out: list[LLMVerdict | None] = [None] * len(texts)
    asked = [i for i, t in enumerate(texts) if clean_reply(t)]
    for i in set(range(len(texts))) - set(asked):
        out[i] = LLMVerdict("missing", None, "empty")
        counts["empty"] += 1
    if asked:
        prompts = [[{"role": "user", "content": JUDGE_PROMPT.format(
            question=questions[i] if questions is not None else "(not shown)", response=texts[i])}] for i in asked]
        replies = backend.chat(prompts, max_new_tokens=max_new_tokens, temperature=0.0)
        if len(replies) != len(asked):
            raise ValueError(f"judge_llm: backend gave {len(replies)} replies for {len(asked)}")
        for i, reply in zip(asked, replies):
            label = parse_judge_reply(reply)
            if label is None:
                counts["fallback"] += 1
                log.warning("judge reply %r names no category; using the rule-based verdict", reply)
                out[i] = LLMVerdict(classify_rule_based(texts[i], domain, question=questions[i] if questions else None),
                                    None, "fallback")
            else:
                counts["llm"] += 1
                answer = parse_judge_answer(reply) if label == "answer_attempt" else None
                out[i] = LLMVerdict(label, answer, "llm")
    return [v for v in out if v is not None]


def classify_llm(backend, texts: Sequence[str], questions: Sequence[str] | None = None, *, domain: str = "math",
                 max_new_tokens: int = 32, stats: MutableMapping[str, int] | None = None) -> list[str]:
    """The labels of :func:`judge_llm` (same arguments)."""
    return [v.label for v in judge_llm(backend, texts, questions, domain=domain, max_new_tokens=max_new_tokens,
                                       stats=stats)]
