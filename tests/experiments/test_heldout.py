"""The held-out set: size, coverage, and no overlap with any experiment preset's training problems."""

from __future__ import annotations

from pathlib import Path

import pytest

from configs.grpo import get_config as grpo_config
from configs.icpo import get_config as icpo_config
from configs.rlsta import get_config as rlsta_config
from jaxrl_mt.data import build_scenario, load_tasks_jsonl
from jaxrl_mt.data.families import family_tasks
from experiments.heldout import OverlapError, build_heldout, check_disjoint, main, normalise
from jaxrl_mt.rl.loop import load_tasks

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "docs" / "results" / "heldout.jsonl"


def training_tasks(c) -> list:
    specs = ",".join(s for s in (c.data.add_source, c.data.refine_source) if s)
    return load_tasks(specs, c.data)


def test_heldout_size_and_coverage() -> None:
    tasks = build_heldout(seed=0)
    assert len(tasks) >= 300 and len({t.task_id for t in tasks}) == len(tasks)
    convs = [build_scenario(t, kind, seed=0) for t in tasks for kind in ("sharded", "mt_refine")]
    assert len(convs) >= 600
    assert all(len(s.turns) >= 3 for s in convs)  # question + facts, or corrupted facts + corrections
    assert {len(t.conditions) for t in tasks} == {2, 3}


@pytest.mark.parametrize("get_config", [rlsta_config, grpo_config, icpo_config])
def test_no_heldout_item_overlaps_training(get_config) -> None:
    c = get_config("experiment")
    train = training_tasks(c)
    assert len(train) >= 100
    stats = check_disjoint(build_heldout(seed=0), train)
    assert stats["n_texts_heldout"] > 1000
    assert c.eval.probe_source == "tasks:docs/results/heldout.jsonl"


def test_check_disjoint_catches_overlap() -> None:
    held = build_heldout(seed=0, one_step=20, two_step=0)
    train = family_tasks("train", 30, seed=0)
    check_disjoint(held, train)
    with pytest.raises(OverlapError, match="also a training task"):
        check_disjoint(held, train + held[:1])
    same_text = held[0].replace(task_id="other/0", metadata=())
    with pytest.raises(OverlapError, match="shares the text"):
        check_disjoint(held, [same_text])
    with pytest.raises(OverlapError, match="training template"):
        check_disjoint(held, [family_tasks("heldout", 1, seed=99)[0].replace(task_id="x", full_prompt="y",
                                                                           target="z", conditions=("w",))])
    assert normalise("  How many, Apples?\n") == "how many apples"


def test_cli_writes_the_committed_file(tmp_path: Path) -> None:
    out = tmp_path / "h.jsonl"
    assert main(["--out", str(out), "--seed", "0"]) == 0
    assert load_tasks_jsonl(out) == build_heldout(seed=0)
    if COMMITTED.exists():  # the committed file is exactly what the recorded command makes
        assert COMMITTED.read_bytes() == out.read_bytes()
