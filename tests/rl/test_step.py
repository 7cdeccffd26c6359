"""The train step's loss: the "dapo" normaliser reaches the loss from the batch (tiny chat model)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_mt.rl.step import LossConfig, assemble_rollouts, dapo_num_items, loss_fn


def test_dapo_num_items_by_hand():
    mask = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]], bool)  # 6 tokens in 4 rows
    np.testing.assert_array_equal(dapo_num_items(mask, 1), [6.0] * 4)
    np.testing.assert_array_equal(dapo_num_items(mask, 2), [3.0] * 4)  # two micro-batches share the step's count
    np.testing.assert_array_equal(dapo_num_items(mask, 2, tokens=20), [10.0] * 4)  # every process's tokens
    np.testing.assert_array_equal(dapo_num_items(np.zeros((2, 3), bool), 1), [1.0, 1.0])  # never divides by 0


def test_loss_fn_divides_by_the_batch_num_items(tiny_chat_model_dir):
    from jaxrl_mt.models.registry import load_model

    m = load_model(str(tiny_chat_model_dir))
    batch = assemble_rollouts([[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14]], m.pad_id, 4, 4)
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    batch["advantages"] = jnp.array([1.0, -0.5])
    lc = LossConfig(loss_type="dapo")
    alone, _ = loss_fn(m.params, m.cfg, lc, 4, batch)  # no num_items: the batch's 5 tokens
    bnpo, _ = loss_fn(m.params, m.cfg, LossConfig(loss_type="bnpo"), 4, batch)
    assert float(alone) == pytest.approx(float(bnpo), rel=1e-6)
    assert float(alone) == pytest.approx(-(1.0 * 2 - 0.5 * 3) / 5, rel=1e-5)  # on policy: -sum(A * len) / tokens
    scaled, _ = loss_fn(m.params, m.cfg, lc, 4, dict(batch, num_items=jnp.full(2, 20.0)))
    assert float(scaled) == pytest.approx(float(alone) * 5 / 20, rel=1e-5)
