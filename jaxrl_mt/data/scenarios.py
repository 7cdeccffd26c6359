"""Building the user turns of a conversation from a sharded task.

Kinds follow LiC (Laban et al. 2025) and RLSTA; ``S`` = target shard, ``c_i`` = conditions,
``c_i'`` = corrupted condition, ``fix(c_i)`` = a correction turn restating ``c_i``:

===============  ============================================================================
full             one turn: the clean full prompt
concat           one turn: ``S`` then all conditions as a bulleted list
sharded/mt_add   ``S``, ``c_1``, ..., ``c_n`` (conditions optionally shuffled with the seed)
recap            sharded turns, then "Just to recap:" with every shard
snowball         ``S``; then turn k repeats every shard revealed so far and adds the new one
mt_refine        ``S`` + all conditions with the corrupted ones swapped in; then one
                 ``fix(c_i)`` per corrupted shard
atr              ``S``, then every condition (corrupted where one exists) one per turn, then
                 the ``fix`` turns one per turn ("all then refine")
aiwr             ``S``, then every condition, each corrupted one followed at once by its fix
underspecified   one turn: the prompt rebuilt from ``S`` and the conditions minus 1-2 required
                 ones (seeded); ``Scenario.removed`` lists them (ICPO)
===============  ============================================================================

Every scenario keeps the clean full prompt as its anchor and the clean problem's gold answer.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from jaxrl_mt.data.corrupt import corrupt_task
from jaxrl_mt.data.numbers import number_set
from jaxrl_mt.data.records import DataError, Scenario, ShardedTask, canonical_kind

CORRECTION_TEMPLATE = "Correction, I got that wrong earlier: {original}"
RECAP_HEADER = "Just to recap:"
SNOWBALL_HEADER = "To reiterate what I said so far:"
SNOWBALL_NEW = "And also: {shard}"


def as_sentence(text: str) -> str:
    """Capital first letter and a final full stop (unless it already ends in punctuation)."""
    text = text.strip()
    if not text:
        return text
    text = text[0].upper() + text[1:]
    return text if text[-1] in ".!?\"')\u201d\u2019" else text + "."


def bullets(items: Sequence[str]) -> str:
    return "\n".join(f"- {s.strip()}" for s in items)


def join_shards(target: str, conditions: Sequence[str]) -> str:
    """A single-turn prompt from shards: the conditions as sentences, then the question."""
    return " ".join([as_sentence(c) for c in conditions] + [as_sentence(target)])


def _order(n: int, *, shuffle: bool, seed: int, task_id: str) -> list[int]:
    order = list(range(n))
    if shuffle:
        random.Random(f"order-{task_id}-{seed}").shuffle(order)
    return order


def _with_corruption(task: ShardedTask, seed: int, n_shards: int | None) -> ShardedTask:
    if task.corrupted is None or not task.corrupted_indices:
        return corrupt_task(task, seed=seed, n_shards=n_shards)
    return task


def _required_indices(task: ShardedTask) -> list[int]:
    """Conditions that carry a number found nowhere else (removing one loses information)."""
    out = []
    for i, c in enumerate(task.conditions):
        nums = number_set(c)
        others = number_set([task.target, *(o for j, o in enumerate(task.conditions) if j != i)])
        if nums and not nums <= others:
            out.append(i)
    return out


def build_scenario(
    task: ShardedTask,
    kind: str,
    *,
    seed: int = 0,
    shuffle: bool = False,
    n_shards: int | None = None,
    n_remove: int | None = None,
    correction_template: str = CORRECTION_TEMPLATE,
) -> Scenario:
    """Builds one conversation of ``kind`` from ``task``.

    Args:
      task: the sharded task.
      kind: one of ``SCENARIO_KINDS`` (``"mt_add"`` is an alias of ``"sharded"``).
      seed: seeds the condition order (when ``shuffle``), the corruption (when the task has
        none) and the removed conditions (``underspecified``).
      shuffle: shuffle the order in which conditions are revealed (not for full / concat /
        underspecified, whose single turn keeps the given order).
      n_shards: corrupt_task's ``n_shards`` for mt_refine / atr / aiwr on a task without a
        corrupted version (``None``: every condition holding a number).
      n_remove: underspecified only: conditions to remove (1 or 2; ``None``: drawn with the seed).
      correction_template: wording of a correction turn; ``{original}`` is the clean shard.

    Returns:
      The scenario; metadata records ``n_shards`` (target + conditions), ``order`` (condition
      indices in reveal order) and, where relevant, ``corrupted`` (indices) and
      ``corrupted_answer``.

    Raises:
      DataError: unknown kind, or a task that cannot make this kind (e.g. no condition).
    """
    kind = canonical_kind(kind)
    n = len(task.conditions)
    order = _order(n, shuffle=shuffle and kind not in ("full", "concat", "underspecified"), seed=seed,
                   task_id=task.task_id)
    meta: dict = {"n_shards": 1 + n, "order": tuple(order)}
    removed: tuple[int, ...] = ()
    conds = [task.conditions[i] for i in order]

    if kind == "full":
        turns = [task.full_prompt]
    elif kind == "concat":
        turns = [f"{task.target}\n{bullets(task.conditions)}" if n else task.target]
    elif kind == "sharded":
        turns = [task.target, *conds]
    elif kind == "recap":
        turns = [task.target, *conds, f"{RECAP_HEADER}\n{bullets([task.target, *conds])}"]
    elif kind == "snowball":
        shards = [task.target, *conds]
        turns = [shards[0]]
        for k in range(1, len(shards)):
            turns.append(f"{SNOWBALL_HEADER}\n{bullets(shards[:k])}\n{SNOWBALL_NEW.format(shard=shards[k])}")
    elif kind in ("mt_refine", "atr", "aiwr"):
        task, turns = _corrected_turns(task, kind, order, seed, n_shards, correction_template, meta)
    elif kind == "underspecified":
        turns, removed = _underspecified_turns(task, seed, n_remove, meta)
    else:  # pragma: no cover - canonical_kind guards this
        raise DataError(f"unhandled kind {kind!r}")

    return Scenario(
        task_id=task.task_id,
        kind=kind,
        turns=tuple(turns),
        anchor_prompt=task.full_prompt,
        answer=task.answer,
        domain=task.domain,
        removed=removed,
        metadata=meta,
    )


def _corrected_turns(task: ShardedTask, kind: str, order: list[int], seed: int, n_shards: int | None,
                     correction_template: str, meta: dict) -> tuple[ShardedTask, list[str]]:
    """The turns of mt_refine / atr / aiwr (a corrupted shard, later corrected); fills ``meta``."""
    if not task.conditions:
        raise DataError(f"task {task.task_id!r}: kind {kind!r} needs at least one condition")
    task = _with_corruption(task, seed, n_shards)
    bad = set(task.corrupted_indices)
    shown = [task.corrupted[i] if i in bad else task.conditions[i] for i in order]
    fixes = {i: correction_template.format(original=task.conditions[i]) for i in bad}
    if kind == "mt_refine":
        turns = [f"{task.target}\n{bullets(shown)}"] + [fixes[i] for i in order if i in bad]
    elif kind == "atr":
        turns = [task.target, *shown] + [fixes[i] for i in order if i in bad]
    else:
        turns = [task.target]
        for i, s in zip(order, shown):
            turns.append(s)
            if i in bad:
                turns.append(fixes[i])
    meta["corrupted"] = tuple(i for i in order if i in bad)
    if "corrupted_answer" in task.meta:
        meta["corrupted_answer"] = task.meta["corrupted_answer"]
    return task, turns


def _underspecified_turns(task: ShardedTask, seed: int, n_remove: int | None, meta: dict
                          ) -> tuple[list[str], tuple[int, ...]]:
    """The single turn of an underspecified prompt (1-2 required conditions removed) and the removed indices."""
    n = len(task.conditions)
    if not n:
        raise DataError(f"task {task.task_id!r}: kind 'underspecified' needs at least one condition")
    rng = random.Random(f"underspecified-{task.task_id}-{seed}")
    pool = _required_indices(task) or list(range(n))
    k = n_remove if n_remove is not None else rng.choice((1, 2))
    if k not in (1, 2):
        raise DataError(f"n_remove must be 1 or 2, got {n_remove}")
    removed = tuple(sorted(rng.sample(pool, min(k, len(pool)))))
    kept = [c for i, c in enumerate(task.conditions) if i not in removed]
    meta["order"] = tuple(i for i in range(n) if i not in removed)
    return [join_shards(task.target, kept)], removed


def build_scenarios(
    tasks: Sequence[ShardedTask], kind: str, *, seed: int = 0, shuffle: bool = False, skip_invalid: bool = False, **kw
) -> list[Scenario]:
    """:func:`build_scenario` over many tasks, all with the same ``seed`` (the randomness is
    also keyed by task id, so tasks get different draws).

    Args:
      skip_invalid: skip tasks that cannot make this kind (e.g. nothing to corrupt) instead of
        raising.
    """
    out = []
    for t in tasks:
        try:
            out.append(build_scenario(t, kind, seed=seed, shuffle=shuffle, **kw))
        except DataError:
            if not skip_invalid:
                raise
    return out
