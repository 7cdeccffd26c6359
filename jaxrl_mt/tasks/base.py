"""LiC tasks as plug-ins: what a task adds on top of the shared simulator.

A task (math, code, database, actions, ...) is a small object with a name, the system prompt the
LiC harness uses for it, an answer extractor, a verifier giving a score in [0, 1], and a
rule-based answer-attempt detector. The simulator, scenarios, metrics and reports are shared;
they look a task up by the record's ``domain`` with :func:`get_task`.

Layering: tasks sit beside ``rewards`` (methods level). They may import ``jaxrl_mt.data`` and
``jaxrl_mt.rewards``; nothing in the engine (models, sampling, scoring, conversations) imports
them.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Protocol, runtime_checkable

from jaxrl_mt.data.records import ShardedTask
from jaxrl_mt.registry import Registry
from jaxrl_mt.rewards.verifier import MAX_CHECKED_CHARS

__all__ = ["MAX_REPLY_CHARS", "TASKS", "Verdict", "Task", "register_task", "get_task", "task_names", "lic_extra",
           "oversized"]

MAX_REPLY_CHARS = MAX_CHECKED_CHARS  # a longer reply is not parsed: verdict "unparsable", no answer attempt


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The verifier's judgement of one reply.

    Attributes:
      score: in [0, 1] (1: correct).
      extracted: the answer taken from the reply (number, code, SQL, calls), or None.
      status: short machine-readable verdict, e.g. "passed", "failed", "timeout", "crashed",
        "rejected", "no_answer", "wrong", "correct", "unparsable" (a reply over
        ``MAX_REPLY_CHARS``), "checker_error" (the checker raised; set by the scoring loop).
      reason: one human-readable line (which test failed, which argument was wrong, ...).
    """

    score: float
    extracted: str | None
    status: str
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def oversized(reply: object) -> Verdict | None:
    """The ``unparsable`` verdict of a reply longer than ``MAX_REPLY_CHARS``, else None."""
    if isinstance(reply, str) and len(reply) > MAX_REPLY_CHARS:
        return Verdict(0.0, None, "unparsable",
                       f"reply of {len(reply)} characters: over the checkers' limit of {MAX_REPLY_CHARS}")
    return None


@runtime_checkable
class Task(Protocol):
    """What the LiC simulator needs from a task."""

    name: str  # "math", "code", "database", "actions", ...
    system_prompt: str  # the assistant's system prompt for this task ("" : template default)

    def extract(self, reply: str, task: ShardedTask) -> str | None:
        """The answer in ``reply`` (None when there is none)."""

    def verify(self, reply: str, task: ShardedTask) -> Verdict:
        """Extracts and checks the answer in ``reply`` against the task's reference."""

    def is_answer_attempt(self, reply: str, task: ShardedTask) -> bool:
        """Whether ``reply`` commits to an answer (LiC's answer attempt), rule-based."""


# the built-ins (code, database, actions) are registered by `jaxrl_mt.tasks.builtin`, imported on first use
TASKS: Registry[Task] = Registry("LiC task", builtins=("jaxrl_mt.tasks.builtin",))


def register_task(task: Task) -> Task:
    """Registers ``task`` under ``task.name`` in `TASKS` (a later registration of the name replaces it)."""
    if not isinstance(task, Task):
        raise TypeError(f"{task!r} does not implement jaxrl_mt.tasks.Task")
    return TASKS.add(task.name, task, replace=True)


def get_task(name: str) -> Task:
    """The task registered as ``name`` (`TASKS.get`).

    Raises:
      KeyError: unknown name; the message lists the known ones.
    """
    return TASKS.get(name)


def task_names() -> tuple[str, ...]:
    """Names of the registered tasks."""
    return TASKS.names()


def lic_extra(task: ShardedTask) -> dict[str, Any]:
    """The task-specific LiC fields the loader kept (metadata ``lic_extra``, JSON text), as a dict."""
    raw = task.meta.get("lic_extra")
    return json.loads(raw) if raw else {}
