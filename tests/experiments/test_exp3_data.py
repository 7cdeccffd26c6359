"""Experiment 3's committed problem files: rebuilt byte-identical, balanced, held out from training."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.exp3_data import build, main, split_checks
from experiments.heldout import check_disjoint, normalise
from jaxrl_mt.data.loaders import load_source

DATA = Path(__file__).resolve().parents[2] / "docs/results/exp3/data"


def test_the_committed_files_are_what_the_command_writes(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path)]) == 0
    for name in ("train.jsonl", "validation.jsonl", "heldout.jsonl", "arms.jsonl", "probe.jsonl", "checks.json"):
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name


def test_splits_are_disjoint_and_balanced() -> None:
    splits = build()
    train, val, held = splits["train"], splits["validation"], splits["heldout"]
    assert [len(train), len(val), len(held)] == [2000, 240, 416]
    assert not {normalise(t.full_prompt) for t in val} & {normalise(t.full_prompt) for t in train}
    assert not {t.task_id for t in val} & {t.task_id for t in train}
    check_disjoint(held, train + val)  # ids, templates and every text (raises on an overlap)
    for name, tasks in splits.items():
        c = split_checks(tasks)
        assert max(c["holding_op_pct"].values()) <= 40.0, name  # no operation in more than 40% of problems
        assert c["shortcut_pct"]["add"] < 16 and c["shortcut_pct"]["last"] == c["shortcut_pct"]["largest"] == 0
    ids = {name: {t.task_id for t in tasks} for name, tasks in splits.items()}
    assert ids["arms"] <= ids["train"] and ids["probe"] <= ids["validation"]  # subsets, never held-out problems
    assert [len(splits["arms"]), len(splits["probe"])] == [128, 96]
    # what a run reads through its source spec is the split itself
    key = lambda t: (t.task_id, t.full_prompt, t.conditions, t.answer, t.meta)  # noqa: E731
    assert [key(t) for t in load_source(f"tasks:{DATA / 'validation.jsonl'}")] == [key(t) for t in val]


def test_checks_count_by_hand() -> None:
    tasks = load_source("arith:train:4:1:0")  # one problem per operation (the balanced schedule)
    c = split_checks(tasks)
    assert c["problems"] == 4 and c["holding_op_pct"] == {"+": 25.0, "-": 25.0, "*": 25.0, "/": 25.0}
    add = sum(t.meta["synthetic_ops"] == ("+",) for t in tasks)  # a one-step sum is "add every number"
    assert c["shortcut_pct"]["add"] == 100 * add / 4 == 25.0
    assert json.loads((DATA / "checks.json").read_text())["heldout"]["problems"] == 416
