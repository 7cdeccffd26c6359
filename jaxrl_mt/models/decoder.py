"""The decoder-only transformer of the Llama / Qwen2 / Qwen3 / SmolLM2 family, as pure functions.

Parameters are a plain pytree whose layer weights are stacked on a leading layer axis and
consumed by `jax.lax.scan`, so compile time does not grow with depth:

    {"embed": [V, D],
     "layers": {"attn_norm": [L, D], "q": [L, D, Hq*K], "k": [L, D, Hkv*K], "v": [L, D, Hkv*K],
                "o": [L, Hq*K, D], ("q_bias", "k_bias", "v_bias"): [L, H*K],   # Qwen2
                ("q_norm", "k_norm"): [L, K],                                  # Qwen3
                "mlp_norm": [L, D], "gate": [L, D, F], "up": [L, D, F], "down": [L, F, D]},
     "final_norm": [D],
     ("lm_head": [D, V])}                                                       # untied heads

Why plain functions rather than `flax.linen` modules: the tree above maps one-to-one onto the
HF tensor names (import/export is a rename and a transpose), partition rules address it by
path, and the jitted sampler, scorer and GRPO step only ever need `forward`.

RoPE follows HF's rotate-half convention; GGUF's interleaved Q/K rows are un-permuted on import.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from jaxrl_mt.models.attention import MaskSpec, attend, causal_spec, einsum_attention, resolve
from jaxrl_mt.models.cache_attention import cached_attention
from jaxrl_mt.models.config import ModelConfig, ModelError
from jaxrl_mt.models.prefix_attention import PrefixCache, prefix_attention
from jaxrl_mt.models.sharding import constrain_rows

PROJ = "proj"  # checkpoint name of a weight projection's output (`dense`, `remat_layer`)
attention = einsum_attention  # the dense-mask attention (`models.attention.einsum_attention`)

Params = dict[str, Any]


class KVCache(NamedTuple):
    """A preallocated key/value cache over S slots."""

    k: jax.Array  # [L, B, Hkv, S, K] (head-major: each head's keys are contiguous)
    v: jax.Array  # [L, B, Hkv, S, K]
    valid: jax.Array  # [B, S] bool: slot holds a real (non-pad) token
    index: jax.Array  # [] int32: next slot to write (or [B]: each row's, as the slot engine keeps them)


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype: Any = None) -> KVCache:
    """An empty cache for `batch` rows and `max_len` slots."""
    dtype = dtype or cfg.jnp_dtype
    shape = (cfg.num_layers, batch, cfg.num_kv_heads, max_len, cfg.head_dim)
    return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype),
                   jnp.zeros((batch, max_len), bool), jnp.zeros((), jnp.int32))


# ----------------------------------------------------------------------------- RoPE


def rope_inv_freq(cfg: ModelConfig) -> tuple[np.ndarray, float]:
    """Inverse frequencies [K/2] and the attention (cos/sin) factor for the config's RoPE."""
    dim, base = cfg.head_dim, cfg.rope_theta
    inv = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    rs = cfg.rope_scaling_dict
    if not rs:
        return inv, 1.0
    kind = rs.get("rope_type", "default")
    if kind == "linear":
        return inv / float(rs["factor"]), 1.0
    if kind == "llama3":
        factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old_ctx = float(rs["original_max_position_embeddings"])
        lo_wav, hi_wav = old_ctx / lo, old_ctx / hi
        wav = 2 * math.pi / inv
        out = np.where(wav > lo_wav, inv / factor, inv)
        smooth = (old_ctx / wav - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wav < hi_wav) & ~(wav > lo_wav)
        return np.where(medium, smoothed, out), 1.0
    if kind == "yarn":
        factor = float(rs["factor"])
        orig = rs.get("original_max_position_embeddings") or cfg.max_position_embeddings

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        att = rs.get("attention_factor")
        if att is None:
            if rs.get("mscale") and rs.get("mscale_all_dim"):
                att = mscale(factor, rs["mscale"]) / mscale(factor, rs["mscale_all_dim"])
            else:
                att = mscale(factor)
        beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

        def corr_dim(rot: float) -> float:
            return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if rs.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
        extra = 1 - ramp
        pos = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
        inv = (1 / (factor * pos)) * (1 - extra) + (1 / pos) * extra
        return inv, float(att)
    raise ModelError(f"unsupported rope_scaling type {kind!r}")


def rope_cos_sin(cfg: ModelConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos and sin tables [B, T, K] for integer positions [B, T] (rotate-half layout)."""
    inv, factor = rope_inv_freq(cfg)
    ang = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv, jnp.float32)  # [B, T, K/2]
    ang = jnp.concatenate([ang, ang], axis=-1)  # [B, T, K]
    return jnp.cos(ang) * factor, jnp.sin(ang) * factor


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates x [B, T, H, K] by cos/sin [B, T, K] (HF rotate-half)."""
    half = x.shape[-1] // 2
    rot = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x.astype(jnp.float32) * cos[:, :, None] + rot.astype(jnp.float32) * sin[:, :, None]).astype(x.dtype)


# ----------------------------------------------------------------------------- blocks


def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis, computed in fp32."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (y * w.astype(jnp.float32)).astype(x.dtype)


def dense(h: jax.Array, lp: Params, key: str, dt: Any) -> jax.Array:
    """``h @ lp[key]``, plus the unmerged LoRA term ``(h @ A') @ B`` where `models.lora.attach` put
    ``<key>_lora_a`` (A' = scale A) and ``<key>_lora_b`` beside the weight. The sum is named
    ``PROJ``: what ``remat="dots"`` keeps (one [.., out] tensor per projection, adapted or not)."""
    y = h @ lp[key].astype(dt)
    if key + "_lora_a" in lp:
        y = y + (h @ lp[key + "_lora_a"].astype(dt)) @ lp[key + "_lora_b"].astype(dt)
    return checkpoint_name(y, PROJ)


def layer_qkv(cfg: ModelConfig, lp: Params, x: jax.Array, cos: jax.Array, sin: jax.Array
              ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The attention half's projections of one block: RoPE'd q [B, T, Hq, K], k, v [B, T, Hkv, K]."""
    x = constrain_rows(x)  # rows over (data, fsdp) on a mesh (`models.sharding`); else the identity
    b, t, _ = x.shape
    dt = cfg.jnp_dtype
    h = rms_norm(x, lp["attn_norm"], cfg.rms_norm_eps)
    if "qkv" in lp:  # fused layout of `decode_params`: one dot instead of three
        hq, hkv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        qkv = checkpoint_name(h @ lp["qkv"].astype(dt), PROJ)  # [B, T, Hq*K + 2*Hkv*K]
        if cfg.attention_bias:
            qkv = qkv + lp["qkv_bias"].astype(dt)
        q, k, v = qkv[..., :hq], qkv[..., hq:hq + hkv], qkv[..., hq + hkv:]
    else:
        q, k, v = dense(h, lp, "q", dt), dense(h, lp, "k", dt), dense(h, lp, "v", dt)
        if cfg.attention_bias:
            q, k, v = q + lp["q_bias"].astype(dt), k + lp["k_bias"].astype(dt), v + lp["v_bias"].astype(dt)
    q = q.reshape(b, t, cfg.num_heads, cfg.head_dim)
    k = k.reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
    v = v.reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
    if cfg.qk_norm:
        q = rms_norm(q, lp["q_norm"], cfg.rms_norm_eps)
        k = rms_norm(k, lp["k_norm"], cfg.rms_norm_eps)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def layer_out(cfg: ModelConfig, lp: Params, x: jax.Array, att: jax.Array) -> jax.Array:
    """The rest of one block after attention: output projection, residual, MLP, residual."""
    b, t, _ = x.shape
    dt = cfg.jnp_dtype
    x = x + dense(att.reshape(b, t, -1), lp, "o", dt)
    h = rms_norm(x, lp["mlp_norm"], cfg.rms_norm_eps)
    if "gate_up" in lp:
        gu = checkpoint_name(h @ lp["gate_up"].astype(dt), PROJ)  # [B, T, 2F]
        f = gu.shape[-1] // 2
        mlp = jax.nn.silu(gu[..., :f]) * gu[..., f:]
    else:
        mlp = jax.nn.silu(dense(h, lp, "gate", dt)) * dense(h, lp, "up", dt)
    return constrain_rows(x + dense(mlp, lp, "down", dt))


def _layer(cfg: ModelConfig, lp: Params, x: jax.Array, cos: jax.Array, sin: jax.Array,
           attn: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One decoder block: `attn(q, k, v)` -> [B, T, Hq, K] attends the block's queries to its own
    keys/values (and, for a cache, the cached ones). Returns the new residual [B, T, D] and the
    new tokens' keys/values [B, T, Hkv, K] for the caller to write."""
    q, k, v = layer_qkv(cfg, lp, x, cos, sin)
    return layer_out(cfg, lp, x, attn(q, k, v)), k, v


def attention_impl(cfg: ModelConfig, t: int, s: int, *, self_attn: bool) -> str:
    """The implementation serving T queries over S keys (static): `cfg.attention` resolved
    (`models.attention.resolve`); decode (T == 1) always keeps the einsum fast path."""
    if t == 1:
        return "einsum"
    return resolve(cfg.attention, jax.default_backend(), t, s, cfg.jnp_dtype, self_attn=self_attn)[0]


def cache_spec(cache_valid: jax.Array, token_mask: jax.Array) -> MaskSpec:
    """The mask of T new tokens over [cache slots | themselves]: cached slots (position -1) are seen
    by every query where valid, the new tokens causally where real. [B, S] + [B, T] -> [B, S + T]."""
    b, t = token_mask.shape
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None], (b, t))
    kv_pos = jnp.concatenate([jnp.full(cache_valid.shape, -1, jnp.int32), pos], axis=1)
    return MaskSpec(pos, kv_pos, jnp.concatenate([cache_valid, token_mask], axis=1).astype(bool))


def spec_attention(cfg: ModelConfig, impl: str, q: jax.Array, k: jax.Array, v: jax.Array, spec: MaskSpec,
                   k_cache: jax.Array | None = None, v_cache: jax.Array | None = None) -> jax.Array:
    """`attend` of q [B, T, Hq, K] over [cache [B, Hkv, S, K] |] new keys/values k, v [B, T, Hkv, K]."""
    k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)  # head-major [B, Hkv, T, K]
    if k_cache is not None:
        k = jnp.concatenate([k_cache.astype(k.dtype), k], axis=2)
        v = jnp.concatenate([v_cache.astype(v.dtype), v], axis=2)
    return attend(q, k, v, spec, impl=impl, block_k=cfg.attention_block, self_attn=k_cache is None)


def remat_layer(body: Any, remat: bool | str) -> Any:
    """A scanned layer `body` wrapped for the backward pass: True keeps only the layer inputs,
    "dots" also the outputs of the weight matmuls (norms, RoPE, attention and activations are
    recomputed), False keeps everything."""
    if remat == "dots":  # the weight projections' outputs by name (`dense`): with LoRA's unmerged term,
        # JAX's dots_with_no_batch_dims_saveable would also keep (x A) B, a second [.., out] per projection
        return jax.checkpoint(body, policy=jax.checkpoint_policies.save_only_these_names(PROJ))
    if remat not in (True, False):
        raise ValueError(f"remat must be True, False or 'dots', got {remat!r}")
    return jax.checkpoint(body) if remat else body


def forward(params: Params, cfg: ModelConfig, tokens: jax.Array, positions: jax.Array,
            token_mask: jax.Array, cache: KVCache | None = None, *, logits: str = "all",
            remat: bool | str = False, fresh: bool = False,
            prefix: PrefixCache | None = None) -> tuple[jax.Array | None, jax.Array, KVCache | None]:
    """Runs the decoder.

    Args:
      params: the parameter pytree (see module docstring).
      cfg: the model config; `cfg.attention` picks the attention implementation for the call's
        static shapes (`attention_impl`, `models/attention.py`; decode steps keep the einsum).
      tokens: [B, T] int token ids.
      positions: [B, T] int RoPE positions.
      token_mask: [B, T] bool, False on padding (pads are never attended to).
      cache: optional KVCache; the T new tokens are written at slots cache.index..index+T-1.
      logits: "all" for [B, T, V] logits, "last" for [B, 1, V] of the last position, "none".
      remat: rematerialise each layer in the backward pass (saves activation memory): True, "dots"
        or False (`remat_layer`).
      fresh: the cache is empty (the prefill of `init_cache`'s cache: index 0, no valid slot), so
        the new tokens attend only themselves -- causal self-attention over T keys instead of
        S + T, which the attention kernels can serve -- and their keys/values are written at
        slot 0. Same result as `fresh=False` on an empty cache (static; the caller vouches).
      prefix: optional prompts stored once per group of rows (`models.prefix_attention`): with a
        cache, each row also attends its group's prompt before its own cache (read once per group).

    Returns:
      (logits fp32 or None, final hidden states [B, T, D] after the final norm, updated cache).
    """
    dt = cfg.jnp_dtype
    b, t = tokens.shape
    x = params["embed"].astype(dt)[tokens]  # [B, T, D]
    cos, sin = rope_cos_sin(cfg, positions)
    causal = jnp.tril(jnp.ones((t, t), bool))
    layers = params["layers"]

    if cache is None or fresh:
        impl = attention_impl(cfg, t, t, self_attn=True)
        if impl == "einsum":
            mask = causal[None] & token_mask[:, None, :]  # [B, T, T]
            attn = lambda q, k, v: attention(q, k, v, mask)  # noqa: E731
        else:
            spec = causal_spec(token_mask)
            attn = lambda q, k, v: spec_attention(cfg, impl, q, k, v, spec)  # noqa: E731

        def body(x, lp):
            x, k, v = _layer(cfg, lp, x, cos, sin, attn)
            return x, ((k, v) if cache is not None else None)

        x, kv = jax.lax.scan(remat_layer(body, remat), x, layers)
        new_cache = None if cache is None else _write_new(cache, token_mask, *kv)
    else:
        s = cache.k.shape[3]
        idx = cache.index  # [] or, per row, [B] (`KVCache`)
        slot = jnp.arange(s)[None, :]  # [1, S]
        seen = (slot < (idx[:, None] if idx.ndim else idx)) & cache.valid  # [B, S]: earlier writes
        impl = attention_impl(cfg, t, s + t, self_attn=False)
        new_mask = causal[None] & token_mask[:, None, :]  # [B, T, T]
        spec = cache_spec(seen, token_mask) if impl != "einsum" else None
        bound = read_bound(idx, token_mask)

        def body(x, xs):
            lp, li = xs
            attn = _cache_attention(cfg, impl, cache, seen, new_mask, spec, bound, prefix, li, dt)
            x, new_k, new_v = _layer(cfg, lp, x, cos, sin, attn)
            return x, (new_k, new_v)

        # Only the T new keys/values leave the scan; one in-place update writes them for all
        # layers (writing inside the scan would copy a layer's cache per layer).
        x, (nk, nv) = jax.lax.scan(body, x, (layers, jnp.arange(cfg.num_layers)))  # nk: [L, B, T, Hkv, K]
        new_cache = _write_new(cache, token_mask, nk, nv)

    hidden = rms_norm(x, params["final_norm"], cfg.rms_norm_eps)
    if logits == "none":
        return None, hidden, new_cache
    h = hidden[:, -1:] if logits == "last" else hidden
    return lm_head(params, cfg, h), hidden, new_cache


def _cache_attention(cfg: ModelConfig, impl: str, cache: KVCache, seen: jax.Array, new_mask: jax.Array, spec: Any,
                     bound: jax.Array, prefix: PrefixCache | None, li: jax.Array, dt: Any) -> Any:
    """Layer li's attention of new tokens over the cache (and themselves), as a function of (q, k, v)."""
    if prefix is not None:  # the group's prompt read once, then the row's own cache
        return lambda q, k, v: prefix_attention(q, prefix, li, cache.k, cache.v, seen, k, v, new_mask)
    if impl == "einsum":  # reads this layer's slots before the write index only (`cache_attention`)
        return lambda q, k, v: cached_attention(q, cache.k, cache.v, seen, k, v, new_mask, bound=bound, layer=li)
    k_l = jax.lax.dynamic_index_in_dim(cache.k, li, 0, keepdims=False).astype(dt)
    v_l = jax.lax.dynamic_index_in_dim(cache.v, li, 0, keepdims=False).astype(dt)
    return lambda q, k, v: spec_attention(cfg, impl, q, k, v, spec, k_l, v_l)


def read_bound(index: jax.Array, token_mask: jax.Array) -> jax.Array:
    """[] int: the cache slots a call must read, the largest write index of the rows feeding a token
    (with a per-row index [B]; a row feeding none, a finished slot, reads what the others read and its
    output is unused)."""
    if not index.ndim:
        return index
    return jnp.max(jnp.where(jnp.any(token_mask, axis=-1), index, 0))


def _write_new(cache: KVCache, token_mask: jax.Array, nk: jax.Array, nv: jax.Array) -> KVCache:
    """The cache with T new tokens' keys/values nk, nv [L, B, T, Hkv, K] (from the layer scan) and
    their validity written at slots index..index+T-1, in one in-place update for all layers (with a
    per-row index [B], each row at its own slots)."""
    idx = cache.index
    if idx.ndim:
        return _write_rows(cache, token_mask, nk, nv)
    valid = jax.lax.dynamic_update_slice(cache.valid, token_mask, (0, idx))  # [B, S]
    nk, nv = nk.swapaxes(2, 3), nv.swapaxes(2, 3)  # [L, B, Hkv, T, K]
    kc = jax.lax.dynamic_update_slice(cache.k, nk.astype(cache.k.dtype), (0, 0, 0, idx, 0))
    vc = jax.lax.dynamic_update_slice(cache.v, nv.astype(cache.v.dtype), (0, 0, 0, idx, 0))
    return KVCache(kc, vc, valid, idx + token_mask.shape[1])


def _write_rows(cache: KVCache, token_mask: jax.Array, nk: jax.Array, nv: jax.Array) -> KVCache:
    """`_write_new` with a per-row index [B]: row b's T tokens go to its slots index[b]..index[b]+T-1.

    One scatter per array on the cache's own layout (slots past the end are dropped): a vmapped
    dynamic_update_slice over the row axis made XLA:CPU transpose and copy the whole cache at every
    decode step."""
    b, t = token_mask.shape
    rows = jnp.arange(b)[:, None]  # [B, 1]
    cols = cache.index[:, None] + jnp.arange(t)[None]  # [B, T]
    # k[:, rows, :, cols] indexes [B, T, L, Hkv, K]
    kc = cache.k.at[:, rows, :, cols].set(nk.transpose(1, 2, 0, 3, 4).astype(cache.k.dtype), mode="drop")
    vc = cache.v.at[:, rows, :, cols].set(nv.transpose(1, 2, 0, 3, 4).astype(cache.v.dtype), mode="drop")
    valid = cache.valid.at[rows, cols].set(token_mask, mode="drop")
    return KVCache(kc, vc, valid, cache.index + t)


def lm_head(params: Params, cfg: ModelConfig, hidden: jax.Array) -> jax.Array:
    """Logits [..., V] in fp32 from final hidden states [..., D]."""
    dt = cfg.jnp_dtype
    if "lm_head" not in params:  # tied
        w = params["embed"].astype(dt)  # [V, D]
        return jnp.einsum("...d,vd->...v", hidden.astype(dt), w, preferred_element_type=jnp.float32)
    return jnp.einsum("...d,dv->...v", hidden.astype(dt), params["lm_head"].astype(dt),
                      preferred_element_type=jnp.float32)


def decode_params(params: Params, cfg: ModelConfig) -> Params:
    """The same weights laid out for small-batch decoding (call inside jit; same `forward` results).

    Q/K/V become one [L, D, Hq*K + 2*Hkv*K] matrix and gate/up one [L, D, 2F] matrix (one dot
    each instead of three and two), and a tied head gets its own [D, V] copy so the logits are
    a plain row-major product. On XLA:CPU this made batch-8 decoding of the embedded model about
    10% faster on one host (`python -m jaxrl_mt.benchmarks sampling`: 130.6 -> 144.1 tok/s) and no
    faster on another. `Sampler.decode_weights` makes it once per parameter version and keeps it
    (a second copy of the weights).
    """
    lp = dict(params["layers"])
    if any(k.endswith("_lora_a") for k in lp):
        raise ValueError("decode_params takes merged weights (models.lora.merge), not attached adapters")
    fused = {k: v for k, v in lp.items() if k not in ("q", "k", "v", "q_bias", "k_bias", "v_bias", "gate", "up")}
    fused["qkv"] = jnp.concatenate([lp["q"], lp["k"], lp["v"]], axis=-1)  # [L, D, Hq*K + 2*Hkv*K]
    if cfg.attention_bias:
        fused["qkv_bias"] = jnp.concatenate([lp["q_bias"], lp["k_bias"], lp["v_bias"]], axis=-1)
    fused["gate_up"] = jnp.concatenate([lp["gate"], lp["up"]], axis=-1)  # [L, D, 2F]
    out = {"embed": params["embed"], "layers": fused, "final_norm": params["final_norm"]}
    out["lm_head"] = params["lm_head"] if "lm_head" in params else params["embed"].T  # [D, V]
    return out


def positions_from_mask(token_mask: jax.Array) -> jax.Array:
    """RoPE positions [B, T] for left-padded rows: 0 at the first real token."""
    return jnp.maximum(jnp.cumsum(token_mask.astype(jnp.int32), axis=-1) - 1, 0)


def param_shapes(cfg: ModelConfig) -> Params:
    """Shapes of every parameter (a pytree of tuples), in the module docstring's layout."""
    L, D, F, V, K = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
    hq, hkv = cfg.num_heads * K, cfg.num_kv_heads * K
    layers = {"attn_norm": (L, D), "q": (L, D, hq), "k": (L, D, hkv), "v": (L, D, hkv),
              "o": (L, hq, D), "mlp_norm": (L, D), "gate": (L, D, F), "up": (L, D, F),
              "down": (L, F, D)}
    if cfg.attention_bias:
        layers.update(q_bias=(L, hq), k_bias=(L, hkv), v_bias=(L, hkv))
    if cfg.qk_norm:
        layers.update(q_norm=(L, K), k_norm=(L, K))
    shapes: Params = {"embed": (V, D), "layers": layers, "final_norm": (D,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head"] = (D, V)
    return shapes


def init_params(cfg: ModelConfig, rng: jax.Array, scale: float = 0.02) -> Params:
    """Random parameters (normal(0, scale) matrices, unit norms) for tests and benchmarks."""
    shapes = param_shapes(cfg)
    leaves, tree = jax.tree_util.tree_flatten(shapes, is_leaf=lambda s: isinstance(s, tuple))
    keys = jax.random.split(rng, len(leaves))
    paths = [jax.tree_util.keystr(p) for p, _ in
             jax.tree_util.tree_flatten_with_path(shapes, is_leaf=lambda s: isinstance(s, tuple))[0]]
    out = []
    for key, shape, path in zip(keys, leaves, paths):
        if "norm" in path:
            out.append(jnp.ones(shape, cfg.jnp_param_dtype))
        else:
            out.append((scale * jax.random.normal(key, shape)).astype(cfg.jnp_param_dtype))
    return jax.tree_util.tree_unflatten(tree, out)
