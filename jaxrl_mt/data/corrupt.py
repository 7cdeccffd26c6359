"""Numeric corruption of condition shards, for MT-Refine / AtR / AiwR conversations.

One number in each chosen condition shard is replaced by a different value written the same
way (same decimals, thousands commas kept, a percentage stays <= 100); the words and units around
it are untouched. The choice of shards, of the number in each shard and of the new value is a
pure function of ``(task, seed)``. The gold answer stays the clean problem's. On synthetic
problems the corrupted answer is recomputed from the corrupted texts and must differ from the
gold one (other draws are tried until it does); it is recorded as metadata ``corrupted_answer``.
"""

from __future__ import annotations

import random
from decimal import Decimal

from jaxrl_mt.data.numbers import find_numbers, format_like, parse_number
from jaxrl_mt.data.records import DataError, ShardedTask
from jaxrl_mt.data.synthetic import recompute_answer

_MAX_TRIES = 64


def _is_percent(text: str, end: int) -> bool:
    rest = text[end : end + 9].lower()
    return rest.startswith("%") or rest.lstrip().startswith("percent")


def _new_value(old: str, rng: random.Random, *, percent: bool) -> str:
    """A different number in the same style as ``old``."""
    v = parse_number(old)
    places = len(old.split(".")[1]) if "." in old else 0
    for _ in range(100):
        if places == 0:
            iv = int(v)
            if iv <= 10:
                cand = Decimal(rng.choice([k for k in range(2, 13) if k != iv]))
            else:
                # keep the "roundness": 40 -> a multiple of 10, 250 -> a multiple of 50, ...
                step = 1
                for s in (1000, 500, 100, 50, 10, 5):
                    if iv % s == 0 and iv > s:
                        step = s
                        break
                factor = Decimal(str(rng.choice([0.5, 0.6, 0.7, 0.75, 0.8, 1.2, 1.25, 1.3, 1.4, 1.5, 2])))
                cand = Decimal(max(step, int((v * factor / step).to_integral_value()) * step))
        else:
            unit = Decimal(1).scaleb(-places)
            factor = Decimal(str(rng.choice([0.5, 0.6, 0.75, 0.8, 1.2, 1.25, 1.5, 2])))
            cand = max(unit, (v * factor).quantize(unit))
        if percent and cand > 100 >= v:
            continue
        s = format_like(cand, old)
        if parse_number(s) != v:
            return s
    # Last resort: add one unit in the last place.
    return format_like(v + Decimal(1).scaleb(-places), old)


def corrupt_text(text: str, rng: random.Random) -> str:
    """Changes one number of ``text`` (chosen by ``rng``), keeping everything else.

    Raises:
      DataError: ``text`` holds no number.
    """
    matches = [m for m in find_numbers(text)
               if not text[m.end() : m.end() + 1] == ":" and not text[m.start() - 1 : m.start()] == ":"]
    if not matches:
        raise DataError(f"no number to corrupt in {text!r}")
    m = rng.choice(matches)
    new = _new_value(m.group(), rng, percent=_is_percent(text, m.end()))
    return text[: m.start()] + new + text[m.end() :]


def corruptible_indices(task: ShardedTask) -> tuple[int, ...]:
    """Indices of condition shards that hold a number (outside clock times)."""
    out = []
    for i, c in enumerate(task.conditions):
        if any(c[m.end() : m.end() + 1] != ":" and c[m.start() - 1 : m.start()] != ":" for m in find_numbers(c)):
            out.append(i)
    return tuple(out)


def corrupt_task(task: ShardedTask, *, seed: int = 0, n_shards: int | None = None) -> ShardedTask:
    """Returns ``task`` with numerically corrupted versions of some condition shards.

    Args:
      task: the clean task.
      seed: the corruption is a pure function of ``(task, seed)``.
      n_shards: how many condition shards to corrupt (chosen by the seed among those holding a
        number, kept in order); ``None``: all of them, as in RLSTA's MT-Refine data.

    Returns:
      A copy with ``corrupted`` set (``None`` for untouched shards), the same gold ``answer``,
      and metadata ``corruption_seed``; for synthetic tasks also ``corrupted_answer`` (which
      differs from ``answer``).

    Raises:
      DataError: no condition shard holds a number, or ``n_shards < 1``.
    """
    candidates = corruptible_indices(task)
    if not candidates:
        raise DataError(f"task {task.task_id!r}: no condition shard holds a number to corrupt")
    if n_shards is not None and n_shards < 1:
        raise DataError(f"n_shards must be >= 1, got {n_shards}")
    k = len(candidates) if n_shards is None else min(n_shards, len(candidates))
    synthetic = "synthetic_ops" in task.meta
    rng = random.Random(f"corrupt-{task.task_id}-{seed}")
    fallback = None  # a draw that changes the answer but leaves a negative or fractional one
    for _ in range(_MAX_TRIES):
        chosen = sorted(rng.sample(candidates, k))
        corrupted: list[str | None] = [None] * len(task.conditions)
        for i in chosen:
            corrupted[i] = corrupt_text(task.conditions[i], rng)
        meta = dict(task.meta)
        meta["corruption_seed"] = seed
        if not synthetic:
            return task.replace(corrupted=tuple(corrupted), metadata=meta)
        texts = tuple(c if c is not None else o for c, o in zip(corrupted, task.conditions))
        new_answer = recompute_answer(task, texts)
        if new_answer == task.answer:
            continue  # the changes cancelled out: draw again
        meta["corrupted_answer"] = new_answer
        if new_answer.startswith("-") or "/" in new_answer or "." in new_answer:
            fallback = fallback or task.replace(corrupted=tuple(corrupted), metadata=meta)
            continue  # prefer a corrupted story that still has a whole, positive answer
        return task.replace(corrupted=tuple(corrupted), metadata=meta)
    if fallback is not None:
        return fallback
    raise DataError(f"task {task.task_id!r}: no corruption changing the answer found in {_MAX_TRIES} draws")
