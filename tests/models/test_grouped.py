"""Shared-prefix scoring equals scoring the full rows: values, entropies and gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_mt.batching import pack_rows
from jaxrl_mt.models.decoder import init_params
from jaxrl_mt.scoring import grouped_logprobs, token_logprobs
from tests.models.test_decoder import FEATURES, LLAMA

PREFIXES = [[5, 6, 7, 8, 9], [11, 12], [20, 21, 22, 23, 24, 25, 26]]
SUFFIXES = [[30, 31, 32], [33], [34, 35, 36, 37, 38], [40, 41], [42, 43, 44, 45], [46, 47, 48, 49, 50, 51]]
G, P, C = 2, 8, 7


def _layouts():
    pt, pm = pack_rows(PREFIXES, 0, P, align="left")
    st, sm = pack_rows(SUFFIXES, 0, C, align="right")
    ft, fm = np.concatenate([np.repeat(pt, G, 0), st], 1), np.concatenate([np.repeat(pm, G, 0), sm], 1)
    return (jnp.asarray(pt), jnp.asarray(pm), jnp.asarray(st), jnp.asarray(sm)), (jnp.asarray(ft), jnp.asarray(fm))


@pytest.mark.parametrize("cfg,remat", [(LLAMA, "dots"), (FEATURES, True)], ids=["llama-dots", "all-features-remat"])
def test_grouped_logprobs_equal_full_rows(cfg, remat):
    params = init_params(cfg, jax.random.PRNGKey(3), scale=0.2)
    (pt, pm, st, sm), (ft, fm) = _layouts()
    lp_g, _, ent_g = grouped_logprobs(params, cfg, pt, pm, st, sm, temperature=0.7, remat=remat, with_entropy=True)
    lp_f, _, ent_f = token_logprobs(params, cfg, ft, fm, temperature=0.7, with_entropy=True)
    np.testing.assert_allclose(np.asarray(lp_g), np.asarray(lp_f[:, P:]), atol=2e-5)
    np.testing.assert_allclose(np.asarray(ent_g), np.asarray(ent_f[:, P:]), atol=2e-5)
    assert np.all(np.asarray(lp_g)[np.asarray(sm)] < 0) and np.all(np.asarray(lp_g)[~np.asarray(sm)] == 0)

    w = jnp.asarray(np.random.default_rng(0).normal(size=sm.shape), jnp.float32)
    g_g = jax.grad(lambda p: jnp.sum(w * grouped_logprobs(p, cfg, pt, pm, st, sm, remat=remat)[0]))(params)
    g_f = jax.grad(lambda p: jnp.sum(w * token_logprobs(p, cfg, ft, fm)[0][:, P:]))(params)
    for a, b in zip(jax.tree_util.tree_leaves(g_g), jax.tree_util.tree_leaves(g_f)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=5e-5, rtol=1e-4)


def test_grouped_rejects_rows_not_a_multiple_of_prefixes():
    params = init_params(LLAMA, jax.random.PRNGKey(0))
    (pt, pm, st, sm), _ = _layouts()
    with pytest.raises(ValueError, match="not a multiple"):
        grouped_logprobs(params, LLAMA, pt, pm, st[:5], sm[:5])
