"""One test per scenario kind, on a hand-written problem with the expected turns written out."""

from __future__ import annotations

import pytest

from jaxrl_mt.data.numbers import number_list
from jaxrl_mt.data.records import SCENARIO_KINDS, DataError, ShardedTask
from jaxrl_mt.data.scenarios import CORRECTION_TEMPLATE, build_scenario, join_shards
from jaxrl_mt.data.synthetic import recompute_answer, synthetic_tasks

TARGET = "How many apples does Tom have now?"
C0, C1, C2 = "Tom has 5 apples.", "He buys 3 more apples.", "He eats 2 apples."
X1, X2 = "He buys 7 more apples.", "He eats 4 apples."
FULL = "Tom has 5 apples. He buys 3 more apples. He eats 2 apples. How many apples does Tom have now?"


def fix(s: str) -> str:
    return CORRECTION_TEMPLATE.format(original=s)


@pytest.fixture
def task() -> ShardedTask:
    return ShardedTask(
        task_id="hand/0",
        domain="math",
        target=TARGET,
        conditions=(C0, C1, C2),
        full_prompt=FULL,
        answer="6",
        corrupted=(None, X1, X2),
    )


def test_full(task):
    s = build_scenario(task, "full")
    assert s.turns == (FULL,)
    assert (s.anchor_prompt, s.answer, s.kind) == (FULL, "6", "full")


def test_concat(task):
    s = build_scenario(task, "concat")
    assert s.turns == (f"{TARGET}\n- {C0}\n- {C1}\n- {C2}",)


def test_sharded_and_mt_add_alias(task):
    s = build_scenario(task, "sharded")
    assert s.turns == (TARGET, C0, C1, C2)
    assert s.meta["order"] == (0, 1, 2) and s.meta["n_shards"] == 4
    assert build_scenario(task, "mt_add") == s


def test_sharded_shuffled_is_seeded_permutation(task):
    a = build_scenario(task, "sharded", shuffle=True, seed=3)
    assert a == build_scenario(task, "sharded", shuffle=True, seed=3)
    order = a.meta["order"]
    assert sorted(order) == [0, 1, 2]
    assert a.turns == (TARGET, *(task.conditions[i] for i in order))
    orders = {build_scenario(task, "sharded", shuffle=True, seed=s).meta["order"] for s in range(20)}
    assert len(orders) > 1  # the seed matters


def test_recap(task):
    s = build_scenario(task, "recap")
    assert s.turns == (TARGET, C0, C1, C2, f"Just to recap:\n- {TARGET}\n- {C0}\n- {C1}\n- {C2}")


def test_snowball(task):
    s = build_scenario(task, "snowball")
    head = "To reiterate what I said so far:"
    assert s.turns == (
        TARGET,
        f"{head}\n- {TARGET}\nAnd also: {C0}",
        f"{head}\n- {TARGET}\n- {C0}\nAnd also: {C1}",
        f"{head}\n- {TARGET}\n- {C0}\n- {C1}\nAnd also: {C2}",
    )


def test_mt_refine(task):
    s = build_scenario(task, "mt_refine")
    assert s.turns == (f"{TARGET}\n- {C0}\n- {X1}\n- {X2}", fix(C1), fix(C2))
    assert s.meta["corrupted"] == (1, 2)
    assert s.answer == "6" and s.anchor_prompt == FULL


def test_atr(task):
    s = build_scenario(task, "atr")
    assert s.turns == (TARGET, C0, X1, X2, fix(C1), fix(C2))


def test_aiwr(task):
    s = build_scenario(task, "aiwr")
    assert s.turns == (TARGET, C0, X1, fix(C1), X2, fix(C2))


def test_aiwr_shuffled_keeps_each_fix_after_its_shard(task):
    s = build_scenario(task, "aiwr", shuffle=True, seed=5)
    order = s.meta["order"]
    expected = [TARGET]
    for i in order:
        expected.append({0: C0, 1: X1, 2: X2}[i])
        if i:
            expected.append(fix(task.conditions[i]))
    assert s.turns == tuple(expected)


def test_identical_corruption_is_not_a_correction(task):
    t = task.replace(corrupted=(None, C1, X2))  # RLSTA quirk: "modified" shard equal to the original
    assert build_scenario(t, "mt_refine").turns == (f"{TARGET}\n- {C0}\n- {C1}\n- {X2}", fix(C2))


def test_underspecified(task):
    s = build_scenario(task, "underspecified", n_remove=1, seed=0)
    assert len(s.removed) == 1
    (r,) = s.removed
    kept = [c for i, c in enumerate(task.conditions) if i != r]
    assert s.turns == (" ".join(kept + [TARGET]),)
    assert s.anchor_prompt == FULL and s.answer == "6"
    two = build_scenario(task, "underspecified", n_remove=2, seed=0)
    assert len(two.removed) == 2 and len(set(two.removed)) == 2
    kept2 = [c for i, c in enumerate(task.conditions) if i not in two.removed]
    assert two.turns == (join_shards(TARGET, kept2),)
    with pytest.raises(DataError, match="n_remove"):
        build_scenario(task, "underspecified", n_remove=3)


def test_underspecified_removes_required_conditions():
    t = ShardedTask(
        task_id="hand/1",
        domain="math",
        target="How much does Ann pay?",
        conditions=("Ann goes shopping.", "She buys 4 pens.", "Each pen costs $2."),
        full_prompt="Ann goes shopping. She buys 4 pens. Each pen costs $2. How much does Ann pay?",
        answer="8",
    )
    for seed in range(10):
        s = build_scenario(t, "underspecified", seed=seed)
        assert 1 <= len(s.removed) <= 2
        assert 0 not in s.removed  # "Ann goes shopping." carries no number: not required


def test_join_shards_rebuilds_prompt():
    assert join_shards("what is the total?", ["she has 3 cats", "He has 2 dogs."]) == (
        "She has 3 cats. He has 2 dogs. What is the total?"
    )


def test_refine_kinds_corrupt_a_task_without_corruption(task):
    clean = task.replace(corrupted=None)
    s = build_scenario(clean, "atr", seed=1)
    assert s.meta["corrupted"] == (0, 1, 2)  # every condition holds a number
    shown, fixes = s.turns[1:4], s.turns[4:]
    for orig, bad in zip(clean.conditions, shown):
        assert number_list(orig) != number_list(bad)
    assert fixes == tuple(fix(c) for c in clean.conditions)
    assert s == build_scenario(clean, "atr", seed=1)
    one = build_scenario(clean, "mt_refine", seed=1, n_shards=1)
    assert len(one.meta["corrupted"]) == 1 and len(one.turns) == 2


def test_synthetic_refine_records_the_changed_answer():
    t = synthetic_tasks(1, steps=3, seed=4)[0]
    s = build_scenario(t, "mt_refine", seed=2)
    assert s.answer == t.answer
    assert s.meta["corrupted_answer"] != t.answer


def test_unknown_kind_names_it_and_lists_valid(task):
    with pytest.raises(DataError) as e:
        build_scenario(task, "mt_flip")
    msg = str(e.value)
    assert "'mt_flip'" in msg
    assert all(k in msg for k in SCENARIO_KINDS)


def test_every_kind_builds_on_synthetic_and_keeps_anchor():
    for t in synthetic_tasks(5, steps=3, seed=1):
        assert recompute_answer(t) == t.answer
        for kind in SCENARIO_KINDS:
            s = build_scenario(t, kind, seed=0, shuffle=True)
            assert s.anchor_prompt == t.full_prompt and s.answer == t.answer and s.turns
