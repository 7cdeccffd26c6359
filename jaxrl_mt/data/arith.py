"""Templated one- to three-step word problems over the four operations, each with a worked solution.

Experiment 3 (issue 56) needs problems on which a model can be made capable in one turn first and
then measured across turns, with no shortcut rule (add every number, the last number, ...) close
to a capable model. So, unlike :mod:`jaxrl_mt.data.families` (addition and subtraction only):

- the operations are ``+ - * /``, drawn from an exactly balanced schedule: for ``steps`` k, the
  4**k operation sequences are taken in a seeded shuffled order, so every sequence (and every
  operation at every position) is equally frequent over each block of 4**k problems;
- every problem carries a worked single-turn solution (metadata ``solution``), one equation per
  step and the final sentence, e.g. ``"12 + 5 = 17. 17 * 3 = 51. The answer is 51."``: the
  target of the single-turn SFT that makes the stage-0 model;
- the template sets ``train`` and ``heldout`` share no sentence, name or object word.

Numbers: a start value in ``START_RANGE``; ``+`` and ``-`` amounts in ``2..9``; ``*`` and ``/``
factors in ``2..5``; every intermediate value stays in ``2..99`` (the final one may be 1), a division
is exact, and the answer differs from every number in the facts. Problems are a pure function of
``(template set, n, steps, seed)``; ids are ``arith/<set>/<steps>/<seed>/<i>/<template id>``.
Metadata ``synthetic_ops`` holds the operations, so MT-Refine's corruption recomputes answers.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

from jaxrl_mt.data.families import HELDOUT_NAMES, TRAIN_NAMES  # the same people as the add/subtract families
from jaxrl_mt.data.records import DataError, ShardedTask

__all__ = ["ARITH_SETS", "OPS", "STEPS", "TEMPLATES", "ArithTemplate", "arith_tasks", "solution_text"]

OPS = ("+", "-", "*", "/")
STEPS = (1, 2, 3)
START_RANGE = (6, 40)
ADD_RANGE = (2, 9)  # amounts added or subtracted
FACTOR_RANGE = (2, 5)  # factors multiplied or divided by
MAX_VALUE = 99


@dataclasses.dataclass(frozen=True)
class ArithTemplate:
    """One surface form: a start fact, one sentence per operation (``{n}`` its number), a question.

    ``{a}`` is the start value; ``{name}`` and ``{x}`` come from the set's names and ``objects``. The
    operation sentences start with their subject, so a later one reads "After that, <sentence>".
    """

    tid: str
    start: str
    ops: dict[str, str]  # "+", "-", "*", "/" -> sentence
    question: str
    objects: tuple[str, ...] = ("",)


def _t(tid, start, plus, minus, times, divide, question, objects=("",)) -> ArithTemplate:
    return ArithTemplate(tid, start, {"+": plus, "-": minus, "*": times, "/": divide}, question, objects)


TEMPLATES: dict[str, tuple[ArithTemplate, ...]] = {
    "train": (
        _t("pocket", "{name} has {a} {x}.", "{name} gets {n} more {x} from a friend.",
           "{name} gives {n} {x} to a classmate.", "{name} collects until there are {n} times as many {x}.",
           "{name} splits the {x} into {n} equal piles and keeps only one pile.",
           "How many {x} does {name} have now?", ("marbles", "stickers", "pencils", "stamps")),
        _t("bus", "There are {a} passengers on a bus.", "{n} passengers get on the bus.",
           "{n} passengers get off the bus.", "the number of passengers on the bus becomes {n} times as large.",
           "the passengers divide equally among {n} buses, and only this bus is counted.",
           "How many passengers are on the bus now?"),
        _t("shelf", "A shelf holds {a} books.", "the librarian adds {n} books to the shelf.",
           "visitors borrow {n} books from the shelf.", "the librarian fills the shelf to {n} times as many books.",
           "the books are shared equally among {n} shelves, and this shelf keeps its share.",
           "How many books are on the shelf now?"),
        _t("wallet", "{name} has {a} dollars.", "{name} earns {n} dollars washing cars.",
           "{name} spends {n} dollars on lunch.", "{name}'s money grows to {n} times as much.",
           "{name} divides the money equally into {n} envelopes and keeps one envelope.",
           "How many dollars does {name} have now?"),
        _t("farm", "A farm has {a} {x}.", "the farmer buys {n} more {x}.", "the farmer sells {n} of the {x}.",
           "the herd of {x} grows to {n} times its size.",
           "the farmer splits the {x} equally among {n} farms and keeps one share.",
           "How many {x} does the farm have now?", ("sheep", "goats", "chickens", "cows")),
        _t("aquarium", "An aquarium has {a} fish.", "{n} baby fish hatch in the aquarium.",
           "{n} fish are moved to another aquarium.", "the number of fish becomes {n} times as large.",
           "the fish are split equally among {n} tanks, and only this aquarium's share stays.",
           "How many fish are in the aquarium now?"),
    ),
    "heldout": (
        _t("garden", "A garden has {a} {x}.", "the gardener plants {n} more {x}.",
           "{n} of the {x} are picked for a bouquet.", "the patch of {x} spreads to {n} times its size.",
           "the gardener divides the {x} equally into {n} beds and gives away all beds but one.",
           "How many {x} are in the garden at the end?", ("roses", "tulips", "daisies", "lilies")),
        _t("parking", "A parking lot has {a} cars in it.", "{n} more cars drive in.", "{n} cars drive out.",
           "the count of cars in the lot rises to {n} times as many.",
           "the cars are sent equally to {n} lots, and one lot's cars remain here.",
           "How many cars are in the parking lot after that?"),
        _t("jar", "A jar contains {a} cookies.", "Mom bakes {n} cookies and puts them in the jar.",
           "the kids eat {n} cookies from the jar.", "Mom refills the jar until it has {n} times as many cookies.",
           "Mom packs the cookies equally into {n} boxes and leaves one box's worth in the jar.",
           "How many cookies are in the jar in the end?"),
        _t("score", "{name} has {a} points in a game.", "{name} wins {n} points in the next round.",
           "{name} loses {n} points in the next round.", "a bonus makes {name}'s points {n} times as many.",
           "a penalty cuts {name}'s points to one part in {n}.", "What is {name}'s final score?"),
        _t("hall", "{a} people are sitting in a concert hall.", "{n} more people arrive and sit down.",
           "{n} people leave during the break.", "the crowd grows to {n} times its size.",
           "the crowd splits equally among {n} halls, and one group stays in this hall.",
           "How many people are in the hall after that?"),
    ),
}
ARITH_SETS = tuple(TEMPLATES)
_NAMES = {"train": TRAIN_NAMES, "heldout": HELDOUT_NAMES}


def _apply(op: str, value: int, n: int) -> int | None:
    """``value op n`` when it keeps to the rules (exact division, within MAX_VALUE), else None."""
    if op == "+":
        out = value + n
    elif op == "-":
        out = value - n
    elif op == "*":
        out = value * n
    else:
        out = value // n if value % n == 0 else None
    return out if out is not None and 1 <= out <= MAX_VALUE else None


def _numbers(rng: random.Random, ops: tuple[str, ...]) -> tuple[int, list[int], list[int]]:
    """Start value, operands and the value after each step (the last is the answer)."""
    for _ in range(5000):
        value = start = rng.randint(*START_RANGE)
        operands, values = [], []
        for k, op in enumerate(ops):
            n = rng.randint(*(ADD_RANGE if op in "+-" else FACTOR_RANGE))
            nxt = _apply(op, value, n)
            if nxt is None or (nxt < 2 and k < len(ops) - 1):
                break
            operands.append(n)
            values.append(value := nxt)
        else:
            if value not in (start, *operands):  # echoing a fact must never be the right answer
                return start, operands, values
    raise DataError(f"could not draw numbers for ops {ops}")


def solution_text(start: int, ops: tuple[str, ...], operands: list[int], values: list[int]) -> str:
    """The worked solution: one equation per step, then ``The answer is N.``"""
    prev, eqs = start, []
    for op, n, v in zip(ops, operands, values):
        eqs.append(f"{prev} {op} {n} = {v}.")
        prev = v
    return " ".join(eqs) + f" The answer is {values[-1]}."


def _cap(s: str) -> str:
    return s[0].upper() + s[1:]


def _one(rng: random.Random, t: ArithTemplate, names: tuple[str, ...], ops: tuple[str, ...], task_id: str,
         fam: str) -> ShardedTask:
    start, operands, values = _numbers(rng, ops)
    fill = {"name": rng.choice(names), "x": rng.choice(t.objects)}
    conditions = [_cap(t.start.format(a=start, **fill))]
    for k, (op, n) in enumerate(zip(ops, operands)):
        text = t.ops[op].format(n=n, **fill)
        conditions.append("After that, " + text if k else _cap(text))
    target = t.question.format(**fill)
    return ShardedTask(
        task_id=task_id, domain="math", target=target, conditions=tuple(conditions),
        full_prompt=" ".join(conditions) + " " + target, answer=str(values[-1]),
        metadata=(("family", fam), ("source", "arith"), ("steps", len(ops)), ("synthetic_ops", ops),
                  ("template", t.tid), ("solution", solution_text(start, ops, operands, values))),
    )


def arith_tasks(template_set: str, n: int, *, steps: int = 1, seed: int = 0) -> list[ShardedTask]:
    """``n`` problems of ``steps`` operations from one template set, templates used in turn.

    Args:
      template_set: ``"train"`` or ``"heldout"``.
      n: number of problems (>= 0); a larger ``n`` extends a smaller one.
      steps: operations per problem, 1..3 (conditions = steps + 1).
      seed: problems are a pure function of ``(template_set, n, steps, seed)``.

    Raises:
      DataError: an unknown set, ``steps`` outside 1..3 or ``n < 0``.
    """
    if template_set not in TEMPLATES:
        raise DataError(f"unknown template set {template_set!r}; valid: {', '.join(ARITH_SETS)}")
    if steps not in STEPS:
        raise DataError(f"steps must be 1, 2 or 3, got {steps}")
    if n < 0:
        raise DataError(f"n must be >= 0, got {n}")
    templates = TEMPLATES[template_set]
    rng = random.Random(f"arith-{template_set}-{steps}-{seed}")
    schedule = list(itertools.product(OPS, repeat=steps))
    rng.shuffle(schedule)
    fam = f"arith-{template_set}{steps}"
    out = []
    for i in range(n):
        t = templates[i % len(templates)]
        out.append(_one(rng, t, _NAMES[template_set], schedule[i % len(schedule)],
                        f"arith/{template_set}/{steps}/{seed}/{i}/{t.tid}", fam))
    return out
