"""The typed training config: every shipped preset converts, and a bad field is named at start-up."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import init_params
from jaxrl_mt.rl.recipe import ConfigError, RecipeEnv
from jaxrl_mt.rl.data import validate_config
from jaxrl_mt.rl.optim import optimizer_from_config
from jaxrl_mt.rl.run_config import (RECORDED, ROLLOUT_GROUPS, ROLLOUT_KEYS, OptimSection, RewardSection, RolloutSection,
                                    TrainConfig, typed_config)
from jaxrl_mt.rl.step import LossConfig, loss_config
from jaxrl_mt.runtime import load_config_file
from jaxrl_mt.sampling import Sampler, SamplingConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PRESETS = [("rlsta.py", p) for p in ("paper", "paper_described", "cpu", "experiment", "no_verifier",
                                     "no_verifier_cpu")] + \
          [("grpo.py", p) for p in ("paper", "cpu", "experiment")] + \
          [("icpo.py", p) for p in ("paper", "cpu", "experiment")] + \
          [(f, p) for f in ("sft.py", "dpo.py", "rlaar.py") for p in ("paper", "cpu", "experiment2")] + \
          [(f, "experiment2") for f in ("rlsta.py", "icpo.py")] + \
          [("rlsta_conv.py", p) for p in ("cpu", "paper_shapes")]
ROOT = CONFIGS.parent
COMMITTED = sorted(p for p in ROOT.glob("docs/results/**/config.json") if p.name == "config.json")


@pytest.mark.parametrize("name,preset", PRESETS)
def test_every_shipped_preset_is_typed_and_keeps_its_values(name: str, preset: str) -> None:
    c = load_config_file(CONFIGS / name, preset)
    t = typed_config(c)
    assert isinstance(t, TrainConfig)
    assert t.to_dict() == json.loads(c.to_json())  # config.json is written from it: the same content
    for section in ("icpo", "sft", "dpo", "rlaar", "rlsta_conv"):  # a method's own section: in its config only
        assert (getattr(t, section) is not None) == (name == f"{section}.py")
    assert isinstance(t.rl.optim.lr, float) and isinstance(t.rl.steps, int) and t.rl.remat == c.rl.remat
    assert t.rl.optim.lr == c.rl.lr and t.rl.max_new_tokens == c.rl.max_new_tokens
    rollouts = name not in ("sft.py", "dpo.py")  # SFT and DPO: no group size, rollout sampling, GRPO loss, reward
    assert all((getattr(t.rl, g) is not None) == rollouts for g in ROLLOUT_GROUPS)
    assert all((k in c.rl) == rollouts for k in ROLLOUT_KEYS)
    if rollouts:
        assert (t.rl.rollout.group_size, t.rl.loss.beta, t.rl.reward.alpha) == (c.rl.group_size, c.rl.beta,
                                                                                c.rl.alpha)
    assert t.rl.rows == c.rl.batch_size * (c.rl.group_size if rollouts else 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.rl.optim.lr = 1.0  # type: ignore[misc]


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
    assert t.rl.optim.lr == 1.0 and type(t.rl.optim.lr) is float
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


def test_a_section_key_is_named_as_in_the_file() -> None:
    raw = _raw()
    del raw["rl"]["group_size"]  # the other rollout keys are there: the rollout section needs it
    with pytest.raises(ConfigError, match=r"^config has no field rl\.group_size$"):
        typed_config(raw)
    raw = _raw()
    raw["rl"]["beta"] = "big"
    with pytest.raises(ConfigError, match=r"^config field rl\.beta must be float, got 'big' \(str\)$"):
        typed_config(raw)
    raw = _raw()
    raw["rl"]["optim"] = {"lr": 1.0}  # the typed layout is not the file's
    with pytest.raises(ConfigError, match=r"^unknown config field\(s\) rl\.optim$"):
        typed_config(raw)


def _checked(name: str, preset: str, tmp_path: Path, **rl: object) -> TrainConfig:
    c = load_config_file(CONFIGS / name, preset)
    c.workdir = str(tmp_path / "w")
    with c.rl.unlocked():
        for k, v in rl.items():
            c.rl[k] = v
    return validate_config(c)


def test_sft_and_dpo_have_no_rollout_keys_and_refuse_them(tmp_path: Path) -> None:
    for name in ("sft.py", "dpo.py"):
        t = _checked(name, "cpu", tmp_path)
        assert t.rl.rollout is None and t.rl.loss is None and t.rl.reward is None
        assert t.rl.remat == "auto" and loss_config(t.rl) == LossConfig()  # the forward's settings only
        with pytest.raises(ConfigError, match=r"^method '(sft|dpo)' trains on fixed targets: rl\.group_size, "
                                              r"rl\.temperature, rl\.top_p are settings of the rollout methods"):
            _checked(name, "cpu", tmp_path, group_size=8, temperature=1.0, top_p=1.0)
    # a group size of 1 or a zero temperature is no concern of SFT's (before the split: refused)
    assert _checked("sft.py", "cpu", tmp_path).rl.rows == 2


def test_a_rollout_method_needs_its_sections(tmp_path: Path) -> None:
    c = load_config_file(CONFIGS / "grpo.py", "cpu")
    c.workdir = str(tmp_path / "w")
    with c.rl.unlocked():
        for k in ROLLOUT_KEYS:
            if k not in ("mu", "beta", "kl_estimator", "epsilon_low", "epsilon_high", "loss_type", "scale_rewards",
                         "loss_variant", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef"):
                del c.rl[k]
    with pytest.raises(ConfigError, match=r"^method 'grpo' samples rollouts: its config needs rl\.group_size, "
                                          r"rl\.temperature, rl\.top_p, rl\.alpha, rl\.anchor_prompt, "
                                          r"rl\.zero_anchor_for_wrong \(configs/rlsta\.py\)$"):
        validate_config(c)


@pytest.mark.parametrize("section, field, value, message", [
    (RolloutSection(group_size=4, temperature=1.0, top_p=1.0), "group_size", 1, "rl.group_size (G) must be >= 2"),
    (RolloutSection(group_size=4, temperature=1.0, top_p=1.0), "temperature", 0.0, "rl.temperature must be > 0"),
    (OptimSection(lr=1e-6, schedule="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0), "lr", 0.0,
     "rl.lr must be > 0"),
    (RewardSection(alpha=1.0, anchor_prompt="full", zero_anchor_for_wrong=False), "anchor_prompt", "x",
     "rl.anchor_prompt must be full|merged"),
])
def test_each_section_checks_itself(section, field: str, value, message: str) -> None:
    section.check()
    with pytest.raises(ConfigError, match=re.escape(message)):
        dataclasses.replace(section, **{field: value}).check()


def test_grad_accum_divides_the_rows_of_the_method(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"rl\.grad_accum \(4\) must divide rl\.batch_size \(2\)"):
        _checked("sft.py", "cpu", tmp_path, grad_accum=4)
    with pytest.raises(ConfigError, match=r"rl\.grad_accum \(3\) must divide batch_size \* group_size \(8\)"):
        _checked("rlsta.py", "cpu", tmp_path, grad_accum=3)
    assert _checked("rlsta.py", "cpu", tmp_path, grad_accum=4).rl.rows == 8


def test_a_method_section_belongs_to_its_method(tmp_path: Path) -> None:
    c = load_config_file(CONFIGS / "rlsta.py", "cpu")
    c.workdir = str(tmp_path / "w")
    c.sft = {"val_fraction": 0.1}
    with pytest.raises(ConfigError, match=r"^config section 'sft' is method 'sft''s; method 'rlsta' has none$"):
        validate_config(c)


def test_every_committed_run_config_loads() -> None:
    assert len(COMMITTED) >= 28  # docs/results: exp2's runs (twice), lora_cpu, rlsta_cpu's runs
    added = {"allow_config_changes", "attention"}  # fields added after the oldest runs: their defaults
    for path in COMMITTED:
        raw = json.loads(path.read_text())
        raw.pop(RECORDED, None)  # the trainer's record beside the config (attention in effect), not a field
        t = typed_config(raw)
        out = t.to_dict()
        assert {k for k in set(raw) | set(out) if raw.get(k) != out.get(k)} <= added | {"rl", "sft", "eval"}, path
        assert out["eval"] == {**raw["eval"], "select": raw["eval"].get("select", "")}, path  # added later
        if "sft" in raw:  # sft.targets was added later: older runs read as the multi-turn ("history") targets
            assert out["sft"] == {**raw["sft"], "targets": raw["sft"].get("targets", "history")}, path
        old_rl = {k: v for k, v in raw["rl"].items()}
        new_rl = out["rl"]
        assert {k: new_rl[k] for k in old_rl} == old_rl, path  # every stored rl key where it was
        assert set(new_rl) - set(old_rl) <= {"loss_variant", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub",
                                              "kl_cov_ratio", "ppo_kl_coef", "verifier_weight"}, path
        assert t.rl.optim.lr == raw["rl"]["lr"] and t.rl.steps == raw["rl"]["steps"], path
        optimizer_from_config(t.rl)  # what load_policy restores a checkpoint's optimizer state with
        if raw["method"] in ("sft", "dpo") and "group_size" in raw["rl"]:  # written before the split: the
            assert t.rl.rollout is not None and t.rl.rollout.group_size == raw["rl"]["group_size"]  # keys, unread
        elif raw["method"] in ("sft", "dpo"):  # written after it: no rollout section at all
            assert t.rl.rollout is None, path
