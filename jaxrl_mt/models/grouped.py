"""The decoder over rows that share a prefix: each prefix is run once, not once per continuation.

A GRPO step scores G completions of every prompt (the rollout, the reference log-probs of the KL
term, the anchor reward under a prompt shared by the group). Laid out as G full rows
[prompt | completion], the prompt's tokens go through every layer G times, forward and backward.
`forward_grouped` runs the Bp prompts once and the Bp * G completions attending to their
group's prompt keys/values (the decoder's own cache attention, `cfg.attention`'s implementation), so
the prompt costs 1/G of what it did; gradients of the prompt's keys/values sum over the group
(the transpose of the repeat). The results equal `decoder.forward` on the full rows up to float
summation order (tests/models/test_grouped.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.attention import causal_spec
from jaxrl_mt.models.decoder import (Params, attention, attention_impl, cache_spec, cached_attention, layer_out,
                                     layer_qkv, positions_from_mask, remat_layer, rms_norm, rope_cos_sin,
                                     spec_attention)


def forward_grouped(params: Params, cfg: ModelConfig, prefix: jax.Array, prefix_mask: jax.Array,
                    suffix: jax.Array, suffix_mask: jax.Array, *, remat: bool | str = False
                    ) -> tuple[jax.Array, jax.Array]:
    """Runs the decoder over prefixes and the continuations that share them.

    Args:
      params, cfg: the model.
      prefix: [Bp, P] left-padded prefix ids; prefix_mask: [Bp, P] real tokens.
      suffix: [Bp * G, C] right-padded continuation ids, G consecutive rows per prefix (row i
        continues prefix i // G); suffix_mask: [Bp * G, C] real tokens.
      remat: rematerialise each layer in the backward pass: True (keep only the layer inputs),
        "dots" (keep the outputs of the weight matmuls too, recompute the rest: norms, RoPE,
        attention, activations), False (keep everything).

    Returns:
      (final hidden state of each prefix's last position [Bp, D], final hidden states of the
      continuations [Bp * G, C, D]), both after the final norm.
    """
    dt = cfg.jnp_dtype
    bp, p = prefix.shape
    b, c = suffix.shape
    if b % bp:
        raise ValueError(f"{b} continuation rows are not a multiple of {bp} prefixes")
    g = b // bp
    xp = params["embed"].astype(dt)[prefix]  # [Bp, P, D]
    xs = params["embed"].astype(dt)[suffix]  # [B, C, D]
    plen = jnp.sum(prefix_mask, axis=-1).astype(jnp.int32)  # [Bp]
    cos_p, sin_p = rope_cos_sin(cfg, positions_from_mask(prefix_mask))
    cos_s, sin_s = rope_cos_sin(cfg, jnp.repeat(plen, g)[:, None] + positions_from_mask(suffix_mask))
    impl_p = attention_impl(cfg, p, p, self_attn=True)
    impl_s = attention_impl(cfg, c, p + c, self_attn=False)
    if impl_p == "einsum":
        mask_p = jnp.tril(jnp.ones((p, p), bool))[None] & prefix_mask[:, None, :]  # [Bp, P, P]
        attn_p = lambda q, k, v: attention(q, k, v, mask_p)  # noqa: E731
    else:
        spec_p = causal_spec(prefix_mask)
        attn_p = lambda q, k, v: spec_attention(cfg, impl_p, q, k, v, spec_p)  # noqa: E731
    if impl_s == "einsum":
        seen = jnp.repeat(prefix_mask, g, axis=0)  # [B, P]
        new_mask = jnp.tril(jnp.ones((c, c), bool))[None] & suffix_mask[:, None, :]  # [B, C, C]
        attn_s = lambda q, k, v, kc, vc: cached_attention(q, kc, vc, seen, k, v, new_mask)  # noqa: E731
    else:
        spec_s = cache_spec(jnp.repeat(prefix_mask, g, axis=0), suffix_mask)
        attn_s = lambda q, k, v, kc, vc: spec_attention(cfg, impl_s, q, k, v, spec_s, kc, vc)  # noqa: E731

    def body(carry, lp):
        xp, xs = carry
        qp, kp, vp = layer_qkv(cfg, lp, xp, cos_p, sin_p)
        qs, ks, vs = layer_qkv(cfg, lp, xs, cos_s, sin_s)
        att_p = attn_p(qp, kp, vp)
        kc = jnp.repeat(kp, g, axis=0).swapaxes(1, 2)  # [B, Hkv, P, K]: the group's prefix keys
        vc = jnp.repeat(vp, g, axis=0).swapaxes(1, 2)
        att_s = attn_s(qs, ks, vs, kc, vc)
        return (layer_out(cfg, lp, xp, att_p), layer_out(cfg, lp, xs, att_s)), None

    body_fn = remat_layer(body, remat)
    (xp, xs), _ = jax.lax.scan(body_fn, (xp, xs), params["layers"])
    eps = cfg.rms_norm_eps
    return rms_norm(xp[:, -1], params["final_norm"], eps), rms_norm(xs, params["final_norm"], eps)
