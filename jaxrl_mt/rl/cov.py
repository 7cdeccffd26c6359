"""Clip-Cov and KL-Cov: covariance-based token selection for the GRPO loss (``rl.loss_variant``).

From Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", as verl implements them (``verl/trainer/ppo/core_algos.py``,
``compute_policy_loss_clip_cov`` and ``compute_policy_loss_kl_cov``, adapted from the authors'
``PRIME-RL/Entropy-Mechanism-of-RL``). Each valid token i gets the centred covariance

    cov_i = (A_i - mean(A)) * (logp_i - mean(logp)),

means over the valid (mask) tokens of the batch the loss is given (a micro-batch under gradient
accumulation, as verl computes it per micro-batch), ``A_i`` the advantage broadcast to its tokens
(so ``mean(A)`` is token-weighted), ``logp`` detached.

* Clip-Cov: candidates are valid tokens with ``clip_cov_lb < cov < clip_cov_ub`` whose PPO clip
  is not already active (verl's ``clip_by_origin`` excluded); ``max(floor(clip_cov_ratio * n), 1)``
  of them (n = valid tokens), chosen uniformly at random, are detached: their per-token loss is
  multiplied by 0 (they stay in the aggregation's denominator).
* KL-Cov: the ``max(floor(kl_cov_ratio * n), 1)`` valid tokens with the largest cov get
  ``ppo_kl_coef * |logp - old_logp|`` added to their (unclipped) per-token loss.

Defaults (:class:`CovConfig`) are the paper's Qwen2.5-7B recipe, which is also verl's
``recipe/entropy`` scripts (``7b_clip_cov.sh`` / ``7b_kl_cov.sh``): ``clip_cov_ratio = 2e-4``,
``clip_cov_lb = 1``, ``clip_cov_ub = 5``, ``kl_cov_ratio = 2e-3``, ``ppo_kl_coef = 1``. verl's
generic fall-backs differ for KL-Cov (``kl_cov_ratio`` 2e-4, the paper's 32B value) and its
trainer yaml's ``ppo_kl_coef`` (0.1). With ``mu = 1`` and no old log-probs (on-policy), ``|logp -
old_logp|`` is 0 with zero gradient, so KL-Cov then adds nothing: it acts through off-policy
updates (``mu > 1`` or several micro-steps per rollout, as verl's mini-batches).

Two deliberate differences, both only in which equal-ranked tokens are picked: Clip-Cov's random
choice is ``jax.random`` (verl: ``torch.randperm``), and KL-Cov breaks ties in cov by the lower
flat index (``torch.topk`` leaves ties unspecified). The counts are computed in float32
(``floor(ratio * n)``), verl in float64.

Shapes: ``N`` rows, ``T`` completion tokens per row; everything is jittable (the counts are traced).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxrl_mt.scoring import masked_mean

LOSS_VARIANTS = ("clip", "clip_cov", "kl_cov")


@dataclasses.dataclass(frozen=True)
class CovConfig:
    """Clip-Cov / KL-Cov settings (hashable: part of a jit cache key); defaults as the paper's 7B runs."""

    clip_cov_ratio: float = 2e-4  # Clip-Cov: fraction of valid tokens detached
    clip_cov_lb: float = 1.0  # Clip-Cov: candidates have cov > lb
    clip_cov_ub: float = 5.0  # Clip-Cov: candidates have cov < ub
    kl_cov_ratio: float = 2e-3  # KL-Cov: fraction of valid tokens (largest cov) penalised
    ppo_kl_coef: float = 1.0  # KL-Cov: coefficient of |logp - old_logp|


DEFAULT_COV = CovConfig()


def token_covariance(logp: jax.Array, advantages: jax.Array, mask: jax.Array) -> jax.Array:
    """Centred per-token covariance of log-prob and advantage over the valid tokens.

    Args:
      logp: ``[N, T]`` policy log-probs of the sampled tokens (detached here).
      advantages: ``[N]``, ``[N, 1]`` or ``[N, T]`` advantages (broadcast over the tokens).
      mask: ``[N, T]`` 1 / True on valid tokens.

    Returns:
      ``[N, T]`` ``(A - mean_valid(A)) * (logp - mean_valid(logp))`` (values on pads are meaningless).
    """
    lp = jax.lax.stop_gradient(logp)
    m = mask.astype(lp.dtype)
    adv = jnp.broadcast_to(advantages[:, None] if advantages.ndim == 1 else advantages, lp.shape)
    adv = jax.lax.stop_gradient(adv).astype(lp.dtype)
    return (adv - masked_mean(adv, m)) * (lp - masked_mean(lp, m))


def selection_count(mask: jax.Array, ratio: float) -> jax.Array:
    """``max(floor(ratio * n_valid), 1)``: how many tokens a Cov variant selects (int32 scalar)."""
    n = jnp.sum(mask.astype(jnp.float32))
    return jnp.maximum(jnp.floor(ratio * n), 1.0).astype(jnp.int32)


def top_k_mask(score: jax.Array, eligible: jax.Array, k: jax.Array | int) -> jax.Array:
    """The ``k`` eligible entries of largest ``score`` (ties: lower flat index first).

    Args:
      score: ``[N, T]`` scores.
      eligible: ``[N, T]`` bool, the entries that may be chosen.
      k: how many (traced or static); fewer when fewer are eligible.

    Returns:
      ``[N, T]`` bool, True on the chosen entries.
    """
    flat = jnp.where(eligible, score, -jnp.inf).reshape(-1)  # [N * T]
    order = jnp.argsort(-flat, stable=True)  # descending score, ties by index
    rank = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
    return (rank < k).reshape(score.shape) & eligible


def clip_cov_select(logp: jax.Array, advantages: jax.Array, mask: jax.Array, clipped: jax.Array, cov: CovConfig,
                    key: jax.Array) -> jax.Array:
    """Clip-Cov's detached tokens: a random ``selection_count`` of the candidates.

    Args:
      logp: ``[N, T]`` policy log-probs.
      advantages: ``[N]`` or ``[N, T]`` advantages.
      mask: ``[N, T]`` valid tokens.
      clipped: ``[N, T]`` bool, tokens whose PPO clip is active (never candidates).
      cov: the settings (``clip_cov_ratio``, ``clip_cov_lb``, ``clip_cov_ub``).
      key: PRNG key of the uniform choice among the candidates.

    Returns:
      ``[N, T]`` bool, True on the tokens whose loss is detached.
    """
    c = token_covariance(logp, advantages, mask)  # [N, T]
    eligible = (mask > 0) & ~clipped & (c > cov.clip_cov_lb) & (c < cov.clip_cov_ub)  # [N, T]
    u = jax.random.uniform(key, logp.shape)  # [N, T] a random order of the candidates
    return top_k_mask(u, eligible, selection_count(mask, cov.clip_cov_ratio))


def kl_cov_select(logp: jax.Array, advantages: jax.Array, mask: jax.Array, ratio: float) -> jax.Array:
    """KL-Cov's penalised tokens: the ``selection_count(mask, ratio)`` valid tokens of largest cov.

    Args:
      logp: ``[N, T]`` policy log-probs.
      advantages: ``[N]`` or ``[N, T]`` advantages.
      mask: ``[N, T]`` valid tokens.
      ratio: ``kl_cov_ratio``.

    Returns:
      ``[N, T]`` bool, True on the penalised tokens.
    """
    return top_k_mask(token_covariance(logp, advantages, mask), mask > 0, selection_count(mask, ratio))
