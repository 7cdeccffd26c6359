"""Four-operation problem families with worked solutions (experiment 3): exact answers and solutions,
the balanced operation schedule, disjoint template sets, the source spec."""

from __future__ import annotations

import itertools
import re
from collections import Counter

import pytest

from jaxrl_mt.data import build_scenario, recompute_answer
from jaxrl_mt.data.arith import HELDOUT_NAMES, OPS, TEMPLATES, TRAIN_NAMES, arith_tasks, solution_text
from jaxrl_mt.data.families import template_of
from jaxrl_mt.data.loaders import load_source
from jaxrl_mt.data.records import DataError

_EQ = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)\.")


@pytest.mark.parametrize("template_set", ["train", "heldout"])
@pytest.mark.parametrize("steps", [1, 2, 3])
def test_answers_and_worked_solutions_are_exact(template_set: str, steps: int) -> None:
    tasks = arith_tasks(template_set, 64, steps=steps, seed=5)
    assert tasks[:9] == arith_tasks(template_set, 9, steps=steps, seed=5)  # a larger n extends a smaller one
    assert tasks != arith_tasks(template_set, 64, steps=steps, seed=6)
    for t in tasks:
        ops = t.meta["synthetic_ops"]
        facts = [int(n) for c in t.conditions for n in re.findall(r"\d+", c)]
        assert len(t.conditions) == steps + 1 and len(facts) == steps + 1  # one number per fact
        assert recompute_answer(t) == t.answer  # MT-Refine's corruption recomputes from the texts
        assert int(t.answer) not in facts  # echoing a fact is never right
        eqs = _EQ.findall(t.meta["solution"])
        assert [op for _, op, _, _ in eqs] == list(ops)
        prev = facts[0]
        for (a, op, b, c), n in zip(eqs, facts[1:]):
            a, b, c = int(a), int(b), int(c)
            assert (a, b) == (prev, n)  # each equation continues the last one with the fact's number
            assert c == {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op] and (op != "/" or a % b == 0)
            assert 1 <= c <= 99
            prev = c
        assert t.meta["solution"].endswith(f"The answer is {t.answer}.") and str(prev) == t.answer
        assert t.full_prompt == " ".join(t.conditions) + " " + t.target
    assert [template_of(t) for t in tasks[: len(TEMPLATES[template_set])]] == [x.tid for x in TEMPLATES[template_set]]


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_operation_sequences_are_exactly_balanced(steps: int) -> None:
    n = 4 ** steps
    seqs = Counter(t.meta["synthetic_ops"] for t in arith_tasks("train", 2 * n, steps=steps, seed=0))
    assert seqs == {s: 2 for s in itertools.product(OPS, repeat=steps)}  # every sequence twice in 2 blocks


def test_solution_text_by_hand() -> None:
    assert solution_text(12, ("+", "*"), [5, 3], [17, 51]) == "12 + 5 = 17. 17 * 3 = 51. The answer is 51."


def test_template_sets_share_no_sentence_name_object_or_id() -> None:
    assert not {x.tid for x in TEMPLATES["train"]} & {x.tid for x in TEMPLATES["heldout"]}
    assert not set(TRAIN_NAMES) & set(HELDOUT_NAMES)
    words = lambda s: re.sub(r"\{\w+\}", "", s).strip(" .?").lower()  # noqa: E731

    def texts(tset: str) -> set[str]:
        return {words(s) for x in TEMPLATES[tset] for s in (x.start, x.question, *x.ops.values())}

    assert not texts("train") & texts("heldout")
    assert not {o for x in TEMPLATES["train"] for o in x.objects} - {""} & {o for x in TEMPLATES["heldout"]
                                                                          for o in x.objects}
    assert all(set(x.ops) == set(OPS) for xs in TEMPLATES.values() for x in xs)


def test_source_spec_and_scenarios() -> None:
    assert load_source("arith:heldout:7:3:2") == arith_tasks("heldout", 7, steps=3, seed=2)
    assert load_source("arith:train:5") == arith_tasks("train", 5, steps=1, seed=0)
    t = arith_tasks("train", 1, steps=3)[0]
    s = build_scenario(t, "sharded", seed=0)
    assert s.turns[0] == t.target and list(s.turns[1:]) == list(t.conditions)  # question first, facts in order
    with pytest.raises(DataError, match="arith:SET:N"):
        load_source("arith:train:x")


def test_bad_arguments_fail_clearly() -> None:
    with pytest.raises(DataError, match="unknown template set 'nope'"):
        arith_tasks("nope", 1)
    with pytest.raises(DataError, match="steps must be 1, 2 or 3, got 4"):
        arith_tasks("train", 1, steps=4)
    with pytest.raises(DataError, match="n must be >= 0"):
        arith_tasks("train", -1)
