"""The train step: one example layout whether a prompt serves its group once (group G) or once per row
(group 1), with one loss and one update; reference log-probs reuse the reward's reference pass; the "dapo"
normaliser reaches the loss from the example."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_mt.models.decoder import init_params
from jaxrl_mt.rewards.registry import RefLogprobs
from jaxrl_mt.rl.example import assemble_example
from jaxrl_mt.rl.optim import make_optimizer
from jaxrl_mt.rl.step import (LossConfig, activation_bytes_grouped, choose_remat, completion_logprobs,
                              dapo_num_items, loss_fn, make_train_step, reused_logprobs)
from jaxrl_mt.scoring import Scorer, token_logprobs
from tests.models.test_decoder import LLAMA

PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13]]
COMPS = [[30, 31, 32], [33, 34, 2], [34, 35, 36, 37, 38], [40]]
G, P, C = 2, 8, 8


def _full_rows_logprobs(params, rows, comps):
    """The completion log-probs of [left-padded prompt | completion] rows (token_logprobs, no grouping)."""
    from jaxrl_mt.batching import pack_rows

    pt, pm = pack_rows(rows, 0, P, align="left")
    ct, cm = pack_rows(comps, 0, C, align="right")
    lp, _, _ = token_logprobs(params, LLAMA, np.concatenate([pt, ct], 1), np.concatenate([pm, cm], 1))
    return np.asarray(lp[:, P:])


def _examples(params):
    rows = [p for p in PROMPTS for _ in range(G)]
    adv = np.array([1.0, -1.0, 0.5, -0.5], np.float32)
    full = assemble_example(rows, COMPS, 0, P, C, group=1, advantages=adv)
    grouped = assemble_example(PROMPTS, COMPS, 0, P, C, group=G, advantages=adv)
    ref = np.asarray(completion_logprobs(params, LLAMA, full))  # the jitted full-rows pass, as before
    return (full.replace(ref_logp=ref - 0.01), grouped.replace(ref_logp=ref - 0.01))  # a moved policy: KL > 0


def test_grouped_layout_gives_the_full_rows_loss_and_update():
    params = init_params(LLAMA, jax.random.PRNGKey(1), scale=0.2)
    full, grouped = _examples(params)
    assert full.prompt_index.tolist() == [0, 1, 2, 3] and grouped.prompt_index.tolist() == [0, 0, 1, 1]
    # Adam's first step is lr * g / (|g| + eps): with eps 1e-8 an element whose gradient is near 0 turns the
    # layouts' ~5e-6 summation-order difference into 20% of lr (one of 11,520 elements failed 1e-6 on an
    # AVX-512 host); eps 1e-4 keeps the update's sign test for every |g| > 1e-4 and ends that amplification
    opt = make_optimizer(1e-5, max_grad_norm=1.0, eps=1e-4)
    lc = LossConfig(beta=0.04, loss_type="grpo", max_completion_length=C)
    step = make_train_step(LLAMA, opt, lc)
    p_full, _, m_full = step(params, opt.init(params), full)
    p_grp, _, m_grp = step(params, opt.init(params), grouped)
    for k in ("loss", "kl", "entropy", "grad_norm"):
        np.testing.assert_allclose(float(m_grp[k]), float(m_full[k]), rtol=1e-5, atol=1e-6, err_msg=k)
    assert float(m_full["kl"]) > 0
    for a, b in zip(jax.tree_util.tree_leaves(p_grp), jax.tree_util.tree_leaves(p_full)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_slice_rows_keeps_whole_groups_and_their_prompts():
    params = init_params(LLAMA, jax.random.PRNGKey(1), scale=0.2)
    _, grouped = _examples(params)
    second = grouped.slice_rows(2, 2)
    assert second.prompt_tokens.shape == (1, P)
    assert second.completion_tokens.tolist() == grouped.completion_tokens[2:].tolist()
    np.testing.assert_array_equal(second.prompt_tokens[0], grouped.prompt_tokens[1])
    np.testing.assert_array_equal(second.ref_logp, grouped.ref_logp[2:])
    with pytest.raises(ValueError, match="split groups of 2"):
        grouped.slice_rows(1, 2)


def test_reference_logprobs_reuse_the_reward_pass_and_equal_a_fresh_pass():


    params = init_params(LLAMA, jax.random.PRNGKey(2), scale=0.2)
    rows = [p for p in PROMPTS for _ in range(G)]
    full, grouped = _examples(params)
    fresh = _full_rows_logprobs(params, rows, COMPS)
    for ex in (full, grouped):
        np.testing.assert_allclose(np.asarray(completion_logprobs(params, LLAMA, ex)), fresh, atol=2e-5)
    scorer = Scorer(params, LLAMA, pad_id=0, batch_size=4)
    res = scorer.score(rows, COMPS)  # the anchor pass under the policy's own prompts: A A B B, grouped
    ref = RefLogprobs(rows, COMPS, res.logprobs)
    np.testing.assert_allclose(reused_logprobs(ref, rows, COMPS, C), fresh, atol=2e-5)
    other = [list(c) for c in COMPS]
    other[0] = [44, 45]
    assert reused_logprobs(ref, rows, other, C) is None  # a pair it did not score: computed, not reused
    assert reused_logprobs(ref, rows, COMPS, C, temperature=0.5) is None  # scored at temperature 1 only
    assert reused_logprobs(None, rows, COMPS, C) is None
    gaps = RefLogprobs(rows, [[], *COMPS[1:]], [None, *res.logprobs[1:]])  # an empty completion is not scored
    got = reused_logprobs(gaps, rows, [[], *COMPS[1:]], C)
    assert got is not None and not got[0].any()
    np.testing.assert_allclose(got[1:], fresh[1:], atol=2e-5)


def test_remat_is_chosen_from_the_activation_estimate():
    grouped = activation_bytes_grouped(LLAMA, 4, 4, 128, 128, remat=False)
    assert activation_bytes_grouped(LLAMA, 4, 4, 128, 128, remat=True) < grouped
    assert activation_bytes_grouped(LLAMA, 16, 1, 128, 128, remat=False) > grouped  # no sharing: more
    dots = activation_bytes_grouped(LLAMA, 4, 4, 128, 128, remat="dots")
    assert activation_bytes_grouped(LLAMA, 4, 4, 128, 128, remat=True) < dots < grouped
    assert choose_remat(LLAMA, 4, 4, 128, 128, budget=2 * grouped) is False
    assert choose_remat(LLAMA, 4, 4, 128, 128, budget=2 * grouped - 1) == "dots"
    assert choose_remat(LLAMA, 4, 4, 128, 128, budget=2 * dots - 1) is True


def test_assemble_example_checks_rows():
    with pytest.raises(ValueError, match="not 2 per prompt"):
        assemble_example(PROMPTS, COMPS[:3], 0, P, C, group=2)
    with pytest.raises(ValueError, match="exceed"):
        assemble_example(PROMPTS, COMPS, 0, 4, C, group=2)


def test_dapo_num_items_by_hand():
    mask = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]], bool)  # 6 tokens in 4 rows
    np.testing.assert_array_equal(dapo_num_items(mask, 1), [6.0] * 4)
    np.testing.assert_array_equal(dapo_num_items(mask, 2), [3.0] * 4)  # two micro-batches share the step's count
    np.testing.assert_array_equal(dapo_num_items(mask, 2, tokens=20), [10.0] * 4)  # every process's tokens
    np.testing.assert_array_equal(dapo_num_items(np.zeros((2, 3), bool), 1), [1.0, 1.0])  # never divides by 0


def test_loss_fn_divides_by_the_batch_num_items(tiny_chat_model_dir):
    from jaxrl_mt.models.registry import load_model

    m = load_model(str(tiny_chat_model_dir))
    batch = assemble_example([[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14]], m.pad_id, 4, 4, group=1,
                             advantages=np.array([1.0, -0.5]))
    lc = LossConfig(loss_type="dapo")
    alone, _ = loss_fn(m.params, m.cfg, lc, batch)  # no num_items: the batch's 5 tokens
    bnpo, _ = loss_fn(m.params, m.cfg, LossConfig(loss_type="bnpo"), batch)
    assert float(alone) == pytest.approx(float(bnpo), rel=1e-6)
    assert float(alone) == pytest.approx(-(1.0 * 2 - 0.5 * 3) / 5, rel=1e-5)  # on policy: -sum(A * len) / tokens
    scaled, _ = loss_fn(m.params, m.cfg, lc, batch.replace(num_items=jnp.full(2, 20.0)))
    assert float(scaled) == pytest.approx(float(alone) * 5 / 20, rel=1e-5)
