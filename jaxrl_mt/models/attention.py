"""Attention with masks built from positions and validity, in one of several implementations.

`attend(q, k, v, spec, impl=...)` is the single entry point of the decoder (`forward`, its cached
continuation and prefill), the grouped forward and therefore the scorer and the GRPO step. The
mask is never passed as a dense [B, T, S] tensor: `MaskSpec` holds query positions [B, T], key
positions [B, S], key validity [B, S] and optional segment ids, and a query t may attend a key s
iff

    kv_valid[s] and kv_pos[s] <= q_pos[t] and (kv_seg[s] == q_seg[t] or kv_seg[s] == 0)

which covers causal self-attention with left or right padding, a cache with holes (cached keys
at position -1, before every new query), and a packed prompt-then-completions row (the prompt
in segment 0, seen by all; completion i in segment i, seen only by itself).

Implementations (`IMPLS`):
  * `einsum`: today's math (fp32 scores [B, Hkv, G, T, S] and probabilities), the mask
    materialised from the spec. Fastest at short lengths, quadratic memory.
  * `blockwise`: online softmax over key blocks of `block_k` (a `lax.scan`; S is padded up to a
    multiple of block_k), under a `jax.custom_vjp` whose backward recomputes each block's scores
    from the saved output and the softmax statistics (max, sum) -- activation memory O(T) per
    layer. Pure JAX: runs on every backend and is the fallback of the kernels.
  * `pallas`: the TPU flash-attention kernel JAX ships (`jax.experimental.pallas.ops.tpu`).
  * `cudnn`: `jax.nn.dot_product_attention(implementation="cudnn")` on GPU, the padding as
    sequence lengths of rows rolled to their first real token (`_cudnn_attention`); a batch
    whose rows are not one contiguous run of real tokens each runs blockwise (decided at run time).
  * `auto`: einsum while T x S < `AUTO_EINSUM_MAX` (today's speed at short lengths), else the
    backend's kernel, else blockwise.

`resolve` is the one selector: it picks the implementation for a call's static shape by capability
checks, never by trying a kernel and catching its failure. A kernel this process cannot run at all
(another backend, not installed: `unavailable`) is an `AttentionError` when chosen explicitly and
skipped by `auto`; a kernel that cannot serve one call (a cache or segment layout, a length, a
dtype, a head dimension: `_kernel_refusal`) falls back to blockwise with one log line (once per
(impl, reason)) naming why. The environment variable `JAXRL_MT_ATTENTION` overrides the configured
choice (`choice`: one warning per override); `record` is what a run's config file keeps of it.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp

log = logging.getLogger(__name__)

IMPLS = ("auto", "einsum", "blockwise", "pallas", "cudnn")
ENV_VAR = "JAXRL_MT_ATTENTION"
AUTO_EINSUM_MAX = 1024 * 1024  # T x S entries per head below which `auto` keeps the einsum
DEFAULT_BLOCK = 512  # keys per block of the blockwise implementation
_NEG = float(jnp.finfo(jnp.float32).min)  # score of a masked key (the einsum's value)
_LOGGED: set[tuple[str, str]] = set()


class MaskSpec(NamedTuple):
    """Which keys each query may attend (see the module docstring for the rule)."""

    q_pos: jax.Array  # [B, T] int: query positions
    kv_pos: jax.Array  # [B, S] int: key positions
    kv_valid: jax.Array  # [B, S] bool: key holds a real token
    q_seg: jax.Array | None = None  # [B, T] int segment ids (None: all 0)
    kv_seg: jax.Array | None = None  # [B, S] int segment ids; 0 = shared (seen by every segment)


def causal_spec(token_mask: jax.Array) -> MaskSpec:
    """Causal self-attention over [B, T] rows, pads (token_mask False) never attended."""
    b, t = token_mask.shape
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None], (b, t))
    return MaskSpec(pos, pos, token_mask.astype(bool))


def dense_mask(spec: MaskSpec) -> jax.Array:
    """The [B, T, S] bool mask the spec describes (for the einsum and as a test reference)."""
    vis = spec.kv_valid[:, None, :] & (spec.kv_pos[:, None, :] <= spec.q_pos[:, :, None])
    if spec.q_seg is not None or spec.kv_seg is not None:
        qs = spec.q_seg if spec.q_seg is not None else jnp.zeros_like(spec.q_pos)
        ks = spec.kv_seg if spec.kv_seg is not None else jnp.zeros_like(spec.kv_pos)
        vis = vis & ((ks[:, None, :] == qs[:, :, None]) | (ks[:, None, :] == 0))
    return vis


class AttentionError(ValueError):
    """An attention choice that cannot run: not one of IMPLS, or a kernel this process lacks."""


def log_once(impl: str, reason: str, *, level: int = logging.INFO) -> None:
    """Logs `reason` once per (impl, reason) for the process."""
    if (impl, reason) not in _LOGGED:
        _LOGGED.add((impl, reason))
        log.log(level, "attention %s: %s", impl, reason)


def choice(impl: str) -> str:
    """The choice in force: `JAXRL_MT_ATTENTION` when set (a warning, once, when it differs from the
    configured `impl`), else `impl`. Raises AttentionError when it is not one of IMPLS."""
    env = os.environ.get(ENV_VAR)
    if env and env not in IMPLS:
        raise AttentionError(f"environment variable {ENV_VAR}={env!r}: expected one of {', '.join(IMPLS)}")
    if impl not in IMPLS:
        raise AttentionError(f"attention must be one of {IMPLS}, got {impl!r}")
    if env and env != impl:
        log_once(env, f"{ENV_VAR}={env} overrides the configured attention {impl!r}", level=logging.WARNING)
    return env or impl


def record(impl: str) -> dict[str, str | None]:
    """What a run's config file keeps of the attention: the configured value, the one in force and
    the environment variable's value (None when unset)."""
    env = os.environ.get(ENV_VAR) or None
    return {"attention": impl, "attention_effective": env or impl, "attention_env": env}


def resolve(impl: str, backend: str, t: int, s: int, dtype: object, *, self_attn: bool,
            segments: bool = False, head_dim: int | None = None) -> tuple[str, str]:
    """The implementation that serves a call, and why (the one selector of the package).

    Args:
      impl: the configured choice (one of IMPLS); the env var JAXRL_MT_ATTENTION overrides it (`choice`).
      backend: `jax.default_backend()` ("cpu", "gpu", "tpu").
      t, s: query and key lengths (static).
      dtype: the compute dtype of q/k/v.
      self_attn: the call is causal self-attention (keys are the queries, positions 0..T-1).
      segments: the spec has segment ids.
      head_dim: the query/key head dimension when known (`attend` passes it; cuDNN bounds it).

    Returns:
      (one of "einsum", "blockwise", "pallas", "cudnn", a one-line reason).

    Raises:
      AttentionError: the choice is not one of IMPLS, or names a kernel this process cannot run
        (`unavailable`: another backend, not installed).
    """
    impl = choice(impl)
    why_auto = ""
    if impl == "auto":
        if t * s < AUTO_EINSUM_MAX:
            return "einsum", f"auto: T*S = {t * s} < {AUTO_EINSUM_MAX}"
        impl = {"tpu": "pallas", "gpu": "cudnn"}.get(backend, "blockwise")
        why_auto = f"auto: T*S = {t * s} on {backend}"
        missing = unavailable(impl, backend) if impl != "blockwise" else ""
        if missing:
            log_once(impl, f"auto runs blockwise: {missing}")
            return "blockwise", missing
    if impl in ("einsum", "blockwise"):
        return impl, why_auto or "configured"
    missing = unavailable(impl, backend)
    if missing:
        raise AttentionError(f"attention {impl!r} cannot run in this process: {missing}")
    why = _kernel_refusal(impl, t, s, dtype, self_attn=self_attn, segments=segments, head_dim=head_dim)
    if why:
        log_once(impl, f"falls back to blockwise: {why}")
        return "blockwise", why
    return impl, why_auto or "configured"


def unavailable(impl: str, backend: str) -> str:
    """Why the kernel `impl` ("pallas" or "cudnn") cannot run in this process at all ("" when it can)."""
    want = {"pallas": "tpu", "cudnn": "gpu"}[impl]
    if backend != want:
        return f"{impl} needs backend {want}, running on {backend}"
    if impl == "pallas" and _pallas_flash() is None:
        return "jax.experimental.pallas.ops.tpu.flash_attention is not importable"
    if impl == "cudnn" and _gpu_capability() is None:
        return "cuDNN flash attention needs a CUDA GPU (no compute capability reported)"
    return ""


def _kernel_refusal(impl: str, t: int, s: int, dtype: object, *, self_attn: bool, segments: bool,
                    head_dim: int | None = None) -> str:
    """Why the (available) kernel `impl` cannot serve the call ("" when it can)."""
    if not self_attn or segments:
        return "only causal self-attention with padding is served (cache / segment layouts are not)"
    if impl == "pallas" and t % 128:
        return f"sequence length {t} is not a multiple of 128"
    if impl == "cudnn":
        if jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
            return f"cuDNN flash attention needs bf16/fp16, got {jnp.dtype(dtype).name}"
        h_max = 256 if (_gpu_capability() or (0, 0)) >= (9, 0) else 128  # jax's check_is_flash_attention
        if head_dim is not None and (head_dim % 8 or head_dim > h_max):
            return f"cuDNN flash attention needs a head dim <= {h_max} and a multiple of 8, got {head_dim}"
    return ""


@functools.cache
def _pallas_flash():
    try:
        from jax.experimental.pallas.ops.tpu import flash_attention as fa
    except ImportError:  # not shipped on this install / platform
        return None
    return fa


@functools.cache
def _gpu_capability() -> tuple[int, ...] | None:
    """The first GPU's CUDA compute capability, e.g. (9, 0); None without a CUDA GPU."""
    try:
        devices = jax.devices("gpu")
    except RuntimeError:  # no GPU backend in this process
        return None
    cc = getattr(devices[0], "compute_capability", None) if devices else None
    return tuple(int(x) for x in str(cc).split(".")[:2]) if cc else None


# ----------------------------------------------------------------------------- einsum


def einsum_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query attention over a dense mask (fp32 scores and probabilities).

    Args:
      q: [B, T, Hq, K] queries; k, v: [B, S, Hkv, K]; mask: [B, T, S] bool, True where a query
        may attend a key.

    Returns:
      [B, T, Hq, K].
    """
    b, t, hq, kd = q.shape
    hkv = k.shape[2]
    qg = q.reshape(b, t, hkv, hq // hkv, kd)  # [B, T, Hkv, G, K]
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32)
    scores = scores / math.sqrt(kd)
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)  # [B, Hkv, G, T, S]
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return out.reshape(b, t, hq, kd)


# ----------------------------------------------------------------------------- blockwise


def _key_blocks(x: jax.Array, axis: int, bk: int, fill: object) -> jax.Array:
    """x with `axis` (length S) padded to nb * bk by `fill` and split into a leading [nb] axis."""
    s = x.shape[axis]
    nb = -(-s // bk)
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, nb * bk - s)
    x = jnp.pad(x, pad, constant_values=fill)
    x = x.reshape(x.shape[:axis] + (nb, bk) + x.shape[axis + 1:])
    return jnp.moveaxis(x, axis, 0)


def _block_scores(qg, kb, scale, qp, qs, kp, kv, ks, real):
    """Scores [B, Hkv, G, T, bk] of one key block (masked: _NEG, block padding: -inf) and the
    visibility [B, T, bk]. The fill values are derived from the scores (min(s, _NEG) = _NEG,
    s - inf = -inf) rather than broadcast constants, which scan partial evaluation would hoist
    out of the layer scan as [B, Hkv, G, T, bk] buffers."""
    s = jnp.einsum("bkgtd,bksd->bkgts", qg, kb, preferred_element_type=jnp.float32) * scale
    same = (ks[:, None, :] == qs[:, :, None]) | (ks[:, None, :] == 0)
    vis = kv[:, None, :] & (kp[:, None, :] <= qp[:, :, None]) & same
    s = jnp.where(vis[:, None, None], s, jnp.minimum(s, _NEG))
    return jnp.where(real[:, None, None, None, :], s, s - jnp.inf), vis


def _blocks_of(k, v, kp, kv, ks, real, bk):
    """Key blocks [nb, ...] of (real-slot flags [B, S] -> [nb, B, bk], k, v, positions, validity, segments)."""
    return (_key_blocks(real, 1, bk, False), _key_blocks(k, 2, bk, 0), _key_blocks(v, 2, bk, 0),
            _key_blocks(kp, 1, bk, 0), _key_blocks(kv, 1, bk, False), _key_blocks(ks, 1, bk, 0))


def _tie(qg, qp, qs, kp, kv, ks):
    """The mask inputs made data-dependent on the queries. Without it the block masks depend only
    on the spec, which is the same in every layer: JAX's scan partial evaluation then hoists their
    computation out of the layer scan and stacks them, [blocks, B, Hkv, G, T, block_k] bools -- the
    full T x S mask per head, quadratic memory (seen with memory_analysis). Also returns the
    [B, S] all-True flags of the real (not block-padding) key slots, tied the same way."""
    return jax.lax.optimization_barrier((qg, qp, qs, kp, kv, ks, jnp.ones(kv.shape, bool)))


def _flash_fwd(qg, k, v, qp, qs, kp, kv, ks, bk):
    """Online softmax: output [B, Hkv, G, T, K] (v.dtype), running max m and sum den [B, Hkv, G, T]."""
    qg, qp, qs, kp, kv, ks, real = _tie(qg, qp, qs, kp, kv, ks)
    scale = 1.0 / math.sqrt(qg.shape[-1])
    b, hkv, g, t, kd = qg.shape
    init = (jnp.full((b, hkv, g, t), -jnp.inf, jnp.float32), jnp.zeros((b, hkv, g, t), jnp.float32),
            jnp.zeros((b, hkv, g, t, kd), jnp.float32))

    def step(carry, xs):
        m, den, acc = carry
        real, kb, vb, kpb, kvb, ksb = xs
        s, _ = _block_scores(qg, kb, scale, qp, qs, kpb, kvb, ksb, real)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        alpha = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new[..., None])
        den = alpha * den + jnp.sum(p, axis=-1)
        pv = jnp.einsum("bkgts,bksd->bkgtd", p.astype(vb.dtype), vb, preferred_element_type=jnp.float32)
        return (m_new, den, alpha[..., None] * acc + pv), None

    (m, den, acc), _ = jax.lax.scan(step, init, _blocks_of(k, v, kp, kv, ks, real, bk))
    return (acc / den[..., None]).astype(v.dtype), m, den


@functools.partial(jax.custom_vjp, nondiff_argnums=(8,))
def _flash(qg, k, v, qp, qs, kp, kv, ks, bk):
    return _flash_fwd(qg, k, v, qp, qs, kp, kv, ks, bk)[0]


def _flash_vjp_fwd(qg, k, v, qp, qs, kp, kv, ks, bk):
    out, m, den = _flash_fwd(qg, k, v, qp, qs, kp, kv, ks, bk)
    return out, (qg, k, v, qp, qs, kp, kv, ks, out, m, den)


def _flash_vjp_bwd(bk, res, g):
    """Recomputes each block's probabilities from (m, den); dS = P * (dP - rowsum(dO * O))."""
    qg, k, v, qp, qs, kp, kv, ks, out, m, den = res
    qg, qp, qs, kp, kv, ks, real = _tie(qg, qp, qs, kp, kv, ks)
    scale = 1.0 / math.sqrt(qg.shape[-1])
    s_len = k.shape[2]
    do = g.astype(jnp.float32)  # [B, Hkv, G, T, K]
    dsum = jnp.sum(do * out.astype(jnp.float32), axis=-1)  # [B, Hkv, G, T]
    qf = qg.astype(jnp.float32)

    def step(dq, xs):
        real, kb, vb, kpb, kvb, ksb = xs
        s, vis = _block_scores(qg, kb, scale, qp, qs, kpb, kvb, ksb, real)
        p = jnp.exp(s - m[..., None]) / den[..., None]  # [B, Hkv, G, T, bk]
        dv = jnp.einsum("bkgts,bkgtd->bksd", p, do)
        dp = jnp.einsum("bkgtd,bksd->bkgts", do, vb.astype(jnp.float32))
        ds = jnp.where(vis[:, None, None], p * (dp - dsum[..., None]), 0.0) * scale
        dq = dq + jnp.einsum("bkgts,bksd->bkgtd", ds, kb.astype(jnp.float32))
        dk = jnp.einsum("bkgts,bkgtd->bksd", ds, qf)
        return dq, (dk, dv)

    dq, (dk, dv) = jax.lax.scan(step, jnp.zeros(qg.shape, jnp.float32), _blocks_of(k, v, kp, kv, ks, real, bk))
    unblock = lambda x: jnp.moveaxis(x, 0, 2).reshape(x.shape[1], x.shape[2], -1, x.shape[-1])[:, :, :s_len]  # noqa: E731
    return (dq.astype(qg.dtype), unblock(dk).astype(k.dtype), unblock(dv).astype(v.dtype),
            None, None, None, None, None)


_flash.defvjp(_flash_vjp_fwd, _flash_vjp_bwd)


def blockwise_attention(q: jax.Array, k: jax.Array, v: jax.Array, spec: MaskSpec, *,
                        block_k: int = DEFAULT_BLOCK) -> jax.Array:
    """Online-softmax attention over key blocks, O(T) activation memory forward and backward.

    Args:
      q: [B, T, Hq, K] queries; k, v: [B, Hkv, S, K] keys/values (head-major, the cache layout).
      spec: the mask; block_k: keys per block (any size: S is padded up to a multiple).

    Returns:
      [B, T, Hq, K] in v's dtype; equal to `einsum_attention` with `dense_mask(spec)`.
    """
    b, t, hq, kd = q.shape
    hkv = k.shape[1]
    qg = q.reshape(b, t, hkv, hq // hkv, kd).transpose(0, 2, 3, 1, 4)  # [B, Hkv, G, T, K]
    qs = spec.q_seg if spec.q_seg is not None else jnp.zeros_like(spec.q_pos)
    ks = spec.kv_seg if spec.kv_seg is not None else jnp.zeros_like(spec.kv_pos)
    bk = max(1, min(int(block_k), k.shape[2]))
    out = _flash(qg, k, v, spec.q_pos.astype(jnp.int32), qs.astype(jnp.int32), spec.kv_pos.astype(jnp.int32),
                 spec.kv_valid.astype(bool), ks.astype(jnp.int32), bk)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, hq, kd)


# ----------------------------------------------------------------------------- kernels and dispatch


def _pallas_attention(q: jax.Array, k: jax.Array, v: jax.Array, spec: MaskSpec, *, reference: bool = False
                      ) -> jax.Array:
    """TPU flash attention (causal self-attention; validity as segment ids: pads see only pads).
    `reference`: the module's pure-JAX `mha_reference` with the same arguments (CPU tests)."""
    fa = _pallas_flash()
    g = q.shape[2] // k.shape[1]
    seg = spec.kv_valid.astype(jnp.int32)  # [B, T]: 1 real, 0 pad
    args = (q.transpose(0, 2, 1, 3), jnp.repeat(k, g, axis=1), jnp.repeat(v, g, axis=1))
    scale = 1.0 / math.sqrt(q.shape[-1])
    if reference:
        out = fa.mha_reference(*args, None, segment_ids=fa.SegmentIds(seg, seg), causal=True, sm_scale=scale)
    else:
        out = fa.flash_attention(*args, segment_ids=fa.SegmentIds(seg, seg), causal=True, sm_scale=scale)
    return out.transpose(0, 2, 1, 3)


def one_run(valid: jax.Array) -> jax.Array:
    """True (a scalar) when every row of `valid` [B, T] holds its real tokens as one contiguous
    run (left and/or right padding; an empty row counts)."""
    t = valid.shape[1]
    start = jnp.argmax(valid, axis=1)[:, None]
    ar = jnp.arange(t)[None]
    return jnp.all(valid == ((ar >= start) & (ar < start + jnp.sum(valid, axis=1, keepdims=True))))


def _cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array, spec: MaskSpec, *, implementation: str = "cudnn",
                     block_k: int = DEFAULT_BLOCK) -> jax.Array:
    """cuDNN flash attention of causal self-attention, the padding passed as sequence lengths.

    Rows whose real tokens form one contiguous run (`one_run`: the scorer's, the train step's and
    the prefill's rows) are rolled so that the first real token comes first, attended with cuDNN's
    causal-padding mask over their count of real tokens -- no T x T mask or bias -- and rolled
    back; pad queries' outputs are zeros. A batch with any other layout runs `blockwise_attention`
    instead, chosen at run time (`lax.cond`), so no layout gives a wrong answer.
    `implementation="xla"`: the same call through XLA (CPU tests).
    """
    t = q.shape[1]
    valid = spec.kv_valid

    def rolled(q, k, v):
        start = jnp.argmax(valid, axis=1).astype(jnp.int32)  # [B] first real token
        n = jnp.maximum(jnp.sum(valid, axis=1), 1).astype(jnp.int32)  # an empty row: one (pad) key
        ar = jnp.arange(t, dtype=jnp.int32)[None]
        idx = (ar + start[:, None]) % t  # rolled slot -> original slot
        roll_q = jnp.take_along_axis(q, idx[:, :, None, None], axis=1)
        roll_k = jnp.take_along_axis(k, idx[:, None, :, None], axis=2).swapaxes(1, 2)
        roll_v = jnp.take_along_axis(v, idx[:, None, :, None], axis=2).swapaxes(1, 2)
        out = jax.nn.dot_product_attention(roll_q, roll_k, roll_v, is_causal=True, query_seq_lengths=n,
                                           key_value_seq_lengths=n, implementation=implementation)
        out = jnp.take_along_axis(out, ((ar - start[:, None]) % t)[:, :, None, None], axis=1)
        return jnp.where(valid[:, :, None, None], out, 0).astype(v.dtype)

    def fallback(q, k, v):
        return blockwise_attention(q, k, v, spec, block_k=block_k)

    return jax.lax.cond(one_run(valid), rolled, fallback, q, k, v)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, spec: MaskSpec, *, impl: str = "auto",
           block_k: int = DEFAULT_BLOCK, self_attn: bool = False) -> jax.Array:
    """Attention of q over head-major k/v under `spec`, by the implementation `resolve` picks.

    Args:
      q: [B, T, Hq, K] queries; k, v: [B, Hkv, S, K] keys/values (Hq a multiple of Hkv).
      spec: the mask (`MaskSpec`).
      impl: one of IMPLS (the env var JAXRL_MT_ATTENTION overrides it); an impossible explicit
        kernel raises AttentionError (`resolve`).
      block_k: keys per block of the blockwise implementation.
      self_attn: causal self-attention (S == T, positions 0..T-1): the kernels can serve it.

    Returns:
      [B, T, Hq, K] in v's dtype.
    """
    segments = spec.q_seg is not None or spec.kv_seg is not None
    chosen, _ = resolve(impl, jax.default_backend(), q.shape[1], k.shape[2], q.dtype, self_attn=self_attn,
                        segments=segments, head_dim=q.shape[-1])
    if chosen == "einsum":
        return einsum_attention(q, k.swapaxes(1, 2), v.swapaxes(1, 2), dense_mask(spec))
    if chosen == "pallas":
        return _pallas_attention(q, k, v, spec).astype(v.dtype)
    if chosen == "cudnn":
        return _cudnn_attention(q, k, v, spec, block_k=block_k)
    return blockwise_attention(q, k, v, spec, block_k=block_k)
