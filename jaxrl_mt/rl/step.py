"""The jitted GRPO train step: rollout sequences -> per-token log-probs (the scorer) -> loss -> optax.

Rollout rows are laid out as [left-padded prompt (P) | right-padded completion (C)], so the
completion log-probs are `token_logprobs(...)[:, P:]` and every row shares one shape.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_mt.batching import pack_rows
from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import Params
from jaxrl_mt.rl.grpo import grpo_loss
from jaxrl_mt.scoring import masked_mean, token_logprobs


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Static GRPO loss settings (hashable: part of the jit cache key)."""

    epsilon_low: float = 0.2  # lower clip range
    epsilon_high: float = 0.2  # upper clip range (DAPO's clip-higher when > epsilon_low)
    beta: float = 0.0  # KL coefficient
    kl_estimator: str = "k3"  # "k1" | "k3"
    loss_type: str = "grpo"  # "grpo" (seq-mean-token-mean) | "token_mean" | "dr_grpo" | "dapo" (TRL 0.25)
    temperature: float = 1.0  # logits are divided by it, as at sampling time
    max_completion_length: int = 128  # Dr. GRPO's constant denominator
    remat: bool = False  # rematerialise decoder layers in the backward pass
    chunk: int = 128  # time-chunk of the vocabulary projection


def assemble_rollouts(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int,
                      prompt_len: int, completion_len: int) -> dict[str, np.ndarray]:
    """Packs prompts and completions into fixed-shape arrays.

    Returns:
      tokens [N, P + C] int32, token_mask [N, P + C] bool, completion_mask [N, C] bool.
    """
    for i, (p, c) in enumerate(zip(prompts, completions)):
        if len(p) > prompt_len or len(c) > completion_len:
            raise ValueError(f"row {i}: prompt {len(p)} / completion {len(c)} exceed {prompt_len} / {completion_len}")
    ptok, pmask = pack_rows(prompts, pad_id, prompt_len, align="left")
    ctok, cmask = pack_rows(completions, pad_id, completion_len, align="right")
    return {"tokens": np.concatenate([ptok, ctok], axis=1), "token_mask": np.concatenate([pmask, cmask], axis=1),
            "completion_mask": cmask}


def dapo_num_items(completion_mask: np.ndarray, grad_accum: int, tokens: int | None = None) -> np.ndarray:
    """The ``dapo`` normaliser of every row [N]: the step's completion tokens / ``grad_accum``.

    ``tokens`` is the count over every process (TRL's gathered ``num_items_in_batch``); default:
    this batch's. Each row carries the value, so the micro-batches (row slices) all get it.
    """
    total = int(completion_mask.sum()) if tokens is None else int(tokens)
    return np.full(completion_mask.shape[0], max(total, 1) / grad_accum, np.float32)


@functools.partial(jax.jit, static_argnames=("cfg", "prompt_len", "temperature", "chunk"))
def completion_logprobs(params: Params, cfg: ModelConfig, tokens: jax.Array, token_mask: jax.Array, *,
                        prompt_len: int, temperature: float = 1.0, chunk: int = 128) -> jax.Array:
    """Log-probs [N, C] of the completion tokens (no gradient use; for old/ref log-probs)."""
    lp, _, _ = token_logprobs(params, cfg, tokens, token_mask, temperature=temperature, chunk=chunk)
    return lp[:, prompt_len:]


def loss_fn(params: Params, cfg: ModelConfig, lc: LossConfig, prompt_len: int, batch: dict[str, jax.Array]
            ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GRPO loss of one (micro-)batch and its metrics."""
    lp, _, ent = token_logprobs(params, cfg, batch["tokens"], batch["token_mask"], temperature=lc.temperature,
                                chunk=lc.chunk, remat=lc.remat, with_entropy=True)
    logp = lp[:, prompt_len:]  # [N, C]
    cmask = batch["completion_mask"]
    loss, metrics = grpo_loss(
        logp, batch.get("old_logp"), batch.get("ref_logp") if lc.beta > 0 else None, batch["advantages"],
        cmask.astype(jnp.float32), epsilon_low=lc.epsilon_low, epsilon_high=lc.epsilon_high, beta=lc.beta,
        kl_estimator=lc.kl_estimator, loss_type=lc.loss_type, max_completion_length=lc.max_completion_length,
        num_items=jnp.mean(batch["num_items"]) if "num_items" in batch else None)
    metrics = dict(metrics)
    metrics["entropy"] = masked_mean(ent[:, prompt_len:], cmask)
    metrics["loss"] = loss
    return loss, metrics


def make_train_step(cfg: ModelConfig, optimizer: optax.GradientTransformation, lc: LossConfig,
                    prompt_len: int, *, donate: bool = False) -> Callable[..., Any]:
    """A jitted `step(params, opt_state, batch) -> (params, opt_state, metrics)`.

    A non-finite loss or gradient leaves params and optimizer state unchanged and reports
    metrics["finite"] = 0, so the caller can stop with the last good state. With `donate`, the
    parameters and optimizer state passed in are donated (updated in place: one copy of the
    train state instead of two; the caller must not read them again).
    """

    def step(params: Params, opt_state: Any, batch: dict[str, jax.Array]):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, cfg, lc, prompt_len, batch)
        gnorm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(gnorm)
        updates, new_opt = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        keep = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
        metrics = dict(metrics, grad_norm=gnorm, finite=finite.astype(jnp.float32))
        return keep(new_params, params), keep(new_opt, opt_state), metrics

    return jax.jit(step, donate_argnums=(0, 1) if donate else ())
