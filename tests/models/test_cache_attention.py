"""The einsum's cache form (`models.cache_attention`): its buckets, parity with the dense einsum
over the concatenated keys, and that slots past the chosen prefix are never read."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_mt.models import attention as A
from jaxrl_mt.models.cache_attention import cached_attention, prefix_buckets


def test_prefix_buckets_by_hand():
    assert prefix_buckets(256, 64) == (64, 128, 192, 256)
    assert prefix_buckets(41, 8) == (8, 16, 24, 32, 40, 41)
    assert prefix_buckets(50, 64) == (50,)
    assert prefix_buckets(64, 64) == (64,)


@pytest.mark.parametrize("s", [1088, 4160, 9216])
def test_prefix_buckets_grow_geometrically_past_the_cap(s):
    b = prefix_buckets(s, 64, 16)
    assert len(b) <= 16 and b[-1] == s and list(b) == sorted(set(b))
    assert all(n % 64 == 0 for n in b[:-1])
    nblocks = -(-s // 64)
    ratio = nblocks ** (1 / 15)
    for lo, hi in zip(b, b[1:]):  # a bound just past `lo` reads `hi`: at most ~ratio times what it needs
        assert hi <= max(lo + 64, np.ceil(ratio * lo / 64) * 64 + 64), (lo, hi)


def _case(seed, b=3, t=1, s=41, hq=6, hkv=2, kd=8):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(b, t, hq, kd)), jnp.float32)
    kc = jnp.asarray(rng.normal(size=(b, hkv, s, kd)), jnp.float32)
    vc = jnp.asarray(rng.normal(size=(b, hkv, s, kd)), jnp.float32)
    kn = jnp.asarray(rng.normal(size=(b, t, hkv, kd)), jnp.float32)
    vn = jnp.asarray(rng.normal(size=(b, t, hkv, kd)), jnp.float32)
    valid = rng.random((b, s)) < 0.8
    new_valid = np.ones((b, t), bool)
    new_valid[0, : t // 2] = False  # a left-padded segment
    return q, kc, vc, kn, vn, valid, new_valid


def _reference(q, kc, vc, kn, vn, seen, new_valid):
    """The dense einsum over [cache | new] keys with a mask built by hand."""
    b, t = new_valid.shape
    s = seen.shape[1]
    mask = np.zeros((b, t, s + t), bool)
    for r in range(b):
        for i in range(t):
            mask[r, i, :s] = seen[r]
            mask[r, i, s:s + i + 1] = new_valid[r, : i + 1]
    k = jnp.concatenate([kc.swapaxes(1, 2), kn], axis=1)
    v = jnp.concatenate([vc.swapaxes(1, 2), vn], axis=1)
    return A.einsum_attention(q, k, v, jnp.asarray(mask))


@pytest.mark.parametrize("t", [1, 5])
@pytest.mark.parametrize("bound", [1, 7, 8, 9, 33, 41])
def test_bounded_equals_dense_einsum(t, bound):
    q, kc, vc, kn, vn, valid, new_valid = _case(bound + t, t=t)
    seen = valid & (np.arange(kc.shape[2])[None] < bound)
    new_mask = jnp.asarray(np.tril(np.ones((t, t), bool))[None] & new_valid[:, None, :])
    want = _reference(q, kc, vc, kn, vn, seen, new_valid)
    got = jax.jit(lambda *a: cached_attention(*a, bound=jnp.int32(bound), block=8))(
        q, kc, vc, jnp.asarray(seen), kn, vn, new_mask)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=0)
    # the stacked form: the same layer out of [L, B, Hkv, S, K] caches
    ks, vs = jnp.stack([kc * 0 + 7, kc]), jnp.stack([vc * 0 - 7, vc])
    got_l = jax.jit(lambda q, ks, vs, seen, kn, vn, nm: cached_attention(
        q, ks, vs, seen, kn, vn, nm, bound=jnp.int32(bound), layer=jnp.int32(1), block=8))(
        q, ks, vs, jnp.asarray(seen), kn, vn, new_mask)
    np.testing.assert_allclose(np.asarray(got_l), np.asarray(want), atol=1e-5, rtol=0)


@pytest.mark.parametrize("bound,read", [(1, 8), (8, 8), (9, 16), (40, 40), (41, 41)])
def test_slots_past_the_bucket_are_not_read(bound, read):
    """NaN keys and values past the bucket would reach the output (0 x NaN) if they were read."""
    assert min(n for n in prefix_buckets(41, 8) if n >= bound) == read
    q, kc, vc, kn, vn, valid, new_valid = _case(bound)
    seen = jnp.asarray(valid & (np.arange(41)[None] < bound))
    new_mask = jnp.asarray(new_valid[:, None, :])
    fn = jax.jit(lambda kc, vc: cached_attention(q, kc, vc, seen, kn, vn, new_mask, bound=jnp.int32(bound), block=8))
    clean = fn(kc, vc)
    poisoned = fn(kc.at[:, :, read:].set(jnp.nan), vc.at[:, :, read:].set(jnp.nan))
    np.testing.assert_array_equal(np.asarray(poisoned), np.asarray(clean))
    if read < 41:  # and the slot just before the bucket's end is read: poison there shows
        leak = fn(kc, vc.at[:, :, read - 1].set(jnp.nan))
        assert np.isnan(np.asarray(leak)).any()
