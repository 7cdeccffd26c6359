"""Templated one- and two-step addition/subtraction word problems in two disjoint template sets.

The RLSTA experiment (issue 15) needs problems where the embedded 135M model is neither at 0 nor
at ceiling single-turn and loses accuracy when the facts arrive over several turns: one-step
addition or subtraction with small numbers does (see docs/results/calibration.md). To show that
training generalises, the held-out problems must come from *other surface templates* than the
training problems; so the templates here are split into two named sets with nothing in common
(no sentence, subject, name or object word list):

- ``train``: pocket, bus, shelf, wallet, farm, aquarium (names from ``TRAIN_NAMES``);
- ``heldout``: garden, parking lot, cookie jar, game score, concert hall (``HELDOUT_NAMES``).

A problem is a start fact and ``steps`` changes, each its own condition holding exactly one
number, and a question (the target shard)::

    Target:     "How many passengers are on the bus now?"
    Conditions: "There are 23 passengers on a bus."
                "At the next stop, 14 passengers get off."

Metadata ``synthetic_ops`` records the operations, so :func:`jaxrl_mt.data.recompute_answer`
recomputes the answer from the condition texts and MT-Refine corruption knows the answer of the
corrupted problem. Problems are a pure function of ``(template set, n, steps, seed)``; ids are
``family/<set>/<steps>/<seed>/<i>/<template id>``.
"""

from __future__ import annotations

import dataclasses
import random
import re

from jaxrl_mt.data.records import DataError, ShardedTask

__all__ = ["FAMILY_SETS", "HELDOUT_NAMES", "TEMPLATES", "TRAIN_NAMES", "Template", "family_tasks", "template_of"]


@dataclasses.dataclass(frozen=True)
class Template:
    """One surface form: a start fact, one sentence per operation, a question.

    ``{a}`` / ``{n}`` are the numbers, ``{name}`` and ``{x}`` are drawn from ``names`` / ``objects``.
    """

    tid: str  # template id (unique over both sets)
    start: str  # start fact, e.g. "{name} has {a} {x}."
    plus: str  # an increase by {n}
    minus: str  # a decrease by {n}
    question: str  # the target shard
    objects: tuple[str, ...] = ("",)  # fillers of {x}


START_RANGE = (6, 20)  # start values: small numbers (the 135M model's sums go wrong beyond two digits)
OPERAND_RANGE = (2, 9)  # added or subtracted amounts
TRAIN_NAMES = ("Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro")
HELDOUT_NAMES = ("Nadia", "Oscar", "Priya", "Quentin", "Rosa", "Sven", "Tomas", "Uma")

TEMPLATES: dict[str, tuple[Template, ...]] = {
    "train": (
        Template("pocket", "{name} has {a} {x}.", "{name} gets {n} more {x} from a friend.",
                 "{name} gives {n} {x} to a classmate.", "How many {x} does {name} have now?",
                 ("marbles", "stickers", "pencils", "stamps")),
        Template("bus", "There are {a} passengers on a bus.", "At the next stop, {n} passengers get on.",
                 "At the next stop, {n} passengers get off.", "How many passengers are on the bus now?"),
        Template("shelf", "A shelf holds {a} books.", "The librarian adds {n} books to the shelf.",
                 "Visitors borrow {n} books from the shelf.", "How many books are on the shelf now?"),
        Template("wallet", "{name} has {a} dollars.", "{name} earns {n} dollars washing cars.",
                 "{name} spends {n} dollars on lunch.", "How many dollars does {name} have now?"),
        Template("farm", "A farm has {a} {x}.", "The farmer buys {n} more {x}.", "The farmer sells {n} of the {x}.",
                 "How many {x} does the farm have now?", ("sheep", "goats", "chickens", "cows")),
        Template("aquarium", "An aquarium has {a} fish.", "Then {n} baby fish hatch in the aquarium.",
                 "Then {n} fish are moved to another aquarium.", "How many fish are in the aquarium now?"),
    ),
    "heldout": (
        Template("garden", "A garden has {a} {x}.", "The gardener plants {n} more {x}.",
                 "For a bouquet, {n} of the {x} are picked.", "How many {x} are in the garden at the end?",
                 ("roses", "tulips", "daisies", "lilies")),
        Template("parking", "A parking lot has {a} cars in it.", "Later, {n} more cars drive in.",
                 "Later, {n} cars drive out.", "How many cars are in the parking lot after that?"),
        Template("jar", "A jar contains {a} cookies.", "Mom bakes {n} cookies and puts them in the jar.",
                 "The kids eat {n} cookies from the jar.", "How many cookies are in the jar in the end?"),
        Template("score", "{name} has {a} points in a game.", "{name} wins {n} points in the next round.",
                 "{name} loses {n} points in the next round.", "What is {name}'s final score?"),
        Template("hall", "{a} people are sitting in a concert hall.", "{n} more people arrive and sit down.",
                 "{n} people leave during the break.", "How many people are in the hall after that?"),
    ),
}
FAMILY_SETS = tuple(TEMPLATES)
_SEQUENCE_RE = re.compile(r"^(?:Later, |Then |At the next stop, |For a bouquet, )")
_NAMES = {"train": TRAIN_NAMES, "heldout": HELDOUT_NAMES}


def template_of(task: ShardedTask) -> str:
    """The template id of a family task (from its metadata), or "" for other tasks."""
    return str(task.meta.get("template", ""))


def _numbers(rng: random.Random, ops: tuple[str, ...]) -> tuple[int, list[int], int]:
    """Start value (START_RANGE), operands (OPERAND_RANGE) and answer; every value stays >= 1 and
    the answer differs from every number in the facts (a reply that repeats a fact is wrong)."""
    lo, hi = OPERAND_RANGE
    for _ in range(1000):
        value = start = rng.randint(*START_RANGE)
        operands = []
        for op in ops:
            if op == "+":
                n = rng.randint(lo, hi)
                value += n
            else:
                if value <= lo:
                    break
                n = rng.randint(lo, min(value - 1, hi))
                value -= n
            operands.append(n)
        else:
            if value not in (start, *operands):  # echoing a fact must never be the right answer
                return start, operands, value
    raise DataError(f"could not draw numbers for ops {ops}")  # pragma: no cover - START_RANGE > OPERAND_RANGE


def _one(rng: random.Random, t: Template, names: tuple[str, ...], steps: int, task_id: str, fam: str) -> ShardedTask:
    ops = tuple(rng.choice("+-") for _ in range(steps))
    start, operands, answer = _numbers(rng, ops)
    fill = {"name": rng.choice(names), "x": rng.choice(t.objects)}
    conditions = [t.start.format(a=start, **fill)]
    for k, (op, n) in enumerate(zip(ops, operands)):
        text = (t.plus if op == "+" else t.minus).format(n=n, **fill)
        if k:  # a later change: one sequence word ("Later, 5 cars" -> "After that, 5 cars")
            text = _SEQUENCE_RE.sub("", text)
            text = "After that, " + (text if text.startswith(fill["name"]) else text[0].lower() + text[1:])
        conditions.append(text)
    conditions = [c[0].upper() + c[1:] for c in conditions]
    target = t.question.format(**fill)
    return ShardedTask(
        task_id=task_id, domain="math", target=target, conditions=tuple(conditions),
        full_prompt=" ".join(conditions) + " " + target, answer=str(answer),
        metadata=(("family", fam), ("source", "family"), ("steps", steps), ("synthetic_ops", ops),
                  ("template", t.tid)),
    )


def family_tasks(template_set: str, n: int, *, steps: int = 1, seed: int = 0) -> list[ShardedTask]:
    """``n`` problems from one template set, templates used in turn (round robin).

    Args:
      template_set: ``"train"`` or ``"heldout"``.
      n: number of problems.
      steps: number of additions/subtractions (1 or 2; conditions = steps + 1).
      seed: the problems are a pure function of ``(template_set, n, steps, seed)``; a larger
        ``n`` extends a smaller one.

    Raises:
      DataError: an unknown set, ``steps`` outside 1..2 or ``n < 0``.
    """
    if template_set not in TEMPLATES:
        raise DataError(f"unknown template set {template_set!r}; valid: {', '.join(FAMILY_SETS)}")
    if steps not in (1, 2):
        raise DataError(f"steps must be 1 or 2, got {steps}")
    if n < 0:
        raise DataError(f"n must be >= 0, got {n}")
    templates = TEMPLATES[template_set]
    rng = random.Random(f"family-{template_set}-{steps}-{seed}")
    fam = f"{template_set}{steps}"
    return [_one(rng, templates[i % len(templates)], _NAMES[template_set], steps,
                 f"family/{template_set}/{steps}/{seed}/{i}/{templates[i % len(templates)].tid}", fam)
            for i in range(n)]
