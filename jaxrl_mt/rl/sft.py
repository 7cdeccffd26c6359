"""SFT: the masked causal-LM loss on target tokens only (RLSTA's SFT baseline).

The loss is transformers' causal-LM loss with ``labels = -100`` outside the target: the mean over
every target token of the batch of ``-log p(token | tokens before it)``, computed with the
project's scorer (``scoring.token_logprobs``, temperature 1). The items (a multi-turn history with
a correct single-turn response appended as the target) are built in :mod:`jaxrl_mt.rl.sft_data`.

Shapes: ``B`` rows of ``T`` tokens ([history prompt | target], any padding the mask marks).

Under gradient accumulation (``rl.grad_accum`` micro-batches of rows) the loss of each micro-batch
is divided by the step's target tokens / ``grad_accum`` (:class:`SftBatch`'s ``num_items``, on
every row), so the averaged micro-batch gradients are the gradient of the step's token mean: the
same update as one batch.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mt.batching import pack_rows
from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import Params
from jaxrl_mt.scoring import token_logprobs


def sft_loss(params: Params, cfg: ModelConfig, tokens: jax.Array, token_mask: jax.Array, target_mask: jax.Array,
             *, chunk: int = 128, remat: bool | str = False, num_items: jax.Array | float | None = None
             ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean negative log-likelihood of the target tokens.

    Args:
      params, cfg: the model being trained.
      tokens: ``[B, T]`` ids.
      token_mask: ``[B, T]`` bool, True on real tokens.
      target_mask: ``[B, T]`` bool, True on the tokens the loss is on (a subset of the real tokens;
        the first real token of a row has no prediction and is never counted).
      chunk: time-chunk of the vocabulary projection.
      remat: rematerialise decoder layers in the backward pass.
      num_items: the denominator (target tokens of the whole step over the micro-batches, as
        ``grpo_loss``'s ``num_items``, so averaged micro-batch gradients are the step's token
        mean); defaults to this batch's target tokens.

    Returns:
      ``(loss, metrics)``: the scalar loss; metrics ``tokens`` (target tokens counted) and ``nll_sum``.
    """
    token_mask = token_mask.astype(bool)
    lp, _, _ = token_logprobs(params, cfg, tokens, token_mask, chunk=chunk, remat=remat)  # [B, T]
    prev = jnp.concatenate([jnp.zeros_like(token_mask[:, :1]), token_mask[:, :-1]], axis=1)  # a token before
    counted = (target_mask.astype(bool) & token_mask & prev).astype(jnp.float32)  # [B, T]
    n = jnp.sum(counted)
    nll = -jnp.sum(lp * counted)
    denom = jnp.maximum(n, 1.0) if num_items is None else num_items
    return nll / denom, {"tokens": jax.lax.stop_gradient(n), "nll_sum": jax.lax.stop_gradient(nll)}


@flax.struct.dataclass
class SftBatch:
    """``B`` rows ``[prompt | target]`` (a pytree: sliced by rows, placed and jitted as any batch).

    Attributes:
      tokens, token_mask, target_mask: ``[B, T]`` (see :func:`sft_loss`).
      num_items: ``[B]`` the loss's denominator on every row (the step's target tokens /
        ``rl.grad_accum``), or None: each batch's own target tokens.
    """

    tokens: Any
    token_mask: Any
    target_mask: Any
    num_items: Any = None

    @property
    def rows(self) -> int:
        """B."""
        return int(self.tokens.shape[0])

    def slice_rows(self, start: int, n: int) -> SftBatch:
        """Rows ``[start, start + n)``."""
        return jax.tree_util.tree_map(lambda x: x[start:start + n], self)

    def footprint(self) -> tuple[int, int, int, int]:
        """``(B, 1, 0, T)``: B rows scored whole (no shared prompt), as the memory planner counts them."""
        return self.rows, 1, 0, int(self.tokens.shape[1])


def target_tokens(token_mask: np.ndarray, target_mask: np.ndarray) -> int:
    """The target tokens :func:`sft_loss` counts (each has a real token before it), on the host."""
    token_mask = np.asarray(token_mask, bool)
    prev = np.concatenate([np.zeros_like(token_mask[:, :1]), token_mask[:, :-1]], axis=1)
    return int((np.asarray(target_mask, bool) & token_mask & prev).sum())


def sft_objective(params: Params, cfg: ModelConfig, batch: SftBatch, *, chunk: int = 128, remat: bool | str = False
                  ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """:func:`sft_loss` of a batch, divided by the mean of its rows' ``num_items`` when set.

    Returns:
      ``(loss, metrics)``: :func:`sft_loss`'s metrics and ``loss``.
    """
    num_items = None if batch.num_items is None else jnp.mean(batch.num_items)
    loss, m = sft_loss(params, cfg, batch.tokens, batch.token_mask, batch.target_mask, chunk=chunk, remat=remat,
                       num_items=num_items)
    return loss, {**m, "loss": loss}


def sft_rows(prompts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], pad_id: int, *,
             width: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows ``[prompt | target]`` right-padded, with the target mask (``sft_data.encode_target``'s ids).

    Args:
      prompts: ``B`` prompt id lists; targets: ``B`` target id lists.
      pad_id: the padding id.
      width: ``T`` (default: the longest row).

    Returns:
      ``(tokens [B, T] int32, token_mask [B, T] bool, target_mask [B, T] bool)``.
    """
    rows = [list(p) + list(t) for p, t in zip(prompts, targets)]
    t = max(len(r) for r in rows) if width is None else width
    tokens, mask = pack_rows(rows, pad_id, t, align="right")
    target = np.zeros_like(mask)
    for i, (p, tg) in enumerate(zip(prompts, targets)):
        target[i, len(p):len(p) + len(tg)] = True
    return tokens, mask, target
