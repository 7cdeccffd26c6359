"""Synthetic arithmetic word problems with exact answers, for offline demos and tests.

A problem is a chain: a start amount, then ``steps`` operations, each on its own (ordinal) day:

    Target:     "How many marbles does Ava have at the end of the third day?"
    Conditions: "Ava starts with 12 marbles."
                "On the first day, Ava buys 5 more marbles."        (+)
                "On the second day, Ava gives away 4 marbles."      (-)
                "On the third day, Ava's number of marbles becomes 3 times as large."  (*)

Each condition holds exactly one number (days are words), so the answer can be recomputed from
the condition *texts* (:func:`recompute_answer`): the corruption code uses this to prove that a
changed number changes the answer. The difficulty knob is ``steps`` (number of operations) and
``ops`` (which of ``+ - * /`` may appear); intermediate values stay positive integers.
"""

from __future__ import annotations

import random
from fractions import Fraction

from jaxrl_mt.data.numbers import find_numbers, parse_number
from jaxrl_mt.data.records import DataError, ShardedTask

MAX_STEPS = 8  # target + start + 8 steps = 10 shards
_NAMES = ("Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kira", "Liam")
_ITEMS = ("marbles", "stickers", "apples", "coins", "books", "pencils", "cards", "shells", "stamps", "beads")
_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")
_TEMPLATES = {
    "+": ("{name} buys {n} more {item}.", "{name} receives {n} {item} from a friend.", "{name} finds {n} {item}."),
    "-": ("{name} gives away {n} {item}.", "{name} loses {n} {item}.", "{name} sells {n} {item}."),
    "*": ("{name}'s number of {item} becomes {n} times as large.",),
    "/": ("{name} splits the {item} into {n} equal groups and keeps only one group.",),
}
VALID_OPS = ("+", "-", "*", "/")


def _apply(op: str, value: Fraction, n: Fraction) -> Fraction:
    if op == "+":
        return value + n
    if op == "-":
        return value - n
    if op == "*":
        return value * n
    if op == "/":
        return value / n
    raise DataError(f"unknown op {op!r}; valid ops: {VALID_OPS}")


def format_answer(value: Fraction) -> str:
    """Exact answer string: ``"18"``, ``"3.5"``, or ``"7/3"`` when not a finite decimal."""
    if value.denominator == 1:
        return str(value.numerator)
    d = value.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    if d == 1:
        s = f"{float(value):.10f}".rstrip("0").rstrip(".")
        return s
    return f"{value.numerator}/{value.denominator}"


def recompute_answer(task: ShardedTask, conditions: tuple[str, ...] | None = None) -> str:
    """Recomputes a synthetic task's answer from its condition texts (by default the clean ones).

    Args:
      task: a task made by :func:`synthetic_tasks` (its metadata holds the ``ops`` chain).
      conditions: condition texts to read the numbers from, e.g. the corrupted ones.

    Raises:
      DataError: the task is not synthetic or a condition does not hold exactly one number.
    """
    meta = task.meta
    if "synthetic_ops" not in meta:
        raise DataError(f"task {task.task_id!r}: not a synthetic task (no 'synthetic_ops' metadata)")
    ops = meta["synthetic_ops"]
    conditions = task.conditions if conditions is None else tuple(conditions)
    if len(conditions) != len(ops) + 1:
        raise DataError(f"task {task.task_id!r}: expected {len(ops) + 1} conditions, got {len(conditions)}")
    values = []
    for i, c in enumerate(conditions):
        nums = find_numbers(c)
        if len(nums) != 1:
            raise DataError(f"task {task.task_id!r}: condition {i} must hold exactly one number: {c!r}")
        values.append(Fraction(parse_number(nums[0].group())))
    value = values[0]
    for op, n in zip(ops, values[1:]):
        value = _apply(op, value, n)
    return format_answer(value)


def _one_task(rng: random.Random, index: int, steps: int, ops: tuple[str, ...], seed: int) -> ShardedTask:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    value = rng.randint(6, 40)
    conditions = [f"{name} starts with {value} {item}."]
    chain = []
    for k in range(steps):
        allowed = [o for o in ops if not (o == "-" and value <= 2) and not (o == "*" and value > 150)]
        if "/" in allowed and not any(value % d == 0 for d in range(2, 6)):
            allowed.remove("/")
        if not allowed:
            allowed = ["+"] if "+" in ops else list(ops)
        op = rng.choice(allowed)
        if op == "+":
            n = rng.randint(2, 30)
        elif op == "-":
            n = rng.randint(1, value - 1) if value > 1 else 1
        elif op == "*":
            n = rng.randint(2, 4)
        else:
            n = rng.choice([d for d in range(2, 6) if value % d == 0] or [1])
        value = int(_apply(op, Fraction(value), Fraction(n)))
        day = f"On the {_ORDINALS[k]} day, "
        text = rng.choice(_TEMPLATES[op]).format(name=name, n=n, item=item)
        conditions.append(day + text)
        chain.append(op)
    when = f"at the end of the {_ORDINALS[steps - 1]} day" if steps else "now"
    target = f"How many {item} does {name} have {when}?"
    full_prompt = " ".join(conditions) + " " + target
    return ShardedTask(
        task_id=f"synthetic/{seed}/{index}",
        domain="math",
        target=target,
        conditions=tuple(conditions),
        full_prompt=full_prompt,
        answer=str(value),
        metadata=(("source", "synthetic"), ("steps", steps), ("synthetic_ops", tuple(chain))),
    )


def synthetic_tasks(n: int, *, steps: int = 2, seed: int = 0, ops=("+", "-", "*")) -> list[ShardedTask]:
    """Makes ``n`` arithmetic word problems with exact integer answers.

    Args:
      n: number of problems.
      steps: number of operations per problem (difficulty), ``0..8``; shards = ``steps + 2``.
      seed: problems are a pure function of ``(n, steps, seed, ops)``.
      ops: operations to draw from, a subset of ``("+", "-", "*", "/")``.

    Returns:
      Tasks with ids ``synthetic/<seed>/<i>`` and metadata ``synthetic_ops`` (the op chain).
    """
    if not 0 <= steps <= MAX_STEPS:
        raise DataError(f"steps must be in 0..{MAX_STEPS}, got {steps}")
    ops = tuple(ops)
    if not ops or any(o not in VALID_OPS for o in ops):
        raise DataError(f"ops must be a non-empty subset of {VALID_OPS}, got {ops}")
    if n < 0:
        raise DataError(f"n must be >= 0, got {n}")
    rng = random.Random(f"synthetic-{seed}-{steps}-{''.join(ops)}")
    return [_one_task(rng, i, steps, ops, seed) for i in range(n)]
