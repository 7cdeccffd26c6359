"""The RLSTA training loop on a tiny model: resume determinism, start-up errors, outputs."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from configs.rlsta import get_config
from jaxrl_mt.rl import loop as loop_mod
from jaxrl_mt.rl.loop import ConfigError, Trainer, validate_config

ROOT = Path(__file__).resolve().parents[2]


def tiny_config(model_dir: Path, workdir: Path, steps: int = 5):
    c = get_config("cpu")
    c.model = str(model_dir)
    c.workdir = str(workdir)
    c.data.limit = 4
    c.data.heldout = 1
    c.data.max_turns = 4
    c.history.max_new_tokens = 6
    c.rl.steps = steps
    c.rl.batch_size = 2
    c.rl.group_size = 2
    c.rl.max_new_tokens = 8
    c.rl.beta = 0.04
    c.rl.lr = 1e-3
    c.rl.remat = False
    c.eval.max_new_tokens = 6
    c.checkpoint.every = 1
    c.log.samples_every = 2
    c.export = False
    return c


def train_rows(workdir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r for r in rows if "reward/total" in r}


def run_killed_in_third_step(monkeypatch, method: str, make_trainer) -> None:
    """Runs ``make_trainer().run()`` with ``Trainer.<method>`` (the update) dying on its third call
    (in step 3, after checkpoint 2), then restores the method."""
    original, calls = getattr(Trainer, method), {"n": 0}

    def crash_on_third(self, *a):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated kill")
        return original(self, *a)

    monkeypatch.setattr(Trainer, method, crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        make_trainer().run()
    monkeypatch.setattr(Trainer, method, original)


def test_killed_run_resumes_identically(tiny_chat_model_dir: Path, tmp_path: Path, monkeypatch) -> None:
    full = tmp_path / "full"  # 3 steps (suite budget): the kill comes in step 3, after checkpoint 2
    Trainer(tiny_config(tiny_chat_model_dir, full, steps=3)).run()

    crashed = tmp_path / "crashed"
    original = Trainer.update
    calls = {"n": 0}

    def crash_on_third(self, state, ex):
        calls["n"] += 1
        if calls["n"] == 3:  # dies in the middle of step 3, after checkpoint 2
            raise KeyboardInterrupt("simulated kill")
        return original(self, state, ex)

    monkeypatch.setattr(Trainer, "update", crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        Trainer(tiny_config(tiny_chat_model_dir, crashed, steps=3)).run()
    monkeypatch.setattr(Trainer, "update", original)
    assert sorted(train_rows(crashed)) == [1, 2]
    Trainer(tiny_config(tiny_chat_model_dir, crashed, steps=3)).run()  # resumes at step 2

    a, b = train_rows(full), train_rows(crashed)
    assert sorted(a) == sorted(b) == [1, 2, 3]
    compared = 0
    for step in (3,):
        for k, v in a[step].items():
            if k.startswith("perf/") or not isinstance(v, float):
                continue
            assert math.isclose(v, b[step][k], rel_tol=1e-6, abs_tol=1e-6), (step, k, v, b[step][k])
            compared += 1
    assert compared >= 20  # a step's logged values (24 today)
    assert a[3]["train/kl"] > 0  # the policy moved away from the reference
    for r in a.values():  # 2 groups a step; a group the total reward ranks is one the verifier or the anchor ranks
        assert r["reward/frac_zero_std"] in (0.0, 0.5, 1.0) and r["reward/verifier_frac_zero_std"] in (0.0, 0.5, 1.0)
        assert r["reward/verifier_frac_zero_std"] >= r["reward/frac_zero_std"]
    for f in ("summary.txt", "curves.png", "samples.md", "config.json"):
        assert (full / f).exists(), f


def test_bad_config_values_fail_at_start(tmp_path: Path) -> None:
    base = get_config("cpu")
    base.workdir = str(tmp_path / "w")
    cases = [("rl.alpha", -0.5, "rl.alpha must be >= 0"), ("rl.group_size", 1, "G) must be >= 2"),
             ("rl.kl_estimator", "k2", "rl.kl_estimator"), ("rl.loss_type", "nope", "rl.loss_type"),
             ("rl.remat", "sometimes", "rl.remat must be one of (False, True, 'dots', 'auto'), got 'sometimes'")]
    for key, value, msg in cases:
        c = get_config("cpu")
        c.workdir = str(tmp_path / "w")
        sect, name = key.split(".")
        setattr(getattr(c, sect), name, value)
        with pytest.raises(ConfigError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            validate_config(c)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    c = get_config("cpu")
    c.workdir = str(blocker / "sub")
    with pytest.raises(ConfigError, match="not writable"):
        validate_config(c)


def test_empty_dataset_fails_at_start(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    c = get_config("cpu")
    c.workdir = str(tmp_path / "w")
    c.data.add_source = f"rlsta_add:{empty}"
    c.data.refine_source = ""
    with pytest.raises(ConfigError, match="empty dataset"):
        loop_mod.load_scenarios(c)


def _train_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jaxrl_mt.train", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_cli_rejects_unknown_key_and_bad_alpha(tmp_path: Path) -> None:
    r = _train_cli("--config", "configs/rlsta.py:cpu", "--config.rl.alhpa=1.0")
    assert r.returncode != 0 and "alhpa" in r.stderr
    r = _train_cli("--config", "configs/rlsta.py:cpu", f"--config.workdir={tmp_path / 'w'}", "--config.rl.alpha=-1")
    assert r.returncode == 2 and "rl.alpha must be >= 0" in r.stderr
    r = _train_cli("--config", "configs/rlsta.py:cpu", f"--config.workdir={tmp_path / 'w'}", "--config.rl.remat=maybe")
    assert r.returncode == 2 and "rl.remat must be one of" in r.stderr, r.stderr  # a string reaches the check


def _ref_model(tmp_path: Path, like: Path, **changes) -> Path:
    """A random-weight model folder shaped like `like`'s config with `changes` (no tokenizer)."""
    import dataclasses

    import jax

    from jaxrl_mt.models.decoder import init_params
    from jaxrl_mt.models.hf_io import export_hf_folder
    from jaxrl_mt.models.registry import load_model

    cfg = dataclasses.replace(load_model(str(like), with_tokenizer=False).cfg, **changes)
    return export_hf_folder(cfg, init_params(cfg, jax.random.PRNGKey(1), scale=0.5), tmp_path / "ref")


def test_reference_is_a_copy_or_its_own_model_under_its_own_config(tiny_chat_model_dir: Path, tmp_path: Path):
    import numpy as np

    t = Trainer(tiny_config(tiny_chat_model_dir, tmp_path / "a"))
    # the train step donates the policy's buffers: the reference must be a separate copy
    assert t.ref_cfg is t.model.cfg and t.ref_params["embed"] is not t.model.params["embed"]
    np.testing.assert_array_equal(np.asarray(t.ref_params["embed"]), np.asarray(t.model.params["embed"]))
    deeper = _ref_model(tmp_path, tiny_chat_model_dir, num_layers=3)
    c = tiny_config(tiny_chat_model_dir, tmp_path / "b")
    c.ref_model = str(deeper)
    t = Trainer(c)
    assert t.ref_cfg.num_layers == 3 != t.model.cfg.num_layers and t.ref_scorer.cfg is t.ref_cfg
    assert t.ref_params["layers"]["q"].shape[0] == 3


def test_reference_with_another_vocabulary_is_refused(tiny_chat_model_dir: Path, tmp_path: Path) -> None:
    c = tiny_config(tiny_chat_model_dir, tmp_path / "w")
    c.ref_model = str(_ref_model(tmp_path, tiny_chat_model_dir, vocab_size=64, bos_token_id=1, eos_token_id=(2,),
                                 pad_token_id=2))
    with pytest.raises(ConfigError, match="vocabulary of 64 tokens.*must score the policy's token ids"):
        Trainer(c)


@pytest.mark.slow
def test_dapo_steps_carry_the_whole_batch_token_count(tiny_chat_model_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """loss_type="dapo" with two micro-batches: every row carries the step's tokens / 2, and the run trains."""
    c = tiny_config(tiny_chat_model_dir, tmp_path / "dapo", steps=1)
    c.rl.loss_type, c.rl.grad_accum = "dapo", 2
    seen = []
    original = Trainer.update

    def spy(self, state, ex):
        seen.append((np.array(ex.num_items), ex.completion_mask.sum()))
        return original(self, state, ex)

    monkeypatch.setattr(Trainer, "update", spy)
    Trainer(c).run()
    (num_items, tokens), = seen
    assert tokens > 0 and num_items.shape == (4,)
    np.testing.assert_array_equal(num_items, np.full(4, tokens / 2, np.float32))
    assert math.isfinite(train_rows(tmp_path / "dapo")[1]["train/loss"])


def test_remat_auto_is_chosen_per_prompt_bucket_from_the_step_layout(tiny_chat_model_dir: Path, tmp_path: Path):
    """rl.remat = "auto": the step's remat is choose_remat's for the layout the step will run: whole
    groups (prompt once, G completions) or, when micro-batches split groups, every row its own prompt."""
    from jaxrl_mt.rl.step import choose_remat

    logs: list[str] = []
    c = tiny_config(tiny_chat_model_dir, tmp_path / "a")
    c.rl.remat = "auto"
    c.rl.batch_size, c.rl.group_size = 4, 2
    t = Trainer(c, log=logs.append)
    assert t._grouped()
    want = choose_remat(t.model.cfg, 4, 2, 256, 16)  # 4 prompts x G 2, prompt bucket 256, completions 8 -> 16
    assert t._remat(256, t.objective.footprint(256)) == want
    assert logs[-1] == f"rl.remat auto: prompt bucket 256, 4 prompts x 2 rows each -> {want!r}"
    c.rl.grad_accum = 8  # one row per micro-batch: groups split, the flat layout
    t = Trainer(c, log=logs.append)
    assert not t._grouped() and t._remat(64, t.objective.footprint(64)) == choose_remat(t.model.cfg, 1, 1, 64, 16)
    c.rl.remat = True
    t = Trainer(c)
    assert t._remat(64, t.objective.footprint(64)) is True  # an explicit choice is kept
    # the chosen step trains: the loss and the update are those of the explicit setting
    c = tiny_config(tiny_chat_model_dir, tmp_path / "b", steps=1)
    c.rl.remat = "auto"
    Trainer(c).run()
    c = tiny_config(tiny_chat_model_dir, tmp_path / "c", steps=1)
    c.rl.remat = choose_remat(t.model.cfg, 2, 2, 256, 16)
    Trainer(c).run()
    a, b = train_rows(tmp_path / "b")[1], train_rows(tmp_path / "c")[1]
    assert a["train/loss"] == pytest.approx(b["train/loss"], abs=1e-6) and a["reward/total"] == b["reward/total"]
