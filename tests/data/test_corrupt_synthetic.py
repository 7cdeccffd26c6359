"""Numeric corruption and the synthetic generator."""

from __future__ import annotations

import random
import re

import pytest

from jaxrl_mt.data.corrupt import corrupt_task, corrupt_text, corruptible_indices
from jaxrl_mt.data.loaders import asset_path, load_gsm8k, load_rlsta_add
from jaxrl_mt.data.numbers import NUMBER_RE, number_list
from jaxrl_mt.data.records import DataError, ShardedTask
from jaxrl_mt.data.synthetic import format_answer, recompute_answer, synthetic_tasks


def _mask(text: str) -> str:
    return NUMBER_RE.sub("#", text)


# --------------------------------------------------------------------------- synthetic


def test_synthetic_hand_checked():
    t = synthetic_tasks(1, steps=3, seed=7)[0]
    assert t.conditions == (
        "Ben starts with 15 books.",
        "On the first day, Ben receives 17 books from a friend.",
        "On the second day, Ben sells 12 books.",
        "On the third day, Ben finds 6 books.",
    )
    assert t.target == "How many books does Ben have at the end of the third day?"
    assert t.answer == str(15 + 17 - 12 + 6)
    assert t.full_prompt == " ".join(t.conditions) + " " + t.target


@pytest.mark.parametrize("steps", [0, 1, 4, 8])
def test_synthetic_difficulty_knob(steps):
    tasks = synthetic_tasks(20, steps=steps, seed=3, ops=("+", "-", "*", "/"))
    assert len(tasks) == 20
    for t in tasks:
        assert len(t.conditions) == steps + 1 and len(t.shards) <= 10
        assert len(t.meta["synthetic_ops"]) == steps
        assert recompute_answer(t) == t.answer and int(t.answer) >= 0
        assert all(len(number_list(c)) == 1 for c in t.conditions)
    assert tasks == synthetic_tasks(20, steps=steps, seed=3, ops=("+", "-", "*", "/"))
    assert tasks != synthetic_tasks(20, steps=steps, seed=4, ops=("+", "-", "*", "/"))


def test_synthetic_ops_restriction_and_errors():
    for t in synthetic_tasks(10, steps=5, seed=0, ops=("*",)):
        assert set(t.meta["synthetic_ops"]) == {"*"}
        assert all("times as large" in c for c in t.conditions[1:])
    for bad in [dict(steps=9), dict(ops=("^",)), dict(ops=())]:
        with pytest.raises(DataError):
            synthetic_tasks(1, **bad)


def test_format_answer():
    from fractions import Fraction

    assert format_answer(Fraction(18)) == "18"
    assert format_answer(Fraction(7, 2)) == "3.5"
    assert format_answer(Fraction(7, 3)) == "7/3"


# --------------------------------------------------------------------------- corruption


def test_corrupt_text_keeps_wording_and_style():
    rng = random.Random(0)
    for text in ["It costs $1,250 per month.", "A can is $0.99 now.", "The bill rises by 10% this year.",
                 "She walks 3.5 miles.", "He has 7 cats."]:
        for _ in range(20):
            out = corrupt_text(text, rng)
            assert _mask(out) == _mask(text)  # same words, units, punctuation
            old, new = number_list(text), number_list(out)
            assert old != new
            m_old, m_new = NUMBER_RE.search(text).group(), NUMBER_RE.search(out).group()
            assert ("," in m_old) == ("," in m_new) or float(m_new.replace(",", "")) < 1000
            assert len(m_old.partition(".")[2]) == len(m_new.partition(".")[2])  # decimals kept
            if "%" in text:
                assert 0 < float(m_new) <= 100
    with pytest.raises(DataError, match="no number"):
        corrupt_text("no digits here", rng)


def test_corrupt_task_on_gsm8k_sample():
    tasks = load_gsm8k(asset_path("gsm8k/train_sample.jsonl"))
    done = 0
    for t in tasks:
        try:
            c = corrupt_task(t, seed=5)
        except DataError:
            assert not any(number_list(x) for x in t.conditions)
            continue
        done += 1
        assert c.answer == t.answer and c.conditions == t.conditions and c.full_prompt == t.full_prompt
        assert c.corrupted_indices  # at least one shard corrupted
        for i in c.corrupted_indices:
            assert number_list(c.corrupted[i]) != number_list(t.conditions[i])
            assert _mask(c.corrupted[i]) == _mask(t.conditions[i])
        # every shard with a number (outside clock times and ratios like 7:30) is corrupted by default
        assert set(c.corrupted_indices) == set(corruptible_indices(t))
        assert set(corruptible_indices(t)) >= {i for i, x in enumerate(t.conditions) if number_list(x) and ":" not in x}
        assert c == corrupt_task(t, seed=5)  # deterministic
    assert done >= 55


def test_corrupt_task_n_shards_and_seed():
    t = load_rlsta_add(asset_path("rlsta/mt_add_math_train_sample.jsonl"))[2]
    one = corrupt_task(t, seed=0, n_shards=1)
    assert len(one.corrupted_indices) == 1
    assert sum(c is not None for c in one.corrupted) == 1
    variants = {corrupt_task(t, seed=s, n_shards=2).corrupted for s in range(8)}
    assert len(variants) > 1
    with pytest.raises(DataError, match="n_shards"):
        corrupt_task(t, n_shards=0)


def test_corrupt_synthetic_recomputes_a_different_answer():
    for t in synthetic_tasks(50, steps=3, seed=11, ops=("+", "-", "*", "/")):
        for n in (None, 1):
            c = corrupt_task(t, seed=3, n_shards=n)
            assert c.answer == t.answer  # gold stays the clean problem's
            texts = tuple(x if x is not None else o for x, o in zip(c.corrupted, t.conditions))
            assert c.meta["corrupted_answer"] == recompute_answer(t, texts) != t.answer
            for i in c.corrupted_indices:
                assert number_list(c.corrupted[i]) != number_list(t.conditions[i])


def test_corrupt_task_without_numbers_is_an_error():
    t = ShardedTask("x", "math", "How old is he?", ("He is old.",), "He is old. How old is he?", "90")
    with pytest.raises(DataError, match="no condition shard holds a number"):
        corrupt_task(t)


def test_clock_times_are_left_alone():
    t = ShardedTask("x", "math", "When?", ("The bus leaves at 7:30 and costs $4.",), "…", "1")
    for s in range(10):
        c = corrupt_task(t, seed=s)
        assert "7:30" in c.corrupted[0] and re.search(r"\$\d+", c.corrupted[0]).group() != "$4"
