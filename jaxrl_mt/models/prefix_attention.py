"""Decode attention over a prompt shared by a group of rows, read once per group (cascade attention).

A GRPO group's G completions continue one prompt. Stored once per group (`PrefixCache`), the
prompt's keys and values would still be read G times if every row attended them on its own. Here
the rows' queries are gathered per group (`members`: the rows of each stored prompt), the scores
against the prompt are one dot per group, the probabilities are gathered back the same way for the
values: each prompt's K and V are read once per step, whatever G. The rows' own tokens (their
cache since the prompt, plus the new token) are attended per row as in `cache_attention`, and the
two parts are merged with their softmax statistics (max and sum), as FlashInfer's cascade does.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp


class PrefixCache(NamedTuple):
    """U stored prompts and which rows continue each (W rows, G rows per prompt at most)."""

    k: jax.Array  # [L, U, Hkv, P, K]
    v: jax.Array  # [L, U, Hkv, P, K]
    valid: jax.Array  # [U, P] bool: real prompt tokens
    pid: jax.Array  # [W] int: the prompt row r continues (U or more: none)
    gpos: jax.Array  # [W] int: r's place among its prompt's rows
    members: jax.Array  # [U, G] int: the rows continuing each prompt (W: an empty place)


def prefix_attention(q: jax.Array, prefix: PrefixCache, layer: jax.Array, k_cache: jax.Array, v_cache: jax.Array,
                     seen: jax.Array, k_new: jax.Array, v_new: jax.Array, new_mask: jax.Array) -> jax.Array:
    """Attention of new tokens over their group's stored prompt, their own cache and themselves.

    Args:
      q: [W, T, Hq, K] new queries; k_new, v_new: [W, T, Hkv, K]; new_mask: [W, T, T].
      prefix: the stored prompts (stacked over layers) and the row tables; layer: [] int.
      k_cache, v_cache: [L, W, Hkv, S, K] the rows' own caches (tokens after the prompt);
      seen: [W, S] bool, their slots each query may attend.

    Returns:
      [W, T, Hq, K] in v_new's dtype; equal (up to fp32 summation order) to attention over the
      prompt, the own cache and the new tokens concatenated per row.
    """
    w, t, hq, kd = q.shape
    hkv = k_new.shape[2]
    g = hq // hkv
    neg = jnp.finfo(jnp.float32).min
    scale = 1.0 / math.sqrt(kd)
    take = lambda a: jax.lax.dynamic_index_in_dim(a, layer, 0, keepdims=False)  # noqa: E731
    kp, vp = take(prefix.k).astype(q.dtype), take(prefix.v).astype(q.dtype)  # [U, Hkv, P, K]
    kc, vc = take(k_cache).astype(q.dtype), take(v_cache).astype(q.dtype)  # [W, Hkv, S, K]
    qg = q.reshape(w, t, hkv, g, kd)
    u = kp.shape[0]
    has = prefix.pid < u
    pid = jnp.minimum(prefix.pid, u - 1)
    # the prompt part: queries gathered per stored prompt, its keys read once
    q_tab = jnp.concatenate([qg, jnp.zeros_like(qg[:1])])[prefix.members]  # [U, G, T, Hkv, g, K]
    s_tab = jnp.einsum("untkgd,ukpd->unkgtp", q_tab, kp, preferred_element_type=jnp.float32)
    s_pre = s_tab[pid, prefix.gpos]  # [W, Hkv, g, T, P]
    ok = (prefix.valid[pid] & has[:, None])[:, None, None, None, :]
    s_pre = jnp.where(ok, s_pre * scale, neg)
    # the row's own part: its cache since the prompt and the new tokens
    s_old = jnp.einsum("btkgd,bksd->bkgts", qg, kc, preferred_element_type=jnp.float32)
    s_old = jnp.where(seen[:, None, None, None, :], s_old * scale, neg)
    s_new = jnp.einsum("btkgd,bskd->bkgts", qg, k_new, preferred_element_type=jnp.float32)
    s_new = jnp.where(new_mask[:, None, None], s_new * scale, neg)
    m = jnp.maximum(jnp.maximum(jnp.max(s_pre, -1, keepdims=True), jnp.max(s_old, -1, keepdims=True)),
                    jnp.max(s_new, -1, keepdims=True))
    p_pre, p_old, p_new = jnp.exp(s_pre - m), jnp.exp(s_old - m), jnp.exp(s_new - m)
    denom = jnp.sum(p_pre, -1, keepdims=True) + jnp.sum(p_old, -1, keepdims=True) + jnp.sum(p_new, -1, keepdims=True)
    # the prompt's values, read once: probabilities gathered per stored prompt
    p_tab = jnp.concatenate([p_pre / denom, jnp.zeros_like(p_pre[:1])])[prefix.members]  # [U, G, Hkv, g, T, P]
    o_tab = jnp.einsum("unkgtp,ukpd->untkgd", p_tab.astype(vp.dtype), vp, preferred_element_type=jnp.float32)
    o_pre = jnp.where(has[:, None, None, None, None], o_tab[pid, prefix.gpos], 0.0)  # [W, T, Hkv, g, K]
    o_old = jnp.einsum("bkgts,bksd->btkgd", (p_old / denom).astype(vc.dtype), vc, preferred_element_type=jnp.float32)
    o_new = jnp.einsum("bkgts,bskd->btkgd", (p_new / denom).astype(v_new.dtype), v_new,
                       preferred_element_type=jnp.float32)
    return (o_pre + o_old + o_new).astype(v_new.dtype).reshape(w, t, hq, kd)
