"""The task fields of the LiC evaluation config: which tasks, from which sources, checked at start-up.

``config.task`` is one task, several (a list, or comma-separated on the command line) or
``all`` (= :data:`OFFLINE_TASKS`: math, code, database, actions). ``config.datasets`` maps each
task to its sources (comma-separated specs, ``jaxrl_mt.data.load_source``); ``config.dataset``,
when set, overrides them: with one task its sources are that task's, with several each source's
task must follow from its spec (``lic:FILE:TASK``, ``humaneval:...`` = code, the GSM8K-style
sources and ``synthetic`` = math).

Summary and data2text are graded by an LLM judge only (:mod:`jaxrl_mt.tasks.judged`): selecting
them needs ``config.judge = "http:URL#MODEL"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jaxrl_mt.data.loaders import LIC_TASKS
from jaxrl_mt.data.records import DataError, ShardedTask
from jaxrl_mt.eval.simulator import EvalError
from jaxrl_mt.tasks import Task, get_task
from jaxrl_mt.tasks.judged import JUDGED_TASK_NAMES, JudgedTask, references_of

__all__ = [
    "ALL",
    "JUDGED_TASKS",
    "OFFLINE_TASKS",
    "check_record",
    "judged_plugins",
    "parse_tasks",
    "resolve_sources",
    "spec_task",
    "split_specs",
    "with_task",
]

OFFLINE_TASKS = ("math", "code", "database", "actions")
JUDGED_TASKS = JUDGED_TASK_NAMES
ALL = "all"
_MATH_SOURCES = ("gsm8k", "rlsta_add", "rlsta_refine", "synthetic", "hf", "tfds")


def split_specs(value: Any) -> tuple[str, ...]:
    """Strings, lists of strings and ``"a,b"`` items (the command line) -> a tuple of items."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else list(value)
    return tuple(s.strip() for item in items for s in str(item).split(",") if s.strip())


def parse_tasks(value: Any, judge: str) -> tuple[str, ...]:
    """The selected tasks, in the order given, duplicates dropped.

    Raises:
      EvalError: an unknown task, none, or summary / data2text without an HTTP judge.
    """
    names = split_specs(value)
    out: list[str] = []
    for n in names:
        for t in OFFLINE_TASKS if n == ALL else (n,):
            if t not in LIC_TASKS:
                raise EvalError(f"config field 'task': unknown task {t!r}; valid: {', '.join(LIC_TASKS)}, {ALL}")
            if t not in out:
                out.append(t)
    if not out:
        raise EvalError(f"config field 'task': no task given ({value!r})")
    judged = [t for t in out if t in JUDGED_TASKS]
    if judged and not str(judge).startswith("http:"):
        raise EvalError(
            f"config field 'task': {judged[0]!r} has no offline verifier; it is graded by an LLM judge, "
            f"so config field 'judge' must be http:URL#MODEL (got {judge!r}); offline tasks: "
            f"{', '.join(OFFLINE_TASKS)}"
        )
    return tuple(out)


def spec_task(spec: str) -> str | None:
    """The task a source spec implies (None: not implied, e.g. ``lic:FILE`` or ``tasks:FILE``)."""
    kind, _, rest = spec.partition(":")
    if kind == "lic":
        tail = rest.rpartition(":")[2]
        return tail if ":" in rest and tail in LIC_TASKS else None
    if kind == "humaneval":
        return "code"
    return "math" if kind in _MATH_SOURCES else None


def with_task(spec: str, task: str) -> str:
    """``lic:FILE`` -> ``lic:FILE:task`` for a non-math task (math stays implicit, the loader's default)."""
    if spec.startswith("lic:") and spec_task(spec) is None and task != "math":
        return f"{spec}:{task}"
    return spec


def resolve_sources(
    tasks: Sequence[str], dataset: Any, datasets: Mapping[str, Any] | None
) -> dict[str, tuple[str, ...]]:
    """The sources of each selected task (see the module doc).

    Args:
      tasks: the selected tasks (:func:`parse_tasks`).
      dataset: ``config.dataset`` (empty: use ``datasets``).
      datasets: ``config.datasets``, task -> sources.

    Raises:
      EvalError: ``config field 'datasets.TASK': ...`` (or ``'dataset'``) for a task without a
        source, or a source that holds another task's instructions.
    """
    override = split_specs(dataset)
    out: dict[str, list[str]] = {t: [] for t in tasks}
    if override and len(tasks) == 1:
        out[tasks[0]] = list(override)
    for spec in override if len(tasks) > 1 else ():
        implied = spec_task(spec)
        if implied is None:
            raise EvalError(
                f"config field 'dataset': source {spec!r} does not say which task it holds; with several "
                "tasks write lic:FILE:TASK or set config field 'datasets.TASK'"
            )
        if implied not in out:
            raise EvalError(
                f"config field 'dataset': source {spec!r} holds {implied} instructions, but config "
                f"field 'task' selects {', '.join(tasks)}"
            )
        out[implied].append(spec)
    for t in tasks if not override else ():
        field = f"datasets.{t}"
        for spec in split_specs((datasets or {}).get(t)):
            implied = spec_task(spec)
            if implied not in (None, t):
                raise EvalError(f"config field '{field}': source {spec!r} holds {implied} instructions, not {t}")
            out[t].append(spec)
    for t, specs in out.items():
        if not specs:
            field = "dataset" if override else f"datasets.{t}"
            hint = (
                " (LiC's summary and data2text records are not shipped; give lic:FILE:TASK)"
                if t in JUDGED_TASKS
                else ""
            )
            raise EvalError(f"config field '{field}': no source for task {t!r}{hint}")
    return {t: tuple(with_task(s, t) for s in specs) for t, specs in out.items()}


def check_record(task: ShardedTask, name: str, spec: str) -> None:
    """Checks that ``task`` (from source ``spec``, selected as task ``name``) can be scored.

    Raises:
      EvalError: another domain, or what its verifier needs is missing (naming source and task id).
    """
    where = f"source {spec!r}: task {task.task_id!r}"
    if task.domain != name:
        raise EvalError(f"{where} is a {task.domain!r} task, but the source is configured for {name!r}")
    try:
        if name in JUDGED_TASKS:
            references_of(task)
        elif name != "math":
            plug = get_task(name)
            if hasattr(plug, "tests"):
                plug.tests(task)
            if hasattr(plug, "system_prompt_for"):
                plug.system_prompt_for(task)
    except (DataError, ValueError) as e:
        raise EvalError(f"{where}: {e}") from None


def judged_plugins(tasks: Sequence[str], backend: Any = None, *, max_new_tokens: int = 16) -> dict[str, Task]:
    """A :class:`JudgedTask` per selected LLM-graded task (its backend may be set later)."""
    return {t: JudgedTask(t, backend, max_new_tokens=max_new_tokens) for t in tasks if t in JUDGED_TASKS}
