"""LoRA in the trainer: only adapters train, the reference is the base (no copy), resume, the adapter file."""

from __future__ import annotations

import math
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxrl_mt.models.registry import load_model
from jaxrl_mt.rl.data import ConfigError, validate_config
from jaxrl_mt.rl.loop import Trainer
from jaxrl_mt.sampling import Sampler, SamplingConfig
from tests.rl.test_loop import run_killed_in_third_step, tiny_config, train_rows


def _config(model_dir: Path, wd: Path, steps: int = 3):
    c = tiny_config(model_dir, wd, steps=steps)
    c.lora.rank, c.lora.alpha = 4, 8.0
    c.data.heldout = 0
    c.export = True
    return c


def test_lora_trains_adapters_only_resumes_identically_and_exports_a_peft_adapter(tiny_chat_model_dir, tmp_path,
                                                                                   monkeypatch):
    full = Trainer(_config(tiny_chat_model_dir, tmp_path / "full"))
    base_before = jax.tree_util.tree_map(np.array, full.model.params)
    assert full.ref_params is full.model.params  # the reference is the base weights: no second copy
    full.run()
    crashed = tmp_path / "crashed"
    run_killed_in_third_step(monkeypatch, "update", lambda: Trainer(_config(tiny_chat_model_dir, crashed)))
    Trainer(_config(tiny_chat_model_dir, crashed)).run()
    a, b = train_rows(tmp_path / "full"), train_rows(crashed)
    assert sorted(a) == sorted(b) == [1, 2, 3]
    for k, v in a[3].items():
        if not k.startswith("perf/") and isinstance(v, float):
            assert math.isclose(v, b[3][k], rel_tol=1e-6, abs_tol=1e-6), k
    assert a[3]["train/kl"] > 0 and "reward/anchor" in a[3]  # the policy moved off the base; anchor logged
    # the base is untouched (only adapters are optimised)
    jax.tree_util.tree_map(np.testing.assert_array_equal, base_before,
                           jax.tree_util.tree_map(np.asarray, full.model.params))
    # the PEFT adapter, merged onto the base by the model spec, is the trained policy
    adapter = tmp_path / "full" / "adapter"
    assert (adapter / "adapter_model.safetensors").is_file()
    spec = f"{tiny_chat_model_dir}+lora:{adapter}"
    merged, exported = load_model(spec), load_model(str(tmp_path / "full" / "export"))
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), merged.params, exported.params)
    assert np.abs(np.asarray(merged.params["layers"]["q"]) - base_before["layers"]["q"]).max() > 0
    sc = SamplingConfig(max_new_tokens=8, temperature=0.0)
    prompts = [[1, 5, 9, 13], [1, 7, 7]]
    got = Sampler.from_model(merged).generate_ids(prompts, sc).tokens
    want = Sampler.from_model(exported).generate_ids(prompts, sc).tokens
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # and `workdir:` (evaluate, serve, compare) merges the checkpoint's adapters the same way
    from jaxrl_mt.rl.policy_io import load_policy

    from_ckpt = load_policy(tmp_path / "full")
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), from_ckpt.params, merged.params)


def test_bad_lora_settings_fail_at_start(tmp_path):
    for key, value, msg in [("rank", -1, r"lora\.rank must be >= 0"),
                            ("targets", "qkv", r"lora\.targets 'qkv' matches none"),
                            ("forward", "fused", r"lora\.forward must be 'unmerged' or 'merged'")]:
        c = tiny_config(tmp_path / "m", tmp_path / "w")
        c.lora.rank = 4
        setattr(c.lora, key, value)
        with pytest.raises(ConfigError, match=msg):
            validate_config(c)
