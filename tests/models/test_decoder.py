"""Decoder invariants: KV-cache decoding, bf16 compute, RoPE, llama.cpp's Q/K row permutation."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import (apply_rope, forward, init_cache, init_params,
                                     positions_from_mask, rope_cos_sin)
from jaxrl_mt.models.gguf_io import unpermute_rope_rows

LLAMA = ModelConfig(vocab_size=61, hidden_size=48, intermediate_size=80, num_layers=3, num_heads=6,
                    num_kv_heads=2, head_dim=8, rope_theta=100.0, tie_word_embeddings=True)
# Every optional feature at once: q/k/v bias, QK-norm, llama3 rope scaling, untied head.
FEATURES = LLAMA.replace(
    attention_bias=True, qk_norm=True, tie_word_embeddings=False, architecture="qwen3",
    rope_scaling=tuple(sorted({"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 8}.items())))


def permute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's Q/K permutation (rotate-half halves -> interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@functools.partial(jax.jit, static_argnums=(1,), static_argnames=("logits",))
def _fwd(params, cfg, tokens, positions, mask, cache=None, logits="all"):
    return forward(params, cfg, tokens, positions, mask, cache, logits=logits)


def left_padded(rng: np.random.Generator, lengths: tuple[int, ...], t: int, vocab: int):
    tokens = np.zeros((len(lengths), t), np.int32)
    mask = np.zeros((len(lengths), t), bool)
    for i, n in enumerate(lengths):
        tokens[i, t - n:] = rng.integers(1, vocab, n)
        mask[i, t - n:] = True
    return jnp.asarray(tokens), jnp.asarray(mask)


@pytest.mark.parametrize("cfg", [LLAMA, FEATURES], ids=["llama-gqa-tied", "bias-qknorm-llama3"])
def test_cached_decoding_equals_full_forward(cfg):
    rng = np.random.default_rng(0)
    params = init_params(cfg, jax.random.key(1), scale=0.2)
    p_len, n_new, b = 8, 4, 3  # [3, 12] as in the tests below, so jit reuses the compilation
    prompt, pmask = left_padded(rng, (8, 5, 1), p_len, cfg.vocab_size)
    new = jnp.asarray(rng.integers(1, cfg.vocab_size, (b, n_new)), jnp.int32)
    tokens = jnp.concatenate([prompt, new], axis=1)  # [B, P + N]
    mask = jnp.concatenate([pmask, jnp.ones((b, n_new), bool)], axis=1)
    positions = positions_from_mask(mask)
    full, _, _ = _fwd(params, cfg, tokens, positions, mask)  # [B, P + N, V]
    full = np.asarray(full)
    assert np.abs(full[np.asarray(mask)]).max() > 1.0  # logits are not trivially small

    # Prefill in two chunks of 4 slots, then one token at a time; 4 spare slots stay empty.
    cache = init_cache(cfg, b, p_len + n_new + 4)
    got = []
    for lo, hi in ((0, 4), (4, p_len)):
        logits, _, cache = _fwd(params, cfg, tokens[:, lo:hi], positions[:, lo:hi], mask[:, lo:hi], cache)
        got.append(np.asarray(logits))
    for j in range(p_len, p_len + n_new):
        logits, _, cache = _fwd(params, cfg, tokens[:, j:j + 1], positions[:, j:j + 1],
                                mask[:, j:j + 1], cache, logits="last")
        got.append(np.asarray(logits))
    got = np.concatenate(got, axis=1)
    assert int(cache.index) == p_len + n_new
    np.testing.assert_array_equal(np.asarray(cache.valid)[:, : p_len + n_new], np.asarray(mask))
    assert not np.asarray(cache.valid)[:, p_len + n_new:].any()
    m = np.asarray(mask)
    assert np.abs(got[m] - full[m]).max() <= 1e-4


def test_left_padding_does_not_change_a_row():
    """A left-padded row gives the same logits as the same tokens alone, unpadded."""
    rng = np.random.default_rng(2)
    params = init_params(LLAMA, jax.random.key(3), scale=0.2)
    tokens, mask = left_padded(rng, (12, 5, 9), 12, LLAMA.vocab_size)
    batch, _, _ = _fwd(params, LLAMA, tokens, positions_from_mask(mask), mask)
    alone, _, _ = _fwd(params, LLAMA, tokens[1:2, 7:], positions_from_mask(mask[1:2, 7:]), mask[1:2, 7:])
    assert np.abs(np.asarray(batch)[1, 7:] - np.asarray(alone)[0]).max() <= 1e-5


def test_bf16_compute_is_close_to_fp32():
    rng = np.random.default_rng(4)
    params = init_params(FEATURES, jax.random.key(5), scale=0.2)
    tokens, mask = left_padded(rng, (12, 6, 9), 12, FEATURES.vocab_size)
    pos = positions_from_mask(mask)
    ref, _, _ = _fwd(params, FEATURES, tokens, pos, mask)
    cfg16 = FEATURES.replace(dtype="bfloat16", param_dtype="bfloat16")
    params16 = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), params)
    out, hidden, _ = _fwd(params16, cfg16, tokens, pos, mask)
    assert out.dtype == jnp.float32 and hidden.dtype == jnp.bfloat16
    m = np.asarray(mask)
    ref, out = np.asarray(ref)[m], np.asarray(out)[m]
    err = np.abs(out - ref).max()
    assert 0 < err <= 0.05 * np.abs(ref).max()  # bf16 really ran, and stays within 5% of the range
    assert (out.argmax(-1) == ref.argmax(-1)).mean() >= 0.9


def test_rope_rotate_half_equals_complex_rotation():
    cfg = LLAMA.replace(head_dim=16, rope_theta=500.0)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 5, 3, 16)).astype(np.float32)  # [B, T, H, K]
    pos = rng.integers(0, 300, (2, 5))
    cos, sin = rope_cos_sin(cfg, jnp.asarray(pos))
    got = np.asarray(apply_rope(jnp.asarray(x), cos, sin))
    # Pair (x[j], x[j + K/2]) is the complex number x[j] + i x[j + K/2], turned by pos * theta^(-2j/K).
    inv = 500.0 ** (-np.arange(0, 16, 2) / 16.0)  # [K/2]
    z = x[..., :8].astype(np.float64) + 1j * x[..., 8:]
    z = z * np.exp(1j * pos[:, :, None, None] * inv)
    want = np.concatenate([z.real, z.imag], axis=-1)
    np.testing.assert_allclose(got, want, atol=2e-4)
    assert np.abs(got - x).max() > 0.5  # positions are large enough to rotate visibly


def test_unpermute_inverts_llama_cpp_permutation():
    rng = np.random.default_rng(7)
    for n_head, k, d in ((9, 64, 5), (3, 8, 4), (1, 4, 2)):
        w = rng.standard_normal((n_head * k, d)).astype(np.float32)
        perm = permute_rope_rows(w, n_head)
        assert not np.array_equal(perm, w)
        np.testing.assert_array_equal(unpermute_rope_rows(perm, n_head), w)
        np.testing.assert_array_equal(unpermute_rope_rows(w, n_head).shape, w.shape)
    # Row by row: GGUF row h*K + 2j is HF row h*K + j; row h*K + 2j + 1 is HF row h*K + K/2 + j.
    w = np.arange(2 * 6)[:, None]
    np.testing.assert_array_equal(permute_rope_rows(w, 2)[:, 0], [0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11])


def test_interleaved_rope_on_gguf_rows_equals_rotate_half_on_hf_rows():
    """Why un-permuting is right: llama.cpp's adjacent-pair RoPE on permuted rows is HF's RoPE."""
    cfg = LLAMA.replace(head_dim=8, rope_theta=100.0)
    rng = np.random.default_rng(8)
    n_head, k, d = 3, 8, 10
    w_hf = rng.standard_normal((n_head * k, d)).astype(np.float32)
    x = rng.standard_normal(d).astype(np.float32)
    pos = 13
    theta = pos * 100.0 ** (-np.arange(0, k, 2) / k)  # [K/2]
    q = (permute_rope_rows(w_hf, n_head) @ x).reshape(n_head, k // 2, 2)  # GGUF order, pairs
    c, s = np.cos(theta), np.sin(theta)
    q_rot = np.stack([q[..., 0] * c - q[..., 1] * s, q[..., 0] * s + q[..., 1] * c], -1).reshape(-1)
    cos, sin = rope_cos_sin(cfg, jnp.full((1, 1), pos))
    want = np.asarray(apply_rope(jnp.asarray((w_hf @ x).reshape(1, 1, n_head, k)), cos, sin)).reshape(-1)
    np.testing.assert_allclose(unpermute_rope_rows(q_rot, n_head), want, atol=1e-5)
