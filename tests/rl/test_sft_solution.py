"""SFT on single-turn worked solutions (``sft.targets = "solution"``: experiment 3's stage 0)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from configs.sft import get_config as sft_config
from jaxrl_mt.batching import fine_bucket
from jaxrl_mt.data.arith import arith_tasks
from jaxrl_mt.data.records import ShardedTask
from jaxrl_mt.rl.data import validate_config
from jaxrl_mt.rl.loop import Trainer
from jaxrl_mt.rl.recipe import ConfigError
from jaxrl_mt.rl.sft_data import SftItem, solution_items


def test_solution_items_are_single_turn_prompt_and_worked_solution() -> None:
    tasks = arith_tasks("train", 2, steps=2)
    assert solution_items(tasks) == [SftItem(t.task_id, t.task_id, (("user", t.full_prompt),), t.meta["solution"])
                                     for t in tasks]
    bare = ShardedTask(task_id="x/1", domain="math", target="How many?", conditions=("A has 3.",),
                       full_prompt="A has 3. How many?", answer="3")
    with pytest.raises(ConfigError, match=r"task 'x/1': sft.targets='solution' needs a worked solution"):
        solution_items([*tasks, bare])


def test_fine_bucket_by_hand() -> None:
    assert [fine_bucket(n, 32) for n in (1, 32, 33, 151, 160, 161, 512)] == [32, 32, 64, 160, 160, 192, 512]
    assert fine_bucket(513, 32) == 1024 and fine_bucket(2000, 32) == 2048  # powers of two past 16 multiples


def test_stage0_trains_on_worked_solutions_only(tiny_chat_model_dir: Path, tmp_path: Path) -> None:
    c = sft_config("stage0")
    c.model, c.workdir = str(tiny_chat_model_dir), str(tmp_path / "w")
    c.data.add_source = "arith:train:12:3"
    c.sft.val_fraction = 0.25
    c.rl.steps, c.rl.batch_size, c.rl.warmup_steps = 2, 2, 0
    c.eval.every, c.eval.probe_source, c.checkpoint.every, c.export = 2, "", 2, False
    Trainer(c).run()
    rows = [json.loads(x) for f in ("train_rows.jsonl", "val_rows.jsonl")
            for x in (tmp_path / "w" / f).read_text().splitlines()]
    by_id = {t.task_id: t for t in arith_tasks("train", 12, steps=3)}
    assert sorted(r["task_id"] for r in rows) == sorted(by_id)  # every problem once, split by problem
    for r in rows:  # one user turn (no history), the worked solution as the target
        assert r["messages"] == [["user", by_id[r["task_id"]].full_prompt]]
        assert r["target"] == by_id[r["task_id"]].meta["solution"]
    metrics = [json.loads(x) for x in (tmp_path / "w" / "metrics.jsonl").read_text().splitlines()]
    assert {m["step"] for m in metrics if "train/loss" in m} == {1, 2}
    assert any("eval/val_loss" in m for m in metrics)


def test_bad_targets_fail_at_start(tmp_path: Path) -> None:
    c = sft_config("stage0")
    c.workdir, c.sft.targets = str(tmp_path / "w"), "answers"
    with pytest.raises(ConfigError, match=r"sft.targets must be 'history' or 'solution', got 'answers'"):
        validate_config(c)


def test_eval_select_keeps_the_best_probe_checkpoint(tiny_chat_model_dir: Path, tmp_path: Path) -> None:
    """``eval.select`` names a probe metric: the kept (and exported) checkpoint is the probe's best, not
    the method's own validation loss; a tie keeps the earlier (the tiny model scores 0 every time)."""
    c = sft_config("stage0")
    c.model, c.workdir = str(tiny_chat_model_dir), str(tmp_path / "w")
    c.data.add_source, c.sft.val_fraction = "arith:train:8:1", 0.25
    c.rl.steps, c.rl.batch_size, c.rl.warmup_steps = 2, 2, 0
    c.eval.every, c.checkpoint.every, c.export = 1, 2, False
    c.eval.probe_source, c.eval.probe_limit, c.eval.probe_kinds, c.eval.probe_every = "arith:train:2:1:9", 0, "full", 1
    c.eval.max_new_tokens = c.rl.max_new_tokens = 4
    c.eval.select = "probe/full_strict:max"
    Trainer(c).run()
    best = json.loads((tmp_path / "w" / "best.json").read_text())
    assert best == {"step": 1, "value": 0.0, "metric": "probe/full_strict"}
    probed = [json.loads(x) for x in (tmp_path / "w" / "metrics.jsonl").read_text().splitlines()]
    assert sorted(m["step"] for m in probed if "probe/full_strict" in m) == [0, 1, 2]


@pytest.mark.parametrize(("select", "probe", "msg"), [
    ("probe/full_strict", "arith:train:2", r"eval.select must be 'METRIC:min' or 'METRIC:max'"),
    ("probe/full_strict:best", "arith:train:2", r"eval.select must be 'METRIC:min' or 'METRIC:max'"),
    ("probe/full_strict:max", "", r"reads the probe, but eval.probe_source is empty")])
def test_bad_select_fails_at_start(select: str, probe: str, msg: str, tmp_path: Path) -> None:
    c = sft_config("stage0")
    c.workdir, c.eval.select, c.eval.probe_source = str(tmp_path / "w"), select, probe
    with pytest.raises(ConfigError, match=msg):
        validate_config(c)
