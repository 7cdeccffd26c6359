"""Per-domain scoring of LiC replies: math keeps the numeric verifier, other tasks use their plug-in.

The simulator's :class:`jaxrl_mt.eval.simulator.TurnScorer` judges every reply of a turn with
one batched judge call, then scores math replies with ``judge_turn`` (the training verifier) and
hands the others to :func:`score_task_turns`, which looks the task up by the record's
``domain`` (:func:`jaxrl_mt.tasks.get_task`, or a mapping given by the caller, e.g. the
LLM-graded tasks built for an HTTP judge) and calls its verifier.

For a non-math reply the verdict stored in ``turn.info`` is:

- ``label`` / ``answer_attempt``: with the rule-based judge, the task's own ``is_answer_attempt``
  decides (the label is ``answer_attempt`` when it says yes; otherwise the rule judge's label, or
  ``discussion`` where that one said ``answer_attempt``: the reply holds nothing the task can
  score); with an LLM judge, its label.
- ``extracted``, ``status``, ``reason``: from the task's :class:`~jaxrl_mt.tasks.Verdict`.
- ``correct`` and ``correct_strict``: the verdict's score (the task verifiers have one mode; the
  report's judge-free cross-check reads ``correct_strict``).

As the math verifier and the judges, the task reads the answer after a think block
(``rewards.think.answer_part``; a think block left open holds no answer).

A checker that raises (a bug, or a reply no one foresaw) costs only its turn: the verdict is
``status: "checker_error"`` with the exception in ``reason`` (one line), score 0 and no answer
attempt (with the rule judge), and a one-line warning is logged; the other replies are scored.

The task record itself travels in ``ConversationRun.meta["task"]`` (set by ``plan_runs``) and is
never written to transcripts. Code replies run in the sandbox; a turn's verifications run in a
small thread pool (the sandbox and the SQLite checks are thread-safe).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from jaxrl_mt.data.records import ShardedTask
from jaxrl_mt.rewards.think import answer_part
from jaxrl_mt.tasks import Task, get_task

__all__ = ["MATH", "SCORE_WORKERS", "conversation_system", "lookup_task", "score_task_turns", "task_turn"]

MATH = "math"
SCORE_WORKERS = 4  # threads verifying one turn's non-math replies (sandbox runs are child processes)
NO_ANSWER_LABEL = "discussion"  # rule label of a reply the task finds no answer in
CHECKER_ERROR = "checker_error"  # status of a turn whose checker raised
_log = logging.getLogger(__name__)


def lookup_task(domain: str, tasks: Mapping[str, Task] | None = None) -> Task:
    """The task plug-in of ``domain``: from ``tasks`` when it has one, else the registry.

    Raises:
      KeyError: an unknown domain (the message lists the registered tasks).
    """
    if tasks and domain in tasks:
        return tasks[domain]
    return get_task(domain)


def conversation_system(task: ShardedTask, override: str | None, tasks: Mapping[str, Task] | None = None
                        ) -> str | None:
    """The system prompt of a conversation on ``task``.

    Args:
      task: the instruction.
      override: the config's system prompt (None or "": not set).
      tasks: task plug-ins by domain (default: the registry).

    Returns:
      ``override`` when set; for math None (the chat template's default, as before); for other
      domains the task's ``system_prompt_for(task)`` where it has one (database: the schema,
      actions: the function specs), else its ``system_prompt`` (None when empty).
    """
    if override:
        return override
    if task.domain == MATH:
        return None
    plug = lookup_task(task.domain, tasks)
    fn = getattr(plug, "system_prompt_for", None)
    text = fn(task) if callable(fn) else plug.system_prompt
    return text or None


def task_turn(text: str, task: ShardedTask, plug: Task, label: str, *, llm_label: bool) -> dict[str, Any]:
    """The ``turn.info`` verdict of one non-math reply (see the module doc).

    Args:
      text: the reply.
      task: its instruction.
      plug: the task plug-in.
      label: the judge's response type for the reply.
      llm_label: the label comes from an LLM judge (it then decides ``answer_attempt``).

    Returns:
      ``{"label", "answer_attempt", "extracted", "correct", "correct_strict", "status", "reason"}``.
    """
    text = answer_part(text)
    verdict = plug.verify(text, task)
    if llm_label:
        attempt = label == "answer_attempt"
    else:
        attempt = bool(plug.is_answer_attempt(text, task))
        label = "answer_attempt" if attempt else (NO_ANSWER_LABEL if label == "answer_attempt" else label)
    score = float(verdict.score)
    return {"label": label, "answer_attempt": attempt, "extracted": verdict.extracted, "correct": score,
            "correct_strict": score, "status": verdict.status, "reason": verdict.reason}


def _checked_turn(text: str, task: ShardedTask, plug: Task, label: str, *, llm_label: bool) -> dict[str, Any]:
    """:func:`task_turn`, or the ``checker_error`` verdict when the checker raises."""
    try:
        return task_turn(text, task, plug, label, llm_label=llm_label)
    except Exception as e:  # any checker failure is this turn's verdict, never the run's
        why = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        _log.warning("task %s (%s): the checker raised on a %d-character reply: %s", task.task_id, plug.name,
                     len(text) if isinstance(text, str) else -1, why)
        attempt = llm_label and label == "answer_attempt"
        if not llm_label and label == "answer_attempt":
            label = NO_ANSWER_LABEL
        return {"label": label, "answer_attempt": attempt, "extracted": None, "correct": 0.0, "correct_strict": 0.0,
                "status": CHECKER_ERROR, "reason": f"the checker raised {why}"}


def score_task_turns(texts: Sequence[str], tasks: Sequence[ShardedTask], labels: Sequence[str], *,
                     llm_label: bool, plugins: Mapping[str, Task] | None = None,
                     workers: int = SCORE_WORKERS) -> list[dict[str, Any]]:
    """:func:`task_turn` for a batch of non-math replies, in order, verified in a thread pool; a
    checker that raises gives its turn the ``checker_error`` verdict (see the module doc).

    Args:
      texts: the replies.
      tasks: the instruction of each reply (``ConversationRun.meta["task"]``).
      labels: the judge's label of each reply.
      llm_label: the labels come from an LLM judge.
      plugins: task plug-ins by domain (default: the registry).
      workers: threads (1: in this thread).

    Raises:
      ValueError: the three sequences differ in length, a task record is missing, or a task is a math one.
    """
    if not len(texts) == len(tasks) == len(labels):
        raise ValueError(f"score_task_turns: {len(texts)} texts, {len(tasks)} tasks, {len(labels)} labels")
    plugs = []
    for t in tasks:
        if not isinstance(t, ShardedTask):
            raise ValueError(f"score_task_turns: expected the task record (ConversationRun.meta['task'], set by "
                             f"plan_runs), got {t!r}")
        if t.domain == MATH:
            raise ValueError(f"score_task_turns: task {t.task_id!r} is a math task (scored by judge_turn)")
        plugs.append(lookup_task(t.domain, plugins))
    jobs = list(zip(texts, tasks, plugs, labels))
    if workers <= 1 or len(jobs) <= 1:
        return [_checked_turn(x, t, p, lab, llm_label=llm_label) for x, t, p, lab in jobs]
    with ThreadPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        return list(pool.map(lambda j: _checked_turn(j[0], j[1], j[2], j[3], llm_label=llm_label), jobs))
