"""Issue 32, failures 2, 6, 7 and 8 (run part): a run's workdir under bad values, changed configs and reruns."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

from configs.rlsta import get_config
from jaxrl_mt.checkpointing import Checkpointer
from jaxrl_mt.rl.data import validate_config
from jaxrl_mt.rl.recipe import ConfigError
from jaxrl_mt.rl.metrics_log import MetricsLog, read_metrics
from jaxrl_mt.rl.run_config import typed_config
from jaxrl_mt.rl.workdir import (NonFiniteUpdate, check_finite_state, check_resume_config, last_good,
                                 refused_changes)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("field, value, message", [
    ("rl.lr", float("inf"), "rl.lr must be a finite number, got inf"),  # before: passed, checkpoint 1 all inf
    ("rl.beta", float("nan"), "rl.beta must be a finite number, got nan"),
    ("rl.epsilon_high", float("-inf"), "rl.epsilon_high must be a finite number, got -inf"),
    ("checkpoint.every", 0, "checkpoint.every must be >= 1, got 0"),  # before: ZeroDivisionError after step 1
    ("log.every", 0, "log.every must be >= 1, got 0"),  # before: ZeroDivisionError after step 1
    ("checkpoint.keep", 0, "checkpoint.keep must be >= 1, got 0"),  # before: a traceback from the Checkpointer
])
def test_values_that_cannot_work_are_refused_at_start(tmp_path: Path, field: str, value, message: str) -> None:
    c = get_config("cpu")
    c.workdir = str(tmp_path / "w")
    sect, name = field.split(".")
    setattr(getattr(c, sect), name, value)
    with pytest.raises(ConfigError) as info:
        validate_config(c)
    assert str(info.value) == message


def test_cli_lr_inf_is_one_line_and_leaves_no_checkpoint(tmp_path: Path) -> None:
    wd = tmp_path / "w"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    env.pop("JAXRL_MT_TRACEBACK", None)
    r = subprocess.run([sys.executable, "-m", "jaxrl_mt.train", "--config", "configs/rlsta.py:cpu",
                        f"--config.workdir={wd}", "--config.rl.lr=inf"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == ["error: rl.lr must be a finite number, got inf"]
    assert not (wd / "checkpoints").exists() and not (wd / "config.json").exists()


def test_refused_changes_name_data_fields_and_optimizer_structure_only() -> None:
    old = typed_config(get_config("cpu")).to_dict()
    new = json.loads(json.dumps(old))
    new["data"]["add_source"] = "synthetic:16:1"
    new["rl"]["grad_accum"] = 2  # optax.MultiSteps wraps the state: another structure
    new["rl"]["max_grad_norm"] = 0.0  # no clip_by_global_norm in the chain: another structure
    new["rl"]["steps"], new["rl"]["lr"], new["rl"]["beta"] = 60, 1e-5, 0.5  # a longer run, other values: fine
    new["seed"] = 3
    assert refused_changes(old, new) == ["data.add_source", "rl.grad_accum", "rl.max_grad_norm", "seed"]
    assert refused_changes(old, json.loads(json.dumps(old))) == []


def _resumable(tmp_path: Path):
    """A workdir as a first run leaves it: config.json (check_resume_config's) and a metrics row."""
    c = get_config("cpu")
    c.workdir = str(tmp_path / "w")
    os.makedirs(c.workdir)
    assert check_resume_config(typed_config(c)) is None  # a fresh workdir: nothing to compare, config.json written
    log = MetricsLog(c.workdir)
    log.tb = None
    log.scalars(0, {"eval/acc": 0.25})
    return c


def test_changed_data_source_is_refused_and_config_json_kept(tmp_path: Path) -> None:
    c = _resumable(tmp_path)
    path = Path(c.workdir) / "config.json"
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    c.data.add_source = "synthetic:16:1"
    c.rl.grad_accum = 2
    with pytest.raises(ConfigError) as info:
        check_resume_config(typed_config(c))
    assert str(info.value) == (
        f"{path}: resuming with changed field(s) that change the data or the optimizer state: data.add_source: "
        "'synthetic:16:0,rlsta_add:@' -> 'synthetic:16:1'; rl.grad_accum: 1 -> 2; use another workdir, or set "
        "allow_config_changes='data.add_source,rl.grad_accum' to resume anyway")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before  # before the fix: overwritten
    c.allow_config_changes = "data.add_source"
    with pytest.raises(ConfigError, match=r"rl\.grad_accum: 1 -> 2; .*allow_config_changes='rl.grad_accum'"):
        check_resume_config(typed_config(c))
    c.allow_config_changes = "data.add_source,rl.grad_accum"
    lines: list[str] = []
    # allowed: the stored optimizer restores the checkpoint
    stored = check_resume_config(typed_config(c), log=lines.append)
    assert stored is not None and stored.rl.grad_accum == 1 and stored.data.add_source == "synthetic:16:0,rlsta_add:@"
    assert lines == ["allow_config_changes: resuming with changed data.add_source, rl.grad_accum (cached items "
                     "are reused; an optimizer of another structure starts from a fresh state)"]
    assert json.loads(path.read_text())["rl"]["grad_accum"] == 2  # written after the check


def test_finite_state_check_and_the_last_good_step(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path / "ck")
    assert last_good(ck) == f"no checkpoint was written to {ck.directory} (a rerun starts from scratch)"
    good = {"params": {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}, "opt_state": (jnp.asarray(1, jnp.int32),)}
    check_finite_state(1, good)
    ck.save(1, good, {"step": 1})
    ck.wait()
    bad = {"params": {"w": jnp.ones((3, 2)).at[1, 1].set(jnp.inf), "b": jnp.full(2, jnp.nan)}, "opt_state": ()}
    with pytest.raises(NonFiniteUpdate) as info:
        check_finite_state(2, bad)
    assert str(info.value) == ("the update left non-finite values in 2 of 2 arrays (params/b, params/w); "
                               "step 2 was not saved")
    assert last_good(ck) == f"last good checkpoint: step 1 in {ck.directory}"
    ck.close()


def test_a_rerun_leaves_one_row_per_step_and_kind(tmp_path: Path) -> None:
    """The log of a finished run rerun twice, once killed during its export: no row is duplicated."""
    def run(last_eval: float) -> None:
        log = MetricsLog(tmp_path)
        log.tb = None
        log.truncate_after(2)  # the resumed run starts at the final checkpoint
        log.scalars(2, {"eval/acc": last_eval})  # "eval after" again (the loop does not run)
    first = MetricsLog(tmp_path)
    first.tb = None
    first.scalars(0, {"eval/acc": 0.25})
    for step in (1, 2):
        first.scalars(step, {"reward/total": step / 10, "train/loss": 0.5})
    first.scalars(2, {"probe/multi_turn_strict": 0.5})
    first.scalars(2, {"eval/acc": 0.5})
    run(0.5)
    run(0.75)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["kind"]) for r in rows] == [(0, "eval"), (1, "train"), (2, "train"), (2, "probe"),
                                                     (2, "eval")]
    assert rows[-1]["eval/acc"] == 0.75  # the newest row of a key replaces the older one
    # a log written before rows had kinds, with the duplicate a rerun left: cleaned on resume
    old = [{"step": 0, "eval/acc": 0.25}, {"step": 1, "reward/total": 0.1}, {"step": 1, "eval/acc": 0.5},
           {"step": 1, "eval/acc": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    log = MetricsLog(tmp_path)
    log.tb = None
    log.truncate_after(1)
    assert read_metrics(tmp_path / "metrics.jsonl") == old[:3]
    assert not (tmp_path / "metrics.jsonl.tmp").exists()


@pytest.mark.slow
def test_trainer_never_saves_a_non_finite_update_and_refuses_a_changed_resume(tiny_chat_model_dir: Path,
                                                                               tmp_path: Path) -> None:
    """Through the Trainer: lr = 1e39 (finite in Python, inf in float32) passes start-up, gives a finite loss and
    gradient, and an update that makes every parameter non-finite; then resumes under changed configs."""
    from jaxrl_mt.rl.loop import Trainer, TrainingError
    from tests.rl.test_loop import tiny_config

    wd = tmp_path / "w"
    c = tiny_config(tiny_chat_model_dir, wd, steps=1)
    Trainer(c).run()  # a good step 1
    c = tiny_config(tiny_chat_model_dir, wd, steps=3)
    c.rl.lr = 1e39  # an optimizer input that keeps the structure: allowed on resume
    with pytest.raises(TrainingError) as info:
        Trainer(c).run()
    assert str(info.value) == (f"step 2: the update left non-finite values in 11 of 33 arrays (params/embed, "
                               f"params/final_norm, params/layers/attn_norm, ...); step 2 was not saved. Stopped; last "
                               f"good checkpoint: step 1 in {wd / 'checkpoints'}")
    assert Checkpointer(wd / "checkpoints", read_only=True).all_steps() == [1]
    fresh = tiny_config(tiny_chat_model_dir, tmp_path / "f", steps=4)
    fresh.rl.lr, fresh.checkpoint.every = 1e39, 3  # no checkpoint yet: none is named (before: "step 0")
    with pytest.raises(TrainingError, match=r"^step 2: non-finite loss .* Stopped; no checkpoint was written to "):
        Trainer(fresh).run()

    c = tiny_config(tiny_chat_model_dir, wd, steps=2)
    c.data.add_source = "synthetic:16:1"
    config_json = (wd / "config.json").read_bytes()
    with pytest.raises(ConfigError, match=r"data\.add_source: 'synthetic:16:0,rlsta_add:@' -> 'synthetic:16:1'"):
        Trainer(c)
    assert (wd / "config.json").read_bytes() == config_json
    c = tiny_config(tiny_chat_model_dir, wd, steps=2)
    c.rl.grad_accum, c.allow_config_changes = 2, "rl.grad_accum"  # before: a 31-line traceback
    logs: list[str] = []
    Trainer(c, log=logs.append).run()  # restored with the stored optimizer; a fresh MultiSteps state
    assert f"resumed from {wd / 'checkpoints'} at step 1" in logs
    Trainer(c).run()  # a rerun of the finished workdir
    rows = read_metrics(wd / "metrics.jsonl")
    keys = [(r["step"], r["kind"]) for r in rows]
    assert sorted(keys) == [(0, "eval"), (1, "eval"), (1, "train"), (2, "eval"), (2, "train")]


def test_config_json_records_the_attention_in_force_and_reads_back(tmp_path: Path, monkeypatch) -> None:
    """JAXRL_MT_ATTENTION overrides the configured attention: the run's config.json says so (issue 52),
    and the file still reads back as the config (the record is not a field)."""
    c = get_config("cpu")
    c.workdir = str(tmp_path / "wd")
    Path(c.workdir).mkdir()
    monkeypatch.setenv("JAXRL_MT_ATTENTION", "einsum")
    typed = typed_config(c)
    check_resume_config(typed)
    stored = json.loads((Path(c.workdir) / "config.json").read_text())
    assert stored["recorded"] == {"attention": typed.attention, "attention_effective": "einsum",
                                  "attention_env": "einsum"}
    assert typed_config(stored) == typed
    monkeypatch.delenv("JAXRL_MT_ATTENTION")
    check_resume_config(typed)
    stored = json.loads((Path(c.workdir) / "config.json").read_text())
    assert stored["recorded"]["attention_env"] is None and stored["recorded"]["attention_effective"] == typed.attention
