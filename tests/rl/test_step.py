"""The train step: its two rollout layouts give one loss and one update; reference log-probs reuse the anchor pass;
the "dapo" normaliser reaches the loss from the batch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_mt.models.decoder import init_params
from jaxrl_mt.rl.optim import make_optimizer
from jaxrl_mt.rl.step import (LossConfig, activation_bytes_grouped, assemble_grouped, assemble_rollouts,
                              choose_remat, completion_logprobs, dapo_num_items, loss_fn, make_train_step,
                              reference_logprobs)
from jaxrl_mt.scoring import Scorer
from tests.models.test_decoder import LLAMA

PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13]]
COMPS = [[30, 31, 32], [33, 34, 2], [34, 35, 36, 37, 38], [40]]
G, P, C = 2, 8, 8


def _batches(params):
    rows = [p for p in PROMPTS for _ in range(G)]
    full = assemble_rollouts(rows, COMPS, 0, P, C)
    grouped = assemble_grouped(PROMPTS, COMPS, 0, P, C)
    ref = np.asarray(completion_logprobs(params, LLAMA, full["tokens"], full["token_mask"], prompt_len=P))
    adv = np.array([1.0, -1.0, 0.5, -0.5], np.float32)
    for b in (full, grouped):
        b["advantages"], b["ref_logp"] = adv, ref - 0.01  # a policy that moved: a non-zero KL term
    return full, grouped


def test_grouped_layout_gives_the_full_rows_loss_and_update():
    params = init_params(LLAMA, jax.random.PRNGKey(1), scale=0.2)
    full, grouped = _batches(params)
    opt = make_optimizer(1e-5, max_grad_norm=1.0)  # Adam turns ~1e-7 gradient noise into ~1% of lr
    lc = LossConfig(beta=0.04, loss_type="grpo", max_completion_length=C)
    step = make_train_step(LLAMA, opt, lc, P)
    p_full, _, m_full = step(params, opt.init(params), full)
    p_grp, _, m_grp = step(params, opt.init(params), grouped)
    for k in ("loss", "kl", "entropy", "grad_norm"):
        np.testing.assert_allclose(float(m_grp[k]), float(m_full[k]), rtol=1e-5, atol=1e-6, err_msg=k)
    assert float(m_full["kl"]) > 0
    for a, b in zip(jax.tree_util.tree_leaves(p_grp), jax.tree_util.tree_leaves(p_full)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_reference_logprobs_reuse_the_anchor_pass_and_equal_a_fresh_pass():
    params = init_params(LLAMA, jax.random.PRNGKey(2), scale=0.2)
    rows = [p for p in PROMPTS for _ in range(G)]
    full, grouped = _batches(params)
    fresh = np.asarray(completion_logprobs(params, LLAMA, full["tokens"], full["token_mask"], prompt_len=P))
    scorer = Scorer(params, LLAMA, pad_id=0, batch_size=4)
    assert scorer.cached_logprobs(rows, COMPS) is None  # nothing scored yet
    order = [0, 2, 1, 3]  # contexts A B A B: not in runs, scored as full rows
    plain = scorer.score([rows[i] for i in order], [COMPS[i] for i in order])
    res = scorer.score(rows, COMPS)  # the anchor pass under the policy's own prompts: A A B B, grouped
    geo = res.geo_mean
    np.testing.assert_allclose(geo[order], plain.geo_mean, rtol=2e-5)
    np.testing.assert_allclose(res.pooled[order], plain.pooled, atol=2e-5)
    cached = scorer.cached_logprobs(rows, COMPS)
    assert cached is not None
    np.testing.assert_allclose(geo, [np.exp(np.mean(x)) for x in cached], rtol=1e-6)
    for b in (full, grouped):
        got = reference_logprobs(scorer, params, LLAMA, b, rows, COMPS)
        np.testing.assert_allclose(got, fresh, atol=2e-5)
    other = [list(c) for c in COMPS]
    other[0] = [44, 45]
    assert scorer.cached_logprobs(rows, other) is None  # a pair it did not score: computed, not reused
    got = reference_logprobs(scorer, params, LLAMA, grouped, rows, COMPS, temperature=0.5)
    assert not np.allclose(got, fresh, atol=1e-3)  # another temperature is never served from the cache


def test_remat_is_chosen_from_the_activation_estimate():
    grouped = activation_bytes_grouped(LLAMA, 4, 4, 128, 128, remat=False)
    assert activation_bytes_grouped(LLAMA, 4, 4, 128, 128, remat=True) < grouped
    assert activation_bytes_grouped(LLAMA, 16, 1, 128, 128, remat=False) > grouped  # no sharing: more
    dots = activation_bytes_grouped(LLAMA, 4, 4, 128, 128, remat="dots")
    assert activation_bytes_grouped(LLAMA, 4, 4, 128, 128, remat=True) < dots < grouped
    assert choose_remat(LLAMA, 4, 4, 128, 128, budget=2 * grouped) is False
    assert choose_remat(LLAMA, 4, 4, 128, 128, budget=2 * grouped - 1) == "dots"
    assert choose_remat(LLAMA, 4, 4, 128, 128, budget=2 * dots - 1) is True


def test_assemble_grouped_checks_rows():
    with pytest.raises(ValueError, match="not a multiple"):
        assemble_grouped(PROMPTS, COMPS[:3], 0, P, C)
    with pytest.raises(ValueError, match="exceed"):
        assemble_grouped(PROMPTS, COMPS, 0, 4, C)


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
