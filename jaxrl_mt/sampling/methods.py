"""How the next token is chosen: the sampling config and the sampling methods of the decode loop.

A method is a small frozen (hashable) object, static under ``jax.jit``: :class:`Greedy`, or
:class:`Categorical` with the top-k and/or top-p filters switched on. The per-row values
(temperature, k, p) are arrays, so a new temperature does not compile a new program; switching a
filter on or off does. Every method returns the sampled token and its log-probability under the
distribution it was sampled from before truncation: log_softmax(logits / temperature) (raw
log_softmax when greedy), i.e. what TRL stores as the "old" log-probs of a GRPO rollout.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How to sample."""

    max_new_tokens: int = 128  # budget of new tokens per row
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # keep the k most likely tokens (0: off)
    top_p: float = 1.0  # nucleus mass (1.0: off)

    def validate(self) -> "SamplingConfig":
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be > 0, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        return self

    def method(self) -> "Greedy | Categorical":
        """The (static) sampling method of this config."""
        if self.temperature == 0:
            return Greedy()
        return Categorical(top_k=self.top_k > 0, top_p=self.top_p < 1.0)

    def row_params(self, rows: int) -> "RowParams":
        """The per-row (dynamic) values of this config for `rows` rows."""
        return RowParams(np.full((rows,), max(self.temperature, 1e-6), np.float32),
                         np.full((rows,), self.top_k, np.int32), np.full((rows,), self.top_p, np.float32))


@flax.struct.dataclass
class RowParams:
    """Per-row sampling values, [B] each (a pytree of arrays: dynamic under jit)."""

    temperature: jax.Array  # > 0 (greedy rows ignore it)
    top_k: jax.Array  # k of the top-k filter
    top_p: jax.Array  # mass of the nucleus filter


def top_k_filter(logits: jax.Array, sorted_desc: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Masks logits [B, V] below each row's k-th largest with the dtype's minimum.

    Returns the filtered logits and the sorted logits [B, V] with the same tokens masked.
    """
    neg = jnp.finfo(logits.dtype).min
    k = jnp.clip(k, 1, logits.shape[-1])
    kth = jnp.take_along_axis(sorted_desc, (k - 1)[:, None], axis=-1)  # [B, 1]
    keep_sorted = jnp.arange(logits.shape[-1])[None] < k[:, None]
    return jnp.where(logits < kth, neg, logits), jnp.where(keep_sorted, sorted_desc, neg)


def top_p_filter(logits: jax.Array, sorted_desc: jax.Array, p: jax.Array) -> jax.Array:
    """Masks logits [B, V] outside each row's nucleus: the smallest top set whose mass reaches p
    (never empty: the most likely token is kept for any p, even one that float32 flushes to 0)."""
    neg = jnp.finfo(logits.dtype).min
    probs = jax.nn.softmax(sorted_desc, axis=-1)
    cum_before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly before each sorted token
    keep = (cum_before < p[:, None]).at[:, 0].set(True)
    cutoff = jnp.min(jnp.where(keep, sorted_desc, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits < cutoff, neg, logits)


def filter_logits(logits: jax.Array, top_k: jax.Array, top_p: jax.Array, use_top_k: bool,
                  use_top_p: bool) -> jax.Array:
    """Masks logits [B, V] outside the top-k set and/or the top-p nucleus (the dtype's minimum)."""
    if not (use_top_k or use_top_p):
        return logits
    sorted_desc = jnp.sort(logits, axis=-1)[:, ::-1]  # [B, V]
    if use_top_k:
        logits, sorted_desc = top_k_filter(logits, sorted_desc, top_k)
    if use_top_p:
        logits = top_p_filter(logits, sorted_desc, top_p)
    return logits


def _picked(logp: jax.Array, tok: jax.Array) -> tuple[jax.Array, jax.Array]:
    return tok.astype(jnp.int32), jnp.take_along_axis(logp, tok[:, None], axis=-1)[:, 0]


@dataclasses.dataclass(frozen=True)
class Greedy:
    """The most likely token; its log-prob under log_softmax(logits)."""

    def __call__(self, logits: jax.Array, key: jax.Array, rows: RowParams) -> tuple[jax.Array, jax.Array]:
        """Next token [B] and its log-prob [B] from fp32 logits [B, V] (`key`: [B] row keys, unused)."""
        del key, rows
        return _picked(jax.nn.log_softmax(logits, axis=-1), jnp.argmax(logits, axis=-1))


@dataclasses.dataclass(frozen=True)
class Categorical:
    """A draw from softmax(logits / temperature), optionally restricted to the top-k and/or top-p set."""

    top_k: bool = False  # apply each row's top-k filter
    top_p: bool = False  # apply each row's nucleus filter

    def __call__(self, logits: jax.Array, key: jax.Array, rows: RowParams) -> tuple[jax.Array, jax.Array]:
        """Next token [B] and its log-prob [B] (before truncation) from fp32 logits [B, V]; `key` holds
        one PRNG key per row ([B]), so a row's draw does not depend on the other rows."""
        scaled = logits / rows.temperature[:, None]
        kept = filter_logits(scaled, rows.top_k, rows.top_p, self.top_k, self.top_p)
        tok = jax.vmap(lambda k, row: jax.random.categorical(k, row))(key, kept)  # one key per row
        return _picked(jax.nn.log_softmax(scaled, axis=-1), tok)
