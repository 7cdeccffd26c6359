"""SFT and DPO as training methods: the loop, the kept best checkpoint, resume after a kill, bad input.

The tiny random chat model solves nothing, so these runs start from rows already cached in the
workdir (``train_rows.jsonl`` / ``val_rows.jsonl``, what a first run writes); how the rows are made
from the filter's samples is tested in test_sft.py / test_dpo.py / test_arms_pipeline.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from configs.dpo import get_config as dpo_config
from configs.sft import get_config as sft_config
from jaxrl_mt.models.hf_io import load_hf_folder
from jaxrl_mt.rl.best import BestKeeper
from jaxrl_mt.rl.data import validate_config
from jaxrl_mt.rl.recipe import ConfigError
from jaxrl_mt.rl.loop import Trainer
from tests.rl.test_loop import run_killed_in_third_step
from jaxrl_mt.rl.sft_data import DpoPair
from jaxrl_mt.rl.supervised import _read_rows, _write_rows
from tests.rl._three_steps import sup_rows as _rows


def _config(kind: str, model_dir: Path, wd: Path, steps: int = 4):
    c = (sft_config if kind == "sft" else dpo_config)("cpu")
    c.model, c.workdir = str(model_dir), str(wd)
    c.rl.steps, c.rl.batch_size, c.rl.lr = steps, 2, 1e-2
    c.eval.every, c.checkpoint.every, c.export = 1, 1, True
    wd.mkdir(parents=True, exist_ok=True)
    _write_rows(wd / "train_rows.jsonl", _rows(kind, 6))
    _write_rows(wd / "val_rows.jsonl", _rows(kind, 8)[6:])
    return c


def _train_rows(wd: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (wd / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r for r in rows if "train/loss" in r}


def _val(wd: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (wd / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["eval/val_loss"] for r in rows if "eval/val_loss" in r}


@pytest.mark.parametrize("kind", ["sft", pytest.param("dpo", marks=pytest.mark.slow)])  # dpo: 27 s, suite budget
def test_a_killed_run_resumes_identically_and_exports_the_best_checkpoint(kind, tiny_chat_model_dir, tmp_path,
                                                                           monkeypatch):
    full = tmp_path / "full"
    Trainer(_config(kind, tiny_chat_model_dir, full)).run()
    crashed = tmp_path / "crashed"
    run_killed_in_third_step(monkeypatch, "update",
                             lambda: Trainer(_config(kind, tiny_chat_model_dir, crashed)))
    Trainer(_config(kind, tiny_chat_model_dir, crashed)).run()
    a, b = _train_rows(full), _train_rows(crashed)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for step in (3, 4):
        for k, v in a[step].items():
            if not k.startswith("perf/") and isinstance(v, float):
                assert math.isclose(v, b[step][k], rel_tol=1e-6, abs_tol=1e-6), (step, k)
    val = _val(full)
    assert sorted(val) == [0, 1, 2, 3, 4]
    best_step = min((s for s in val if s > 0), key=lambda s: val[s])  # step 0 is the initial model
    info = json.loads((full / "best.json").read_text())
    assert info["step"] == best_step and info["value"] == pytest.approx(val[best_step], rel=1e-6)
    summary = (full / "summary.txt").read_text()
    assert f"exported: the best checkpoint, step {best_step}" in summary
    if kind == "dpo":  # the policy is the reference before training: every pair's loss is log 2
        assert val[0] == pytest.approx(math.log(2.0), abs=1e-4)
        assert "train/rewards/margins" in a[1] and "train/logps/chosen" in a[1]
    # the export holds the kept step's parameters: its validation loss is the kept value
    _, exported = load_hf_folder(full / "export")
    t = Trainer(_config(kind, tiny_chat_model_dir, tmp_path / "check", steps=1))
    ev = t.evaluate(exported, t.prepare()[1])
    assert ev["eval/val_loss"] == pytest.approx(info["value"], rel=1e-4)


def test_best_keeper_keeps_the_lowest_after_step_zero_and_survives_a_restart(tmp_path):
    params = {"w": np.arange(4, dtype=np.float32)}
    k = BestKeeper(tmp_path, "eval/val_loss", "min", log=lambda m: None)
    assert not k.offer(0, params, {"eval/val_loss": 0.1})  # the initial model is not a checkpoint
    assert k.offer(1, params, {"eval/val_loss": 2.0})
    assert not k.offer(2, {"w": params["w"] + 1}, {"eval/val_loss": 3.0})
    assert not k.offer(3, {"w": params["w"] + 1}, {"eval/val_loss": math.nan})
    assert k.offer(4, {"w": params["w"] + 5}, {"eval/val_loss": 1.5})
    again = BestKeeper(tmp_path, "eval/val_loss", "min", log=lambda m: None)  # a resumed run
    assert again.info == {"step": 4, "value": 1.5, "metric": "eval/val_loss"}
    assert not again.offer(5, params, {"eval/val_loss": 1.6})
    np.testing.assert_array_equal(np.asarray(again.params(like=params)["w"]), params["w"] + 5)
    with pytest.raises(ValueError, match="min|max"):
        BestKeeper(tmp_path, "x", "lowest")


def test_cached_rows_round_trip_and_a_bad_line_names_file_and_line(tmp_path):
    rows = _rows("dpo", 3)
    _write_rows(tmp_path / "r.jsonl", rows)
    assert _read_rows(tmp_path / "r.jsonl", DpoPair) == rows
    (tmp_path / "r.jsonl").write_text((tmp_path / "r.jsonl").read_text() + '{"item_id": "x"}\n')
    with pytest.raises(ConfigError, match=r"r\.jsonl:4: not a DpoPair row"):
        _read_rows(tmp_path / "r.jsonl", DpoPair)


def test_bad_supervised_settings_fail_at_start(tmp_path):
    cases = [(sft_config, "sft.val_fraction", 1.0, r"sft\.val_fraction must be in \[0, 1\)"),
             (dpo_config, "dpo.beta", 0.0, r"dpo\.beta must be > 0"),
             (dpo_config, "dpo.label_smoothing", 0.5, r"dpo\.label_smoothing must be in \[0, 0\.5\)"),
             (sft_config, "rl.grad_accum", 3, r"rl\.grad_accum \(3\) must divide")]
    for make, key, value, msg in cases:
        c = make("cpu")
        c.workdir = str(tmp_path / "w")
        sect, name = key.split(".")
        setattr(getattr(c, sect), name, value)
        with pytest.raises(ConfigError, match=msg):
            validate_config(c)
