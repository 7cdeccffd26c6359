"""DPO: the sigmoid preference loss against a frozen reference, and the sequence log-probs it reads.

The loss is TRL's ``DPOTrainer`` with ``loss_type="sigmoid"`` (its default; ``beta`` 0.1,
``label_smoothing`` 0): with ``logits = (pi_c - pi_r) - (ref_c - ref_r)``, the sums of the
completion tokens' log-probs of the chosen (c) and rejected (r) completions under the policy (pi)
and the frozen reference (ref),

    loss = mean(-logsigmoid(beta * logits) * (1 - ls) - logsigmoid(-beta * logits) * ls),

and the logged metrics are TRL's: ``rewards/chosen`` = mean(beta * (pi_c - ref_c)),
``rewards/rejected`` likewise, ``rewards/accuracies`` = mean(chosen reward > rejected reward),
``rewards/margins`` = mean(chosen - rejected reward), ``logps/chosen`` and ``logps/rejected`` (mean
policy log-prob sums). Rewards are detached, as TRL's.

The log-probs come from the project's scorer (``scoring.grouped_logprobs``: each prompt runs
through the model once for its two completions), at temperature 1.

Shapes: ``B`` preference pairs; prompts ``[B, P]`` left-padded, completions ``[B, C]`` right-padded.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mt.batching import pack_rows
from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import Params
from jaxrl_mt.scoring import grouped_logprobs


class PreferenceBatch(NamedTuple):
    """B preference pairs as arrays (a pytree: jit and shard it as any batch)."""

    prompt: jax.Array  # [B, P] left-padded ids
    prompt_mask: jax.Array  # [B, P] bool
    chosen: jax.Array  # [B, C] right-padded ids
    chosen_mask: jax.Array  # [B, C] bool
    rejected: jax.Array  # [B, C] right-padded ids
    rejected_mask: jax.Array  # [B, C] bool
    ref_chosen: jax.Array  # [B] reference log-prob sums of the chosen (0 until computed)
    ref_rejected: jax.Array  # [B] of the rejected

    @property
    def rows(self) -> int:
        """B, the pairs."""
        return int(self.prompt.shape[0])

    def slice_rows(self, start: int, n: int) -> PreferenceBatch:
        """Pairs ``[start, start + n)``."""
        return PreferenceBatch(*(x[start:start + n] for x in self))

    def footprint(self) -> tuple[int, int, int, int]:
        """``(B, 2, P, C)``: each prompt once for its two completions, as the memory planner counts them."""
        return self.rows, 2, int(self.prompt.shape[1]), max(int(self.chosen.shape[1]), int(self.rejected.shape[1]))


def preference_batch(prompts: Sequence[Sequence[int]], chosen: Sequence[Sequence[int]],
                     rejected: Sequence[Sequence[int]], pad_id: int, *, prompt_len: int | None = None,
                     completion_len: int | None = None) -> PreferenceBatch:
    """Packs id lists (``sft_data.encode_target``'s) into a :class:`PreferenceBatch` (reference sums 0).

    Args:
      prompts: ``B`` prompt id lists; chosen, rejected: ``B`` completion id lists each.
      pad_id: the padding id.
      prompt_len: ``P`` (default: the longest prompt); completion_len: ``C`` (default: the longest).

    Returns:
      The batch, numpy arrays.
    """
    p = max(len(x) for x in prompts) if prompt_len is None else prompt_len
    c = max(len(x) for x in (*chosen, *rejected)) if completion_len is None else completion_len
    pt, pm = pack_rows(prompts, pad_id, p, align="left")
    ct, cm = pack_rows(chosen, pad_id, c, align="right")
    rt, rm = pack_rows(rejected, pad_id, c, align="right")
    zeros = np.zeros(len(prompts), np.float32)
    return PreferenceBatch(pt, pm, ct, cm, rt, rm, zeros, zeros.copy())


def dpo_loss(policy_chosen: jax.Array, policy_rejected: jax.Array, ref_chosen: jax.Array, ref_rejected: jax.Array,
             *, beta: float = 0.1, label_smoothing: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
    """TRL's sigmoid DPO loss and its logged metrics.

    Args:
      policy_chosen: ``[B]`` summed completion log-probs of the chosen completions under the policy.
      policy_rejected: ``[B]`` the same for the rejected ones.
      ref_chosen: ``[B]`` chosen under the frozen reference (no gradient flows into it).
      ref_rejected: ``[B]`` rejected under the reference.
      beta: the DPO temperature (TRL's default 0.1).
      label_smoothing: conservative-DPO smoothing (TRL's default 0).

    Returns:
      ``(loss, metrics)``: the scalar mean loss; metrics (scalars, detached) ``rewards/chosen``,
      ``rewards/rejected``, ``rewards/accuracies``, ``rewards/margins``, ``logps/chosen``,
      ``logps/rejected``.

    Raises:
      ValueError: inputs not all of one shape ``[B]``.
    """
    shapes = {x.shape for x in (policy_chosen, policy_rejected, ref_chosen, ref_rejected)}
    if len(shapes) != 1 or policy_chosen.ndim != 1:
        raise ValueError(f"dpo_loss: the four log-prob sums must all be [B], got shapes {sorted(shapes)}")
    ref_c, ref_r = jax.lax.stop_gradient(ref_chosen), jax.lax.stop_gradient(ref_rejected)
    logits = (policy_chosen - policy_rejected) - (ref_c - ref_r)  # [B]
    losses = (-jax.nn.log_sigmoid(beta * logits) * (1.0 - label_smoothing)
              - jax.nn.log_sigmoid(-beta * logits) * label_smoothing)  # [B]
    chosen = jax.lax.stop_gradient(beta * (policy_chosen - ref_c))  # [B]
    rejected = jax.lax.stop_gradient(beta * (policy_rejected - ref_r))  # [B]
    metrics = {"rewards/chosen": jnp.mean(chosen), "rewards/rejected": jnp.mean(rejected),
               "rewards/accuracies": jnp.mean((chosen > rejected).astype(jnp.float32)),
               "rewards/margins": jnp.mean(chosen - rejected),
               "logps/chosen": jax.lax.stop_gradient(jnp.mean(policy_chosen)),
               "logps/rejected": jax.lax.stop_gradient(jnp.mean(policy_rejected))}
    return jnp.mean(losses), metrics


def pair_logprobs(params: Params, cfg: ModelConfig, prompt: jax.Array, prompt_mask: jax.Array, chosen: jax.Array,
                  chosen_mask: jax.Array, rejected: jax.Array, rejected_mask: jax.Array, *, chunk: int = 128,
                  remat: bool | str = False) -> tuple[jax.Array, jax.Array]:
    """Summed completion log-probs of each pair's chosen and rejected completions given its prompt.

    Args:
      params, cfg: the model (policy or reference).
      prompt: ``[B, P]`` left-padded prompt ids; prompt_mask ``[B, P]`` bool, True on real tokens.
      chosen: ``[B, C1]`` right-padded completion ids; chosen_mask ``[B, C1]``.
      rejected: ``[B, C2]`` right-padded completion ids; rejected_mask ``[B, C2]``.
      chunk: time-chunk of the vocabulary projection.
      remat: rematerialise decoder layers (for gradients of long sequences).

    Returns:
      ``(chosen_logps [B], rejected_logps [B])``: ``sum_t log p(y_t | prompt, y_<t)`` over the real
      completion tokens, at temperature 1 (differentiable in ``params``).
    """
    c = max(chosen.shape[1], rejected.shape[1])
    pad = lambda x, m: (jnp.pad(x, ((0, 0), (0, c - x.shape[1]))),  # noqa: E731
                        jnp.pad(m.astype(bool), ((0, 0), (0, c - m.shape[1]))))
    (ct, cm), (rt, rm) = pad(chosen, chosen_mask), pad(rejected, rejected_mask)
    b = prompt.shape[0]
    suffix = jnp.stack([ct, rt], axis=1).reshape(2 * b, c)  # [2B, C] rows: chosen_0, rejected_0, chosen_1, ...
    suffix_mask = jnp.stack([cm, rm], axis=1).reshape(2 * b, c)
    lp, _, _ = grouped_logprobs(params, cfg, prompt, prompt_mask.astype(bool), suffix, suffix_mask, chunk=chunk,
                                remat=remat)  # [2B, C], 0 on pads
    sums = jnp.sum(lp, axis=1).reshape(b, 2)  # [B, 2]
    return sums[:, 0], sums[:, 1]


def dpo_objective(params: Params, cfg: ModelConfig, batch: PreferenceBatch, *, beta: float = 0.1,
                  label_smoothing: float = 0.0, chunk: int = 128, remat: bool | str = False
                  ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The DPO loss of the policy ``params`` on a batch whose reference sums are filled in.

    Args:
      params, cfg: the policy.
      batch: the pairs, with ``ref_chosen`` / ``ref_rejected`` from :func:`pair_logprobs` under the
        frozen reference.
      beta, label_smoothing: see :func:`dpo_loss`.
      chunk, remat: see :func:`pair_logprobs`.

    Returns:
      ``dpo_loss``' ``(loss, metrics)`` (differentiable in ``params``).
    """
    pc, pr = pair_logprobs(params, cfg, batch.prompt, batch.prompt_mask, batch.chosen, batch.chosen_mask,
                           batch.rejected, batch.rejected_mask, chunk=chunk, remat=remat)
    return dpo_loss(pc, pr, batch.ref_chosen, batch.ref_rejected, beta=beta, label_smoothing=label_smoothing)
