"""Templated add/subtract problem families: exact answers, disjoint template sets, the source spec."""

from __future__ import annotations

import re

import pytest

from jaxrl_mt.data import build_scenario, recompute_answer
from jaxrl_mt.data.families import HELDOUT_NAMES, TEMPLATES, TRAIN_NAMES, family_tasks, template_of
from jaxrl_mt.data.loaders import load_source
from jaxrl_mt.data.records import DataError


@pytest.mark.parametrize("template_set", ["train", "heldout"])
@pytest.mark.parametrize("steps", [1, 2])
def test_answers_are_recomputable_and_deterministic(template_set: str, steps: int) -> None:
    tasks = family_tasks(template_set, 40, steps=steps, seed=3)
    assert tasks == family_tasks(template_set, 40, steps=steps, seed=3)
    assert tasks[:10] == family_tasks(template_set, 10, steps=steps, seed=3)  # a larger n extends a smaller one
    assert tasks != family_tasks(template_set, 40, steps=steps, seed=4)
    for t in tasks:
        assert len(t.conditions) == steps + 1
        assert recompute_answer(t) == t.answer
        assert int(t.answer) >= 1
        assert t.answer not in {n for c in t.conditions for n in re.findall(r"\d+", c)}  # no fact echoes it
        assert t.full_prompt == " ".join(t.conditions) + " " + t.target
    # round robin over the set's templates
    assert [template_of(t) for t in tasks[: len(TEMPLATES[template_set])]] == [x.tid for x in TEMPLATES[template_set]]


def test_template_sets_share_no_sentence_name_or_id() -> None:
    train = {x.tid for x in TEMPLATES["train"]}
    held = {x.tid for x in TEMPLATES["heldout"]}
    assert not train & held
    assert not set(TRAIN_NAMES) & set(HELDOUT_NAMES)
    words = lambda s: re.sub(r"\{\w+\}", "", s).strip(" .?")  # noqa: E731
    tr = {words(s) for x in TEMPLATES["train"] for s in (x.start, x.plus, x.minus, x.question)}
    he = {words(s) for x in TEMPLATES["heldout"] for s in (x.start, x.plus, x.minus, x.question)}
    assert not tr & he


def test_mt_refine_corruption_changes_the_answer() -> None:
    for t in family_tasks("heldout", 20, seed=0):
        s = build_scenario(t, "mt_refine", seed=0)
        meta = dict(s.metadata)
        assert meta["corrupted_answer"] != t.answer
        assert s.turns[-1].startswith("Correction")


def test_source_spec_and_errors() -> None:
    got = load_source("family:heldout:7:2:5")
    assert got == family_tasks("heldout", 7, steps=2, seed=5)
    assert load_source("family:train:3") == family_tasks("train", 3, steps=1, seed=0)
    for bad in ("family:nope:3", "family:train:x", "family:train:3:3", "family:train"):
        with pytest.raises(DataError, match="family"):
            load_source(bad)
