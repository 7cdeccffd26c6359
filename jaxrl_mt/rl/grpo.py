"""GRPO math: group-relative advantages, per-token KL estimators and the clipped surrogate loss.

Pure, jittable functions of arrays; nothing here knows about models, tokenizers or optimizers
(the masked mean is the scorer's ``masked_mean``).
The formulas follow TRL 1.16's ``GRPOTrainer`` (``_generate_and_score_completions`` for the
advantages, ``_compute_loss`` for the loss and its logged metrics) with token-level importance
sampling, which is TRL's default:

* advantages: ``(r - mean_group(r)) / (std_group(r) + 1e-4)`` where ``std`` is TRL's ``nanstd``,
  i.e. the *unbiased* (Bessel-corrected, ``G - 1`` denominator) standard deviation.
* ratio ``coef_1 = exp(logp - old_logp)``, ``coef_2 = clip(coef_1, 1 - eps_low, 1 + eps_high)``,
  per-token loss ``-min(coef_1 * A, coef_2 * A) + beta * kl``.
* aggregation by ``loss_type`` (``grpo``, ``bnpo``/``token_mean``, ``dr_grpo``, and TRL 0.25's
  default ``dapo``: the token sum over the completion tokens of the whole step's batch).
* ``loss_variant`` ``clip_cov`` / ``kl_cov``: the covariance-based token selection of Cui et al. 2025
  ("The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"), as verl's
  ``compute_policy_loss_clip_cov`` / ``compute_policy_loss_kl_cov`` (see :mod:`jaxrl_mt.rl.cov`).

One deliberate difference: TRL divides the loss by the number of gradient-accumulation steps
because torch accumulates by summing gradients. Here accumulation is ``optax.MultiSteps``, which
averages gradients, so the loss is returned unscaled.

Shapes: ``N`` completions (``B`` prompts times ``G`` generations per prompt, consecutive groups
of ``G``), ``T`` completion tokens per row (right-padded, ``mask`` marks the real ones).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_mt.rl.cov import DEFAULT_COV, LOSS_VARIANTS, CovConfig, clip_cov_select, kl_cov_select
from jaxrl_mt.scoring import masked_mean

KL_ESTIMATORS = ("k1", "k3")
LOSS_TYPES = ("grpo", "bnpo", "token_mean", "dr_grpo", "dapo")


def group_advantages(
    rewards: jax.Array,
    group_size: int,
    scale_rewards: bool = True,
    eps: float = 1e-4,
) -> jax.Array:
    """Group-relative advantages, as TRL's ``scale_rewards="group"`` (or ``"none"``).

    Args:
      rewards: ``[N]`` scalar reward per completion, ``N = B * group_size``; rows
        ``[g * group_size, (g + 1) * group_size)`` are the generations of prompt ``g``.
      group_size: ``G``, generations per prompt.
      scale_rewards: divide by the group's standard deviation (plus ``eps``).
      eps: added to the standard deviation before dividing (TRL: ``1e-4``).

    Returns:
      ``[N]`` advantages ``r - mean_group``, divided by ``std_group + eps`` when
      ``scale_rewards``. The std is unbiased (``ddof=1``), as TRL's ``nanstd``; a group of size
      1 has std 0 here (TRL's eval path uses zeros too), so its advantage is 0.

    Raises:
      ValueError: if ``rewards`` is not 1-D or its length is not a multiple of ``group_size``.
    """
    if rewards.ndim != 1:
        raise ValueError(f"group_advantages: rewards must be 1-D [N], got shape {rewards.shape}")
    if group_size < 1 or rewards.shape[0] % group_size != 0:
        raise ValueError(
            f"group_advantages: len(rewards)={rewards.shape[0]} is not a multiple of "
            f"group_size={group_size}"
        )
    grouped = rewards.reshape(-1, group_size)  # [B, G]
    mean = jnp.mean(grouped, axis=1, keepdims=True)  # [B, 1]
    advantages = grouped - mean  # [B, G]
    if scale_rewards:
        if group_size > 1:
            std = jnp.std(grouped, axis=1, keepdims=True, ddof=1)  # [B, 1]
        else:
            std = jnp.zeros_like(mean)  # [B, 1]
        advantages = advantages / (std + eps)  # [B, G]
    return advantages.reshape(-1)  # [N]


def frac_zero_std(rewards: jax.Array, group_size: int) -> jax.Array:
    """Share of groups whose rewards are all equal (TRL's logged ``frac_reward_zero_std``).

    Args:
      rewards: ``[N]`` rewards, consecutive groups of ``group_size``.
      group_size: ``G``.

    Returns:
      A scalar in [0, 1]: groups with (numerically) zero standard deviation over all groups. Under
      ``scale_rewards`` such groups give zero advantages; when another reward term varies inside
      them, that term alone sets the group's advantages, whatever its weight.
    """
    grouped = jnp.asarray(rewards).reshape(-1, group_size)  # [B, G]
    std = jnp.std(grouped, axis=1)  # [B]
    return jnp.mean(jnp.isclose(std, 0.0).astype(jnp.float32))


def per_token_kl(logp: jax.Array, ref_logp: jax.Array, estimator: str = "k3") -> jax.Array:
    """Per-token estimate of KL(policy || reference) from sampled-token log-probabilities.

    Args:
      logp: ``[N, T]`` log-probabilities of the sampled tokens under the policy.
      ref_logp: ``[N, T]`` the same under the reference model.
      estimator: ``"k1"`` (``logp - ref_logp``) or ``"k3"``
        (``exp(ref - logp) - (ref - logp) - 1``, TRL's, always >= 0).

    Returns:
      ``[N, T]`` per-token KL estimates (unmasked).

    Raises:
      ValueError: for an unknown estimator.
    """
    if estimator == "k1":
        return logp - ref_logp  # [N, T]
    if estimator == "k3":
        delta = ref_logp - logp  # [N, T]
        return jnp.exp(delta) - delta - 1.0  # [N, T]
    raise ValueError(f"per_token_kl: unknown estimator {estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")


def grpo_loss(
    logp: jax.Array,
    old_logp: jax.Array | None,
    ref_logp: jax.Array | None,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    beta: float = 0.0,
    kl_estimator: str = "k3",
    loss_type: str = "grpo",
    max_completion_length: int | None = None,
    num_items: jax.Array | float | None = None,
    loss_variant: str = "clip",
    cov: CovConfig = DEFAULT_COV,
    key: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The GRPO clipped-surrogate loss (TRL 1.16 ``GRPOTrainer._compute_loss``, token-level IS).

    Args:
      logp: ``[N, T]`` per-token log-probabilities of the completions under the policy being
        trained (differentiate with respect to this).
      old_logp: ``[N, T]`` the same under the policy that sampled them, or ``None`` for the
        on-policy case (``mu = 1``): then ``stop_gradient(logp)`` is used and every ratio is 1.
      ref_logp: ``[N, T]`` the same under the frozen reference model, or ``None``; required when
        ``beta != 0``. When given, the masked mean KL is reported in the metrics.
      advantages: ``[N]`` per-completion advantages (or ``[N, T]`` per-token ones).
      mask: ``[N, T]`` 1 for completion tokens that count, 0 for padding (bool or numeric).
      epsilon_low: lower clip, the ratio is clipped below at ``1 - epsilon_low``.
      epsilon_high: upper clip, the ratio is clipped above at ``1 + epsilon_high``.
      beta: KL penalty coefficient; the per-token loss gets ``+ beta * kl``.
      kl_estimator: ``"k3"`` (TRL's) or ``"k1"``; see :func:`per_token_kl`.
      loss_type: how per-token losses are aggregated:
        ``"grpo"``: mean over sequences of ``sum_t(loss * mask) / max(sum_t mask, 1)``;
        ``"bnpo"`` / ``"token_mean"``: ``sum(loss * mask) / max(sum(mask), 1)``;
        ``"dr_grpo"``: ``sum(loss * mask) / (N * max_completion_length)``;
        ``"dapo"`` (TRL 0.25's default): ``sum(loss * mask) / num_items``.
      max_completion_length: the ``dr_grpo`` constant; defaults to ``T``.
      num_items: the ``dapo`` normaliser: the completion tokens of the whole step's batch (every
        micro-batch, every process) divided by the number of micro-batches, so that the average
        of the micro-batch gradients (``optax.MultiSteps``) is the gradient of the token mean
        over the whole batch, as TRL's ``num_items_in_batch``; defaults to ``sum(mask)`` (one
        micro-batch: then ``dapo`` equals ``bnpo``).
      loss_variant: ``"clip"`` (the above), ``"clip_cov"`` or ``"kl_cov"`` (:mod:`jaxrl_mt.rl.cov`).
      cov: the Clip-Cov / KL-Cov settings (published defaults).
      key: PRNG key of Clip-Cov's random choice among the candidate tokens (required for it).

    Returns:
      ``(loss, metrics)``: the scalar loss and a dict of scalars: ``kl`` (masked mean KL, only
      when ``ref_logp`` is given), ``clip_ratio/low_mean``, ``clip_ratio/high_mean``,
      ``clip_ratio/region_mean`` (masked token fractions where the lower / upper clip is active,
      i.e. ratio below ``1 - eps_low`` with A < 0, above ``1 + eps_high`` with A > 0, either),
      ``ratio_mean`` (masked mean ratio); with a Cov variant also ``cov/selected_frac``.

    Raises:
      ValueError: for an unknown ``loss_type``, ``kl_estimator`` or ``loss_variant``, mismatched
        shapes, ``beta != 0`` without ``ref_logp``, or ``clip_cov`` without ``key``.
    """
    _check_inputs(logp, old_logp, ref_logp, advantages, mask, beta, kl_estimator, loss_type)
    _check_variant(loss_variant, key)
    mask = mask.astype(logp.dtype)  # [N, T]
    adv = advantages[:, None] if advantages.ndim == 1 else advantages  # [N, 1] or [N, T]
    if old_logp is None:
        old_logp = jax.lax.stop_gradient(logp)  # [N, T]
    coef_1 = jnp.exp(logp - old_logp)  # [N, T] importance ratio
    metrics: dict[str, jax.Array] = {}
    per_token_loss = _policy_term(logp, old_logp, coef_1, adv, mask, epsilon_low, epsilon_high, loss_variant, cov,
                                  key, metrics)  # [N, T]
    if ref_logp is not None:
        kl = per_token_kl(logp, ref_logp, kl_estimator)  # [N, T]
        metrics["kl"] = masked_mean(kl, mask)
        if beta != 0.0:
            per_token_loss = per_token_loss + beta * kl  # [N, T]

    loss = _aggregate(per_token_loss, mask, loss_type, max_completion_length, num_items)
    metrics.update(_clip_metrics(coef_1, adv, mask, epsilon_low, epsilon_high))
    metrics = {k: jax.lax.stop_gradient(v) for k, v in metrics.items()}
    return loss, metrics


def _policy_term(logp: jax.Array, old_logp: jax.Array, coef_1: jax.Array, adv: jax.Array, mask: jax.Array,
                 epsilon_low: float, epsilon_high: float, loss_variant: str, cov: CovConfig, key: jax.Array | None,
                 metrics: dict[str, jax.Array]) -> jax.Array:
    """Per-token policy loss [N, T] of ``loss_variant`` (records ``cov/selected_frac`` in ``metrics``).

    ``clip``: ``-min(coef_1 A, clip(coef_1) A)``. ``clip_cov``: the same, times 0 on the selected
    tokens (their gradient is exactly 0; they still count in the aggregation's denominator, as
    verl's ``* corr``). ``kl_cov``: the unclipped ``-coef_1 A`` plus ``ppo_kl_coef |logp - old_logp|``
    on the selected tokens (verl applies no ratio clip in KL-Cov). ``jnp.abs``' gradient at 0 is 1,
    torch's 0: on-policy (``d = 0``) it would push every selected token, so ``d * sign(d)`` is used.
    """
    if loss_variant == "kl_cov":
        sel = kl_cov_select(logp, adv, mask, cov.kl_cov_ratio)  # [N, T] bool
        metrics["cov/selected_frac"] = masked_mean(sel.astype(logp.dtype), mask)
        d = logp - old_logp  # [N, T]; |d| as d * sign(d): gradient sign(d), 0 at d = 0 as torch's abs
        return -coef_1 * adv + jnp.where(sel, cov.ppo_kl_coef * d * jax.lax.stop_gradient(jnp.sign(d)), 0.0)
    coef_2 = jnp.clip(coef_1, 1.0 - epsilon_low, 1.0 + epsilon_high)  # [N, T]
    per_token_loss = -jnp.minimum(coef_1 * adv, coef_2 * adv)  # [N, T]
    if loss_variant == "clip_cov":
        clipped = -coef_2 * adv > -coef_1 * adv  # [N, T] verl's clip_by_origin: the clipped branch is active
        sel = clip_cov_select(logp, adv, mask, clipped, cov, key)  # [N, T] bool
        metrics["cov/selected_frac"] = masked_mean(sel.astype(logp.dtype), mask)
        per_token_loss = jnp.where(sel, 0.0, per_token_loss)  # [N, T]
    return per_token_loss


def _aggregate(per_token_loss: jax.Array, mask: jax.Array, loss_type: str, max_completion_length: int | None,
               num_items: jax.Array | float | None) -> jax.Array:
    """The scalar loss from per-token losses [N, T] by ``loss_type`` (see :func:`grpo_loss`)."""
    if loss_type == "grpo":
        return jnp.mean(masked_mean(per_token_loss, mask, axis=-1))  # mean over sequences of [N] means
    if loss_type in ("bnpo", "token_mean"):
        return masked_mean(per_token_loss, mask)
    if loss_type == "dapo":
        return jnp.sum(per_token_loss * mask) / (jnp.maximum(jnp.sum(mask), 1.0) if num_items is None else num_items)
    length = per_token_loss.shape[1] if max_completion_length is None else max_completion_length  # dr_grpo
    return jnp.sum(per_token_loss * mask) / (per_token_loss.shape[0] * length)


def _check_inputs(logp: jax.Array, old_logp: jax.Array | None, ref_logp: jax.Array | None, advantages: jax.Array,
                  mask: jax.Array, beta: float, kl_estimator: str, loss_type: str) -> None:
    """Raises ValueError (naming the argument) for what `grpo_loss` cannot take."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"grpo_loss: unknown loss_type {loss_type!r}; valid: {', '.join(LOSS_TYPES)}")
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"grpo_loss: unknown kl_estimator {kl_estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")
    if logp.ndim != 2 or mask.shape != logp.shape:
        raise ValueError(f"grpo_loss: logp {logp.shape} and mask {mask.shape} must both be [N, T]")
    for name, other in (("old_logp", old_logp), ("ref_logp", ref_logp)):
        if other is not None and other.shape != logp.shape:
            raise ValueError(f"grpo_loss: {name} has shape {other.shape}, logp has {logp.shape}")
    if advantages.shape not in ((logp.shape[0],), logp.shape):
        raise ValueError(f"grpo_loss: advantages has shape {advantages.shape}, expected [{logp.shape[0]}] or "
                         f"{logp.shape}")
    if beta != 0.0 and ref_logp is None:
        raise ValueError(f"grpo_loss: beta={beta} needs ref_logp (got None)")


def _check_variant(loss_variant: str, key: jax.Array | None) -> None:
    """Raises ValueError for an unknown ``loss_variant`` or ``clip_cov`` without a PRNG key."""
    if loss_variant not in LOSS_VARIANTS:
        raise ValueError(f"grpo_loss: unknown loss_variant {loss_variant!r}; valid: {', '.join(LOSS_VARIANTS)}")
    if loss_variant == "clip_cov" and key is None:
        raise ValueError("grpo_loss: loss_variant 'clip_cov' needs key (its random choice of tokens), got None")


def _clip_metrics(coef_1: jax.Array, adv: jax.Array, mask: jax.Array, epsilon_low: float, epsilon_high: float
                  ) -> dict[str, jax.Array]:
    """Masked fractions of tokens where the lower / upper clip is active, and the mean ratio."""
    is_low = ((coef_1 < 1.0 - epsilon_low) & (adv < 0)).astype(coef_1.dtype)  # [N, T]
    is_high = ((coef_1 > 1.0 + epsilon_high) & (adv > 0)).astype(coef_1.dtype)  # [N, T]
    return {"clip_ratio/low_mean": masked_mean(is_low, mask), "clip_ratio/high_mean": masked_mean(is_high, mask),
            "clip_ratio/region_mean": masked_mean(jnp.maximum(is_low, is_high), mask),
            "ratio_mean": masked_mean(jax.lax.stop_gradient(coef_1), mask)}
