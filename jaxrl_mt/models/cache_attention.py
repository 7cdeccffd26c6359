"""The einsum implementation's cache form: attention of new tokens over a KV cache and themselves,
reading only the cache slots that can hold live context.

A decode step (T = 1) and a continuation's prefill (T > 1) attend the cached slots written so far
plus the new tokens' own keys. Every slot at or after the cache's write index is empty, so a call
only needs the slots before it: `cached_attention` reads a prefix of the cache whose length is the
first of a few static `prefix_buckets` at or past the index (chosen at run time with
`lax.switch`), instead of all S slots. The scores are dot products (`einsum`, fp32 accumulation):
no [B, Hkv, G, S, K] product is written before a reduction. This is `attend`'s einsum
implementation (`models/attention.py`) where the keys come from a cache; the long-context
implementations (blockwise, kernels) take the cache through `decoder.spec_attention` as before.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

DECODE_BLOCK = 64  # cache slots per bucket step: the bound is rounded up to a multiple of it
MAX_BUCKETS = 16  # static prefix lengths compiled per call (geometric growth past this many blocks)


def prefix_buckets(s: int, block: int = DECODE_BLOCK, most: int = MAX_BUCKETS) -> tuple[int, ...]:
    """The static prefix lengths a call over S cache slots may read, ascending, the last = S.

    Multiples of `block` while there are at most `most` of them; past that, lengths growing by a
    constant factor (multiples of `block`), so that a call reads at most about that factor more
    slots than it needs, with `most` compiled branches whatever S.

    Args:
      s: cache slots (static); block: the rounding of the bound; most: the most buckets.

    Returns:
      The lengths, e.g. (64, 128, 192, 256) for S = 256, (s,) when S <= block.
    """
    if s <= block:
        return (s,)
    nblocks = -(-s // block)
    if nblocks <= most:
        steps = range(1, nblocks + 1)
    else:
        ratio = nblocks ** (1.0 / (most - 1))
        steps = sorted({min(nblocks, math.ceil(ratio ** i)) for i in range(most)})
    return tuple(min(s, block * n) for n in steps)


def read_length(bound: jax.Array, s: int, block: int = DECODE_BLOCK) -> jax.Array:
    """[] int32: the cache slots a call bounded by `bound` reads (the first `prefix_buckets(s)` >= bound)."""
    buckets = jnp.asarray(prefix_buckets(s, block), jnp.int32)
    return buckets[jnp.minimum(jnp.searchsorted(buckets, bound.astype(jnp.int32), side="left"), len(buckets) - 1)]


def _prefix_attention(q, k_cache, v_cache, seen, k_new, v_new, new_mask, length: int, layer):
    """Attention over the first `length` cache slots and the new keys (see `cached_attention`)."""
    b, t, hq, kd = q.shape
    hkv = k_new.shape[2]
    if layer is not None:  # a layer of [L, B, Hkv, S, K] stacked caches, sliced to the prefix only
        shape = (1,) + k_cache.shape[1:3] + (length, kd)
        k_cache = jax.lax.dynamic_slice(k_cache, (layer, 0, 0, 0, 0), shape)[0]
        v_cache = jax.lax.dynamic_slice(v_cache, (layer, 0, 0, 0, 0), shape)[0]
    else:
        k_cache, v_cache = k_cache[:, :, :length], v_cache[:, :, :length]
    k_cache, v_cache = k_cache.astype(q.dtype), v_cache.astype(q.dtype)
    qg = q.reshape(b, t, hkv, hq // hkv, kd)  # [B, T, Hkv, G, K]
    neg = jnp.finfo(jnp.float32).min
    scale = 1.0 / math.sqrt(kd)
    s_old = jnp.einsum("btkgd,bksd->bkgts", qg, k_cache, preferred_element_type=jnp.float32)
    s_new = jnp.einsum("btkgd,bskd->bkgts", qg, k_new, preferred_element_type=jnp.float32)
    s_old = jnp.where(seen[:, None, None, None, :length], s_old * scale, neg)  # [B, Hkv, G, T, length]
    s_new = jnp.where(new_mask[:, None, None], s_new * scale, neg)  # [B, Hkv, G, T, T]
    m = jnp.maximum(jnp.max(s_old, -1, keepdims=True), jnp.max(s_new, -1, keepdims=True))
    p_old, p_new = jnp.exp(s_old - m), jnp.exp(s_new - m)
    denom = jnp.sum(p_old, -1, keepdims=True) + jnp.sum(p_new, -1, keepdims=True)
    o_old = jnp.einsum("bkgts,bksd->btkgd", (p_old / denom).astype(v_cache.dtype), v_cache,
                       preferred_element_type=jnp.float32)
    o_new = jnp.einsum("bkgts,bskd->btkgd", (p_new / denom).astype(v_new.dtype), v_new,
                       preferred_element_type=jnp.float32)
    return (o_old + o_new).astype(v_new.dtype).reshape(b, t, hq, kd)


def cached_attention(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array, seen: jax.Array,
                     k_new: jax.Array, v_new: jax.Array, new_mask: jax.Array, *, bound: jax.Array | None = None,
                     layer: jax.Array | None = None, block: int = DECODE_BLOCK) -> jax.Array:
    """Attention over a read-only cache plus the new tokens' own keys/values.

    Args:
      q: [B, T, Hq, K] new queries.
      k_cache, v_cache: [B, Hkv, S, K] cached keys/values, or with `layer` the stacked caches of
        every layer [L, B, Hkv, S, K] (only the prefix read of that layer is sliced out).
      seen: [B, S] bool, the cached slots every new query may attend.
      k_new, v_new: [B, T, Hkv, K] the new tokens' keys/values.
      new_mask: [B, T, T] causal mask among the new tokens (and their padding).
      bound: optional [] int: no slot at or past it is seen (the cache's write index); the call
        reads only the first `prefix_buckets(S)` length covering it. None: all S slots.
      layer: optional [] int, the layer of stacked caches.
      block: the bucket step (static).

    Returns:
      [B, T, Hq, K] in v_new's dtype. Equal (up to fp32 summation order) to the einsum attention
      over the concatenated keys.
    """
    s = k_cache.shape[-2]
    buckets = prefix_buckets(s, block) if bound is not None else (s,)
    branches = [functools.partial(_prefix_attention, length=n, layer=layer) for n in buckets]
    args = (q, k_cache, v_cache, seen, k_new, v_new, new_mask)
    if len(branches) == 1:
        return branches[0](*args)
    index = jnp.searchsorted(jnp.asarray(buckets, jnp.int32), bound.astype(jnp.int32), side="left")
    return jax.lax.switch(jnp.minimum(index, len(buckets) - 1), branches, *args)
