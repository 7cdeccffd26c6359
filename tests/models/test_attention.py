"""Blockwise attention against the einsum attention: outputs, gradients, every mask layout, models.

The reference masks are built here by hand (loops over numpy rows), independently of
`attention.dense_mask` / `MaskSpec`; the reference attention is today's einsum math
(`einsum_attention`, `decoder.cached_attention`). Outputs must agree within 1e-5 absolute,
gradients of a random linear functional (w.r.t. q, k and v) within 1e-4 relative to the
largest reference entry.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_mt.models import attention as A
from jaxrl_mt.models.decoder import cache_spec, cached_attention, forward, init_params, positions_from_mask
from jaxrl_mt.sampling import SamplingConfig
from jaxrl_mt.sampling.host import Sampler
from tests.models.test_decoder import LLAMA


def _qkv(rng, b, t, s, hq, hkv, kd=16):
    q = jnp.asarray(rng.normal(size=(b, t, hq, kd)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(b, hkv, s, kd)), jnp.float32)  # head-major
    v = jnp.asarray(rng.normal(size=(b, hkv, s, kd)), jnp.float32)
    return q, k, v


def _assert_parity(q, k, v, spec, mask, block_k, reference=None):
    """Blockwise under `spec` equals the reference (einsum over the hand-made `mask` [B, T, S])."""
    w = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)
    if reference is None:
        def reference(q, k, v):
            return A.einsum_attention(q, k.swapaxes(1, 2), v.swapaxes(1, 2), jnp.asarray(mask))

    def blockwise(q, k, v):
        return A.blockwise_attention(q, k, v, spec, block_k=block_k)

    np.testing.assert_array_equal(np.asarray(A.dense_mask(spec)), mask)
    out_r, out_b = reference(q, k, v), blockwise(q, k, v)
    np.testing.assert_allclose(np.asarray(out_b), np.asarray(out_r), atol=1e-5, rtol=0)
    g_r = jax.grad(lambda *a: jnp.sum(w * reference(*a)), (0, 1, 2))(q, k, v)
    g_b = jax.grad(lambda *a: jnp.sum(w * blockwise(*a)), (0, 1, 2))(q, k, v)
    for name, a, b in zip("qkv", g_b, g_r):
        rel = float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
        assert rel < 1e-4, (name, rel)


def _causal_mask(valid: np.ndarray) -> np.ndarray:
    b, t = valid.shape
    m = np.zeros((b, t, t), bool)
    for r in range(b):
        for i in range(t):
            for j in range(i + 1):
                m[r, i, j] = valid[r, j]
    return m


CASES = [  # (Hq, Hkv, T, block_k, padding)
    (4, 4, 37, 8, "left"), (8, 2, 37, 16, "right"), (6, 1, 101, 32, "left"), (8, 2, 101, 7, "none"),
    (6, 1, 37, 64, "right"), (4, 4, 101, 100, "left"),
]


@pytest.mark.parametrize("hq,hkv,t,block_k,padding", CASES)
def test_causal_self_attention_with_padding(hq, hkv, t, block_k, padding):
    rng = np.random.default_rng(t * hq + block_k)
    q, k, v = _qkv(rng, 3, t, t, hq, hkv)
    n = np.array([t, t - 5, 1])  # real tokens per row (one row with a single token)
    idx = np.arange(t)[None]
    if padding == "left":
        valid = idx >= (t - n)[:, None]
    elif padding == "right":
        valid = idx < n[:, None]
    else:
        valid = np.ones((3, t), bool)
    _assert_parity(q, k, v, A.causal_spec(jnp.asarray(valid)), _causal_mask(valid), block_k)


def test_grouped_prefix_layout_packed_with_segments():
    """[prompt | c1 | c2 | c3] in one row: the completions see the prompt, not each other."""
    rng = np.random.default_rng(7)
    p, lens = 11, [5, 9, 4]
    t = p + sum(lens)
    seg = np.concatenate([np.zeros(p, int)] + [np.full(n, i + 1) for i, n in enumerate(lens)])
    pos = np.concatenate([np.arange(p)] + [p + np.arange(n) for n in lens])
    valid = np.ones(t, bool)
    valid[p + lens[0] - 1] = False  # a pad at the end of completion 1
    mask = np.zeros((1, t, t), bool)
    for i in range(t):
        for j in range(t):
            mask[0, i, j] = valid[j] and pos[j] <= pos[i] and (seg[j] == seg[i] or seg[j] == 0)
    spec = A.MaskSpec(jnp.asarray(pos[None]), jnp.asarray(pos[None]), jnp.asarray(valid[None]),
                      jnp.asarray(seg[None]), jnp.asarray(seg[None]))
    q, k, v = _qkv(rng, 1, t, t, 8, 2)
    _assert_parity(q, k, v, spec, mask, block_k=6)


@pytest.mark.parametrize("hq,hkv,block_k", [(8, 2, 16), (6, 1, 5), (4, 4, 64)])
def test_cache_continuation_with_holes(hq, hkv, block_k):
    """T new tokens over a cache of S slots with invalid slots in the middle and unwritten ones at the end."""
    rng = np.random.default_rng(hq + block_k)
    b, s, t, idx = 2, 41, 9, 30
    cache_valid = np.ones((b, s), bool)
    cache_valid[0, 10:17] = False  # holes
    cache_valid[1, :4] = False
    cache_valid[1, 20] = False
    seen = cache_valid & (np.arange(s)[None] < idx)
    new_valid = np.ones((b, t), bool)
    new_valid[1, :3] = False  # left-padded segment
    mask = np.zeros((b, t, s + t), bool)
    for r in range(b):
        for i in range(t):
            mask[r, i, :s] = seen[r]
            for j in range(i + 1):
                mask[r, i, s + j] = new_valid[r, j]
    q, k, v = _qkv(rng, b, t, s + t, hq, hkv)

    def reference(q, k, v):  # the einsum's cache form (cache and new keys apart), reading up to the index
        nm = jnp.asarray(mask[:, :, s:])
        return cached_attention(q, k[:, :, :s], v[:, :, :s], jnp.asarray(seen), k[:, :, s:].swapaxes(1, 2),
                                v[:, :, s:].swapaxes(1, 2), nm, bound=jnp.int32(idx), block=8)

    spec = cache_spec(jnp.asarray(seen), jnp.asarray(new_valid))
    _assert_parity(q, k, v, spec, mask, block_k, reference=reference)


def test_resolve_auto_kernels_env_and_log_once(monkeypatch, caplog):
    monkeypatch.delenv(A.ENV_VAR, raising=False)
    monkeypatch.setattr(A, "_gpu_capability", lambda: (9, 0))  # a CUDA GPU as far as `resolve` knows
    assert A.resolve("auto", "cpu", 256, 320, jnp.float32, self_attn=True)[0] == "einsum"
    assert A.resolve("auto", "cpu", 1024, 1024, jnp.float32, self_attn=True)[0] == "blockwise"
    assert A.resolve("auto", "gpu", 1024, 1024, jnp.float32, self_attn=True) == (
        "blockwise", "cuDNN flash attention needs bf16/fp16, got float32")
    assert A.resolve("auto", "gpu", 1024, 1024, jnp.bfloat16, self_attn=True, head_dim=128)[0] == "cudnn"
    assert A.resolve("cudnn", "gpu", 1024, 1024, jnp.bfloat16, self_attn=True, head_dim=100) == (
        "blockwise", "cuDNN flash attention needs a head dim <= 256 and a multiple of 8, got 100")
    if A._pallas_flash() is not None:
        assert A.resolve("pallas", "tpu", 1000, 1000, jnp.bfloat16, self_attn=True)[1] == \
            "sequence length 1000 is not a multiple of 128"
    assert A.resolve("cudnn", "gpu", 1024, 2048, jnp.bfloat16, self_attn=False)[0] == "blockwise"
    A._LOGGED.clear()
    with caplog.at_level(logging.INFO, logger=A.__name__):
        for _ in range(3):
            assert A.resolve("cudnn", "gpu", 64, 64, jnp.float32, self_attn=True)[0] == "blockwise"
    assert [r.getMessage() for r in caplog.records] == [
        "attention cudnn: falls back to blockwise: cuDNN flash attention needs bf16/fp16, got float32"]


def test_an_impossible_explicit_kernel_is_an_error_and_auto_skips_it(monkeypatch):
    """A kernel the process cannot run (another backend, no CUDA GPU) raises when named, never a silent
    blockwise; `auto` runs blockwise in its place. `attend` itself runs no try/except."""
    monkeypatch.delenv(A.ENV_VAR, raising=False)
    with pytest.raises(A.AttentionError, match="attention 'pallas' cannot run in this process: pallas needs "
                                               "backend tpu, running on cpu"):
        A.resolve("pallas", "cpu", 256, 256, jnp.bfloat16, self_attn=True)
    monkeypatch.setattr(A, "_gpu_capability", lambda: None)
    with pytest.raises(A.AttentionError, match="cuDNN flash attention needs a CUDA GPU"):
        A.resolve("cudnn", "gpu", 256, 256, jnp.bfloat16, self_attn=True)
    assert A.resolve("auto", "gpu", 1024, 1024, jnp.bfloat16, self_attn=True)[0] == "blockwise"
    q, k, v = _qkv(np.random.default_rng(0), 1, 8, 8, 2, 1)
    spec = A.causal_spec(jnp.ones((1, 8), bool))
    if jax.default_backend() == "cpu":
        with pytest.raises(A.AttentionError, match="needs backend"):
            A.attend(q, k, v, spec, impl="pallas", self_attn=True)
    import inspect
    assert "except" not in inspect.getsource(A.attend)


def test_the_environment_variable_overrides_with_a_warning_and_is_recorded(monkeypatch, caplog):
    monkeypatch.delenv(A.ENV_VAR, raising=False)
    assert A.record("einsum") == {"attention": "einsum", "attention_effective": "einsum", "attention_env": None}
    monkeypatch.setenv(A.ENV_VAR, "blockwise")
    A._LOGGED.clear()
    with caplog.at_level(logging.INFO, logger=A.__name__):
        for _ in range(2):
            assert A.resolve("einsum", "cpu", 8, 8, jnp.float32, self_attn=True)[0] == "blockwise"
        assert A.resolve("blockwise", "cpu", 8, 8, jnp.float32, self_attn=True)[0] == "blockwise"  # no override
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "attention blockwise: JAXRL_MT_ATTENTION=blockwise overrides the configured attention 'einsum'")]
    assert A.record("einsum") == {"attention": "einsum", "attention_effective": "blockwise",
                                  "attention_env": "blockwise"}
    monkeypatch.setenv(A.ENV_VAR, "flash")
    with pytest.raises(A.AttentionError, match="environment variable JAXRL_MT_ATTENTION='flash': expected one of"):
        A.resolve("auto", "cpu", 8, 8, jnp.float32, self_attn=True)
    monkeypatch.delenv(A.ENV_VAR)
    with pytest.raises(ValueError, match="attention must be one of"):
        A.resolve("flash", "cpu", 8, 8, jnp.float32, self_attn=True)


def test_decoder_and_grouped_forward_blockwise_equal_einsum():
    """Whole tiny model: logits of a left-padded batch and a cached continuation, values and grads."""
    from jaxrl_mt.scoring import grouped_logprobs

    cfg_e, cfg_b = LLAMA.replace(attention="einsum"), LLAMA.replace(attention="blockwise", attention_block=5)
    params = init_params(LLAMA, jax.random.PRNGKey(0), scale=0.3)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 61, size=(3, 23)))
    tm = jnp.asarray(np.arange(23)[None] >= np.array([[0], [4], [11]]))
    pos = positions_from_mask(tm)
    le = forward(params, cfg_e, tokens, pos, tm)[0]
    lb = forward(params, cfg_b, tokens, pos, tm)[0]
    # logits up to ~5 in size after 3 random layers: summation order moves them by ~1e-5
    np.testing.assert_allclose(np.asarray(lb)[np.asarray(tm)], np.asarray(le)[np.asarray(tm)], atol=1e-5, rtol=1e-5)

    pm = tm[:, :13]
    sm = jnp.asarray(np.arange(10)[None] < np.array([[10], [3], [7], [1], [10], [6]]))
    st = tokens[:, 13:].repeat(2, axis=0)
    w = jnp.asarray(rng.normal(size=sm.shape), jnp.float32)

    def loss(p, cfg):
        return jnp.sum(w * grouped_logprobs(p, cfg, tokens[:, :13], pm, st, sm)[0])

    assert abs(float(loss(params, cfg_b)) - float(loss(params, cfg_e))) < 1e-4
    ge, gb = jax.grad(loss)(params, cfg_e), jax.grad(loss)(params, cfg_b)
    for a, b in zip(jax.tree_util.tree_leaves(gb), jax.tree_util.tree_leaves(ge)):
        assert float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))) < 1e-4


def test_embedded_model_logits_and_greedy_tokens_blockwise_equal_einsum(embedded_model):
    m = embedded_model
    cfg_e, cfg_b = m.cfg.replace(attention="einsum"), m.cfg.replace(attention="blockwise", attention_block=16)
    prompts = [m.tokenizer.encode("The capital of France is"),
               m.tokenizer.encode("Once upon a time, in a small village by the sea, there lived")]
    t = max(len(p) for p in prompts)
    tokens = jnp.asarray([[0] * (t - len(p)) + p for p in prompts])
    tm = jnp.asarray([[False] * (t - len(p)) + [True] * len(p) for p in prompts])
    le = forward(m.params, cfg_e, tokens, positions_from_mask(tm), tm)[0]
    lb = forward(m.params, cfg_b, tokens, positions_from_mask(tm), tm)[0]
    # 30 layers of fp32 summation-order differences (measured max 5.3e-5 on logits up to ~20;
    # the model's parity with transformers is 1e-3): 2e-4, against logit gaps of O(1)
    np.testing.assert_allclose(np.asarray(lb)[np.asarray(tm)], np.asarray(le)[np.asarray(tm)], atol=2e-4, rtol=0)
    sc = SamplingConfig(max_new_tokens=12, temperature=0.0)
    out_e = Sampler.from_model(dataclasses.replace(m, cfg=cfg_e)).generate_ids(prompts, sc).tokens
    out_b = Sampler.from_model(dataclasses.replace(m, cfg=cfg_b)).generate_ids(prompts, sc).tokens
    assert out_b == out_e and sum(len(x) for x in out_e) >= 12


@pytest.mark.parametrize("kernel", ["pallas", "cudnn"])
def test_kernel_wrappers_masks_on_cpu(kernel):
    """The kernels' arguments (segment ids / mask, causal flag, GQA repeat, scale, layouts) through
    their pure-JAX twins (flash_attention's mha_reference, dot_product_attention via XLA): real
    query rows equal the einsum."""
    if kernel == "pallas" and A._pallas_flash() is None:
        pytest.skip("jax.experimental.pallas.ops.tpu is not importable")
    rng = np.random.default_rng(3)
    t = 37
    q, k, v = _qkv(rng, 2, t, t, 8, 2)
    valid = np.arange(t)[None] >= np.array([[0], [9]])  # left padding
    spec = A.causal_spec(jnp.asarray(valid))
    if kernel == "pallas":
        out = A._pallas_attention(q, k, v, spec, reference=True)
    else:
        out = A._cudnn_attention(q, k, v, spec, implementation="xla")
    want = A.einsum_attention(q, k.swapaxes(1, 2), v.swapaxes(1, 2), jnp.asarray(_causal_mask(valid)))
    assert np.all(np.isfinite(np.asarray(out)))
    np.testing.assert_allclose(np.asarray(out)[valid], np.asarray(want)[valid], atol=1e-5, rtol=0)


def test_cudnn_rolled_rows_and_the_blockwise_branch_equal_einsum_on_cpu():
    """The cuDNN wrapper through dot_product_attention's XLA twin: rows with left, right and
    both-sided padding (the rolled branch) and a batch with a hole (the blockwise branch) give the
    einsum's real query rows and gradients; pad queries' outputs are zeros in the rolled branch."""
    rng = np.random.default_rng(5)
    t = 41
    q, k, v = _qkv(rng, 3, t, t, 8, 2)
    ar = np.arange(t)[None]
    w = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
    one = (ar >= np.array([[0], [9], [4]])) & (ar < np.array([[t], [t], [30]]))  # none, left, both
    holed = one.copy()
    holed[0, 20] = False
    for valid, contiguous in ((one, True), (holed, False)):
        assert bool(A.one_run(jnp.asarray(valid))) is contiguous
        spec = A.causal_spec(jnp.asarray(valid))
        real = jnp.asarray(valid)[:, :, None, None]

        def f(fn, q, k, v, real=real):
            out = fn(q, k, v)
            return jnp.sum(jnp.where(real, out * w, 0.0)), out

        kernel = lambda q, k, v, spec=spec: A._cudnn_attention(q, k, v, spec, implementation="xla")  # noqa: E731
        dense = lambda q, k, v, m=valid: A.einsum_attention(  # noqa: E731
            q, k.swapaxes(1, 2), v.swapaxes(1, 2), jnp.asarray(_causal_mask(m)))
        (_, out), g = jax.value_and_grad(functools.partial(f, kernel), argnums=(0, 1, 2), has_aux=True)(q, k, v)
        (_, want), g_want = jax.value_and_grad(functools.partial(f, dense), argnums=(0, 1, 2), has_aux=True)(q, k, v)
        assert np.all(np.isfinite(np.asarray(out)))
        np.testing.assert_allclose(np.asarray(out)[valid], np.asarray(want)[valid], atol=1e-5, rtol=0)
        if contiguous:
            assert np.all(np.asarray(out)[~valid] == 0)
        for a, b in zip(g, g_want):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("impl", ["einsum", "blockwise"])
def test_fresh_prefill_equals_the_general_cached_path(impl):
    """`forward(..., fresh=True)` (self-attention over the new tokens only) into an empty cache
    gives the general path's logits, cache keys/values, validity and index (left padding), and the
    compiled fresh program has no [T, S + T] attention: its temp bytes are smaller at 96 tokens."""
    from jaxrl_mt.models.decoder import init_cache

    cfg = LLAMA.replace(attention=impl, attention_block=16)
    params = init_params(cfg, jax.random.PRNGKey(0))
    t = 96
    valid = jnp.asarray(np.arange(t)[None] >= np.array([[0], [23]]))
    tokens = jnp.asarray(np.random.default_rng(1).integers(3, cfg.vocab_size, (2, t)), jnp.int32)

    def run(fresh):
        def f(p, tok, m):
            cache = init_cache(cfg, 2, t + 8)
            return forward(p, cfg, tok, positions_from_mask(m), m, cache, logits="all", fresh=fresh)
        return jax.jit(f)

    outs = [run(fr)(params, tokens, valid) for fr in (False, True)]
    (lg0, _, c0), (lg1, _, c1) = outs
    real = np.asarray(valid)
    np.testing.assert_allclose(np.asarray(lg1)[real], np.asarray(lg0)[real], atol=2e-5, rtol=0)
    for a, b in ((c1.k, c0.k), (c1.v, c0.v)):
        a, b = (np.moveaxis(np.asarray(x), 3, 2)[:, :, :t] for x in (a, b))  # [L, B, T, Hkv, K]
        np.testing.assert_allclose(a[:, real], b[:, real], atol=2e-5, rtol=0)
    np.testing.assert_array_equal(np.asarray(c1.valid), np.asarray(c0.valid))
    assert int(c1.index) == int(c0.index) == t
    temps = [run(fr).lower(params, tokens, valid).compile().memory_analysis().temp_size_in_bytes
             for fr in (False, True)]
    assert temps[1] < temps[0], temps
