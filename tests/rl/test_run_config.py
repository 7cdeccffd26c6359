"""The typed training config: every shipped preset converts, and a bad field is named at start-up."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import init_params
from jaxrl_mt.rl.recipe import ConfigError, RecipeEnv
from jaxrl_mt.rl.run_config import TrainConfig, typed_config
from jaxrl_mt.runtime import load_config_file
from jaxrl_mt.sampling import Sampler, SamplingConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PRESETS = [("rlsta.py", p) for p in ("paper", "paper_described", "cpu", "experiment", "no_verifier",
                                     "no_verifier_cpu")] + \
          [("grpo.py", p) for p in ("paper", "cpu", "experiment")] + \
          [("icpo.py", p) for p in ("paper", "cpu", "experiment")] + \
          [(f, p) for f in ("sft.py", "dpo.py", "rlaar.py") for p in ("paper", "cpu")]


@pytest.mark.parametrize("name,preset", PRESETS)
def test_every_shipped_preset_is_typed_and_keeps_its_values(name: str, preset: str) -> None:
    c = load_config_file(CONFIGS / name, preset)
    t = typed_config(c)
    assert isinstance(t, TrainConfig)
    assert t.to_dict() == json.loads(c.to_json())  # config.json is written from it: the same content
    for section in ("icpo", "sft", "dpo", "rlaar"):  # a method's own section is there in its config only
        assert (getattr(t, section) is not None) == (name == f"{section}.py")
    assert isinstance(t.rl.lr, float) and isinstance(t.rl.steps, int) and t.rl.remat == c.rl.remat
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.rl.lr = 1.0  # type: ignore[misc]


def _raw() -> dict:
    return json.loads(load_config_file(CONFIGS / "rlsta.py", "cpu").to_json())


def test_a_missing_unknown_or_mistyped_field_is_named() -> None:
    raw = _raw()
    del raw["rl"]["lr"]
    with pytest.raises(ConfigError, match=r"^config has no field rl\.lr$"):
        typed_config(raw)
    raw = _raw()
    raw["rl"]["lrr"] = 1e-6
    with pytest.raises(ConfigError, match=r"^unknown config field\(s\) rl\.lrr$"):
        typed_config(raw)
    raw = _raw()
    raw["rl"]["steps"] = "3"
    with pytest.raises(ConfigError, match=r"^config field rl\.steps must be int, got '3' \(str\)$"):
        typed_config(raw)
    raw = _raw()
    raw["rl"]["batch_size"] = True  # a bool is not a count
    with pytest.raises(ConfigError, match=r"rl\.batch_size must be int, got True"):
        typed_config(raw)
    raw = _raw()
    raw["rl"]["remat"] = 3
    with pytest.raises(ConfigError, match=r"rl\.remat must be bool or str, got 3"):
        typed_config(raw)
    raw = _raw()
    raw["data"] = "x"
    with pytest.raises(ConfigError, match=r"config field data must be a section"):
        typed_config(raw)


def test_an_int_where_a_float_is_declared_becomes_a_float() -> None:
    raw = _raw()
    raw["rl"]["lr"] = 1
    t = typed_config(raw)
    assert t.rl.lr == 1.0 and type(t.rl.lr) is float
    assert typed_config(t) is t


def test_a_recipe_samples_on_other_params_without_changing_the_shared_sampler() -> None:
    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=16, max_position_embeddings=128)
    p0, p1 = init_params(cfg, jax.random.key(0)), init_params(cfg, jax.random.key(1))
    s = Sampler(p0, cfg, eos_ids=(), pad_id=0, max_batch=2)
    env = RecipeEnv(config=None, workdir=Path("."), is_main=True, multi=False, system=None, sampler=s,
                    mesh=None, log=print)
    view = env.policy_sampler(p1)
    assert view.params is p1 and s.params is p0 and env.sampler is s
    assert view.engine is s.engine and view.compiled_shapes is s.compiled_shapes
    sc = SamplingConfig(max_new_tokens=4, temperature=0.0)
    a = view.generate_ids([[1, 2, 3]], sc).tokens
    b = s.generate_ids([[1, 2, 3]], sc, params=p1).tokens
    c = s.generate_ids([[1, 2, 3]], sc).tokens
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # the view decodes with p1
    assert s.params is p0 and not np.array_equal(np.asarray(a), np.asarray(c))
