"""LiC's summary and data2text tasks, graded by an LLM judge (they have no offline verifier).

LiC scores data2text (ToTTo) with reference metrics and summary with LLM judgements of coverage
and citations. Neither runs offline here: a :class:`JudgedTask` asks a chat backend (the
evaluation's HTTP judge) to grade each reply against the record's reference answer(s) on a 0-10
scale, and the score is that grade / 10. This is an LLM grade, not LiC's own metric; reports
should say so.

Records: ``load_lic(path, task="data2text")`` keeps the task fields in ``lic_extra``; the
references are the first of ``references`` (a list or one text), ``reference``, ``answer``
present, else the task's ``answer``. LiC's *summary* records cannot be loaded at all: their
shards carry document ids, not text, and ``load_lic`` rejects them with a DataError.
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from typing import Any

from jaxrl_mt.data.records import DataError, ShardedTask
from jaxrl_mt.rewards.judge_rules import classify_rule_based
from jaxrl_mt.tasks.base import Verdict, lic_extra

__all__ = ["GRADE_PROMPT", "JUDGED_TASK_NAMES", "JudgedTask", "parse_grade", "references_of"]

JUDGED_TASK_NAMES = ("data2text", "summary")
SYSTEM_PROMPTS = {
    "data2text": "You are a helpful assistant. Work with the user until the request is clear; when you answer, "
                 "write the one-sentence description of the table they ask for.",
    "summary": "You are a helpful assistant. Work with the user until the request is clear; when you answer, "
               "write the summary they ask for, citing the documents you use.",
}
GRADE_PROMPT = """\
You grade an assistant's answer to a {task} request against reference answer(s).

Request:
{question}

Reference answer(s):
{references}

Assistant's answer:
{answer}

Grade from 0 (wrong, unrelated or no answer) to 10 (as good as a reference: every stated fact \
right, nothing asked for missing). Reply with one line: Score: N"""
_SCORE_RE = re.compile(r"score\s*[:=]\s*\**\s*(\d+(?:\.\d+)?)\s*(?:/\s*10)?", re.IGNORECASE)


def parse_grade(reply: str) -> float | None:
    """The grade in a judge reply (``Score: 7`` or ``Score: 7/10``), clipped to [0, 10]; None if absent."""
    m = _SCORE_RE.search(reply or "")
    return min(10.0, max(0.0, float(m.group(1)))) if m else None


def references_of(task: ShardedTask) -> list[str]:
    """The reference answers of ``task`` (see the module doc).

    Raises:
      DataError: the task has none.
    """
    extra = lic_extra(task)
    for field in ("references", "reference", "answer"):
        v = extra.get(field)
        refs = [v] if isinstance(v, str) else [str(x) for x in v] if isinstance(v, list) else []
        refs = [r.strip() for r in refs if r and r.strip()]
        if refs:
            return refs
    if task.answer.strip():
        return [task.answer.strip()]
    raise DataError(f"task {task.task_id}: field 'references': no reference answer to grade against")


class JudgedTask:
    """A LiC task graded by an LLM judge (see the module doc).

    Args:
      name: ``"data2text"`` or ``"summary"``.
      backend: a ``jaxrl_mt.backends.ChatBackend`` (the HTTP judge).
      max_new_tokens: the judge's reply budget.
    """

    def __init__(self, name: str, backend: Any, *, max_new_tokens: int = 16):
        if name not in JUDGED_TASK_NAMES:
            raise ValueError(f"JudgedTask: unknown task {name!r}; valid: {', '.join(JUDGED_TASK_NAMES)}")
        self.name, self.backend, self.max_new_tokens = name, backend, max_new_tokens
        self.system_prompt = SYSTEM_PROMPTS[name]
        self.stats: MutableMapping[str, int] = {"graded": 0, "unparsed": 0}

    def extract(self, reply: str, task: ShardedTask) -> str | None:
        """The whole reply (stripped), or None when empty."""
        if not isinstance(reply, str):
            return None
        return reply.strip() or None

    def is_answer_attempt(self, reply: str, task: ShardedTask) -> bool:
        """The rule-based judge's verdict for this domain."""
        return classify_rule_based(reply, self.name) == "answer_attempt"

    def verify(self, reply: str, task: ShardedTask) -> Verdict:
        """The judge's grade of ``reply`` / 10; status ``graded``, ``no_answer`` or ``judge_error``."""
        text = self.extract(reply, task)
        refs = references_of(task)
        if text is None:
            return Verdict(0.0, None, "no_answer", "empty reply")
        prompt = GRADE_PROMPT.format(task=self.name, question=task.full_prompt,
                                     references="\n".join(f"- {r}" for r in refs), answer=text)
        got = self.backend.chat([[{"role": "user", "content": prompt}]], max_new_tokens=self.max_new_tokens,
                                temperature=0.0)[0]
        grade = parse_grade(got)
        if grade is None:
            self.stats["unparsed"] += 1
            return Verdict(0.0, text, "judge_error", f"the judge's reply names no score: {got[:80]!r}")
        self.stats["graded"] += 1
        return Verdict(grade / 10.0, text, "graded", f"LLM grade {grade:g}/10 against {len(refs)} reference(s)")
