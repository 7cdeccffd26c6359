"""Clip-Cov and KL-Cov through the train step and the loop (the losses themselves: tests/rl/test_cov.py)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import init_params
from jaxrl_mt.rl.example import assemble_example
from jaxrl_mt.rl.loop import Trainer
from jaxrl_mt.rl.run_config import typed_config
from jaxrl_mt.rl.step import LossConfig, completion_logprobs, loss_config, loss_fn, micro_seed
from tests.rl.test_loop import tiny_config, train_rows

CFG = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=8, max_position_embeddings=128)


def _example():
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(1, 97, 5)), list(rng.integers(1, 97, 7))]
    completions = [list(rng.integers(1, 97, n)) for n in (9, 12, 6, 11)]
    adv = np.array([40.0, -40.0, 25.0, -25.0], np.float32)  # large |A|: some token covariances fall in (1, 5)
    return assemble_example(prompts, completions, 0, 8, 16, group=2, advantages=adv)


def test_micro_seed_is_a_function_of_seed_step_iteration_and_micro_batch() -> None:
    seeds = {int(micro_seed(s, t, i, m)) for s in (0, 1) for t in (0, 5) for i in (0, 1) for m in (0, 1)}
    assert len(seeds) == 16 and micro_seed(3, 4, 0, 1) == micro_seed(3, 4, 0, 1)
    assert micro_seed(0, 0, 0, 0).dtype == np.uint32 and micro_seed(0, 0, 0, 0).shape == ()


def test_the_step_loss_takes_the_configured_variant_and_the_example_seed() -> None:
    params = init_params(CFG, jax.random.key(0))
    ex = _example()
    clip = LossConfig(max_completion_length=16)
    base, _ = loss_fn(params, CFG, clip, ex)
    cc = dataclasses.replace(clip, loss_variant="clip_cov")
    with pytest.raises(ValueError, match="key"):
        loss_fn(params, CFG, cc, ex)  # Clip-Cov's random choice needs a seed
    a, _ = loss_fn(params, CFG, cc, ex.replace(seed=micro_seed(0, 0, 0, 0)))
    b, _ = loss_fn(params, CFG, cc, ex.replace(seed=micro_seed(0, 0, 0, 0)))
    assert float(a) == float(b) and float(a) != float(base)  # one token detached: a different loss, repeatable
    # KL-Cov acts off-policy: old log-probs that differ from the policy's add the |logp - old_logp| penalty
    old = np.asarray(completion_logprobs(params, CFG, ex)) - 0.3
    kc = dataclasses.replace(clip, loss_variant="kl_cov")
    k_on, _ = loss_fn(params, CFG, kc, ex)
    k_off, _ = loss_fn(params, CFG, kc, ex.replace(old_logp=old))
    c_off, _ = loss_fn(params, CFG, clip, ex.replace(old_logp=old))
    assert math.isclose(float(k_on), float(base), rel_tol=1e-6) and float(k_off) != float(c_off)


def test_the_config_fields_reach_the_loss_config(tmp_path: Path) -> None:
    c = tiny_config(tmp_path / "m", tmp_path / "w")
    c.rl.loss_variant, c.rl.kl_cov_ratio = "kl_cov", 0.01
    lc = loss_config(typed_config(c).rl)
    assert lc.loss_variant == "kl_cov" and lc.cov.kl_cov_ratio == 0.01 and lc.cov.clip_cov_ub == 5.0


# both slow (suite budget): the step-level tests above show the variant reaching the loss
@pytest.mark.parametrize("variant", [pytest.param("clip_cov", marks=pytest.mark.slow),
                                     pytest.param("kl_cov", marks=pytest.mark.slow)])
def test_a_cov_variant_trains_through_the_loop(variant: str, tiny_chat_model_dir: Path, tmp_path: Path) -> None:
    c = tiny_config(tiny_chat_model_dir, tmp_path / variant, steps=2)
    c.rl.loss_variant, c.rl.mu = variant, 2  # mu = 2: the second pass is off-policy (KL-Cov's penalty acts)
    c.data.heldout = 0
    Trainer(c).run()
    rows = train_rows(tmp_path / variant)
    assert sorted(rows) == [1, 2] and all(math.isfinite(r["train/loss"]) for r in rows.values())
