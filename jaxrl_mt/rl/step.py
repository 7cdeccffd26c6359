"""The jitted GRPO train step: rollout sequences -> per-token log-probs (the scorer) -> loss -> optax.

Two rollout layouts, the same loss:

- full rows (`assemble_rollouts`): [left-padded prompt (P) | right-padded completion (C)] per
  row, so the completion log-probs are `token_logprobs(...)[:, P:]`;
- grouped (`assemble_grouped`): each of the Bp prompts once ("prompt_tokens" [Bp, P]) and the
  Bp * G completions ("completion_tokens" [Bp * G, C], G consecutive rows per prompt), scored by
  `scoring.grouped_logprobs`: the prompt goes through the model once per group instead of G
  times, forward and backward. Used whenever a micro-batch holds whole groups and no mesh
  splits the rows.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_mt.batching import pack_rows
from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import Params
from jaxrl_mt.rl.grpo import grpo_loss
from jaxrl_mt.scoring import Scorer, grouped_logprobs, masked_mean, token_logprobs


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
    remat: bool | str = False  # rematerialise decoder layers in the backward pass (grouped layout: or "dots")
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


def assemble_grouped(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int,
                     prompt_len: int, completion_len: int) -> dict[str, np.ndarray]:
    """Packs Bp prompts and their Bp * G completions (G consecutive rows per prompt).

    Returns:
      prompt_tokens / prompt_mask [Bp, P] (left-padded), completion_tokens / completion_mask
      [Bp * G, C] (right-padded).
    """
    if not prompts or len(completions) % len(prompts):
        raise ValueError(f"{len(completions)} completions are not a multiple of {len(prompts)} prompts")
    g = len(completions) // len(prompts)
    for i, c in enumerate(completions):
        if len(prompts[i // g]) > prompt_len or len(c) > completion_len:
            raise ValueError(f"row {i}: prompt {len(prompts[i // g])} / completion {len(c)} exceed "
                             f"{prompt_len} / {completion_len}")
    ptok, pmask = pack_rows(prompts, pad_id, prompt_len, align="left")
    ctok, cmask = pack_rows(completions, pad_id, completion_len, align="right")
    return {"prompt_tokens": ptok, "prompt_mask": pmask, "completion_tokens": ctok, "completion_mask": cmask}


def is_grouped(batch: dict[str, Any]) -> bool:
    """Whether a rollout batch has the grouped layout (`assemble_grouped`)."""
    return "prompt_tokens" in batch


def rollout_prompt_len(batch: dict[str, Any]) -> int:
    """P, the prompt width of a rollout batch of either layout."""
    if is_grouped(batch):
        return int(batch["prompt_tokens"].shape[1])
    return int(batch["tokens"].shape[1] - batch["completion_mask"].shape[1])


def _completion_lp(params: Params, cfg: ModelConfig, batch: dict[str, jax.Array], prompt_len: int, *,
                   temperature: float, chunk: int, remat: bool | str = False, with_entropy: bool = False
                   ) -> tuple[jax.Array, jax.Array | None]:
    """Log-probs [N, C] (and entropies) of the completion tokens of a rollout batch of either layout."""
    if is_grouped(batch):
        lp, _, ent = grouped_logprobs(params, cfg, batch["prompt_tokens"], batch["prompt_mask"],
                                      batch["completion_tokens"], batch["completion_mask"], temperature=temperature,
                                      chunk=chunk, remat=remat, with_entropy=with_entropy)
        return lp, ent
    lp, _, ent = token_logprobs(params, cfg, batch["tokens"], batch["token_mask"], temperature=temperature,
                               chunk=chunk, remat=remat, with_entropy=with_entropy)
    return lp[:, prompt_len:], (None if ent is None else ent[:, prompt_len:])


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


@functools.partial(jax.jit, static_argnames=("cfg", "temperature", "chunk"))
def grouped_completion_logprobs(params: Params, cfg: ModelConfig, batch: dict[str, jax.Array], *,
                                temperature: float = 1.0, chunk: int = 128) -> jax.Array:
    """Log-probs [N, C] of the completion tokens of a grouped rollout batch (old/ref log-probs)."""
    keys = ("prompt_tokens", "prompt_mask", "completion_tokens", "completion_mask")
    return _completion_lp(params, cfg, {k: batch[k] for k in keys}, 0, temperature=temperature, chunk=chunk)[0]


def reference_logprobs(scorer: Scorer | None, ref_params: Params, ref_cfg: ModelConfig, batch: dict[str, Any],
                       prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], *,
                       temperature: float = 1.0) -> np.ndarray:
    """Reference log-probs [N, C] of a rollout batch's completions (the KL term's).

    When `scorer` (the reference model's) has just scored exactly these (prompt, completion)
    pairs, i.e. the anchor reward ran under the policy's own prompt, its log-probs are reused
    (temperature 1 only) instead of running the reference model a second time. `prompts` holds
    one prompt per row (N).
    """
    c = batch["completion_mask"].shape[1]
    cached = scorer.cached_logprobs(prompts, completions) if scorer is not None and temperature == 1.0 else None
    if cached is not None and len(cached) == batch["completion_mask"].shape[0]:
        out = np.zeros((len(cached), c), np.float32)
        for i, lp in enumerate(cached):
            out[i, :len(lp)] = lp
        return out
    if is_grouped(batch):
        return np.asarray(grouped_completion_logprobs(ref_params, ref_cfg, batch, temperature=temperature))
    return np.asarray(completion_logprobs(ref_params, ref_cfg, batch["tokens"], batch["token_mask"],
                                          prompt_len=rollout_prompt_len(batch), temperature=temperature))


def activation_bytes_grouped(cfg: ModelConfig, n_prompts: int, group: int, prompt_len: int,
                             completion_len: int, *, remat: bool | str, chunk: int = 128) -> int:
    """Estimated activation bytes of a grouped GRPO backward pass (docs/scaling.md's formula, per token).

    Prompts count once per group (Bp * P tokens), completions N * C; attention scores are
    Bp * Hq * P^2 for the prompts and N * Hq * C * (P + C) for the completions. "dots" keeps
    the weight matmuls' outputs of every layer (q, k, v, o, gate, up, down) and one layer's rest.
    """
    b = jnp.dtype(cfg.jnp_dtype).itemsize
    d, f, k = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    hq, hkv = cfg.num_heads * k, cfg.num_kv_heads * k
    n = n_prompts * group
    tokens = n_prompts * prompt_len + n * completion_len
    per_token = b * (4 * d + 3 * hq + 3 * hkv + 4 * f)
    pairs = n_prompts * prompt_len ** 2 + n * completion_len * (prompt_len + completion_len)
    layer = tokens * per_token + cfg.num_heads * (4 + b) * pairs
    head = 3 * n * min(chunk, completion_len) * cfg.vocab_size * 4  # one chunk of fp32 logits
    if remat == "dots":
        return cfg.num_layers * tokens * b * (2 * d + hq + 2 * hkv + 2 * f) + layer + head
    if remat:
        return cfg.num_layers * tokens * d * b + layer + head
    return cfg.num_layers * layer + head


def available_memory() -> int:
    """Bytes free for new allocations: the device's unused memory, or the host's MemAvailable on CPU."""
    stats = jax.devices()[0].memory_stats() if jax.default_backend() != "cpu" else None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


XLA_TEMP_FACTOR = 2  # XLA:CPU's measured temporaries of the 135M step were ~2x the estimate


def choose_remat(cfg: ModelConfig, n_prompts: int, group: int, prompt_len: int, completion_len: int, *,
                 budget: int | None = None, chunk: int = 128) -> bool | str:
    """The cheapest rematerialisation whose estimated activations (x XLA_TEMP_FACTOR) fit `budget`.

    False (none) if it fits, else "dots" (recompute everything but the weight matmuls), else True
    (keep only layer inputs). Default budget: half of `available_memory()` (measured before the
    optimizer state exists), leaving room for the parameters, gradients and optimizer state.
    `chunk`: the time chunk of the vocabulary projection (`LossConfig.chunk`).
    """
    budget = available_memory() // 2 if budget is None else budget
    for remat in (False, "dots"):
        est = activation_bytes_grouped(cfg, n_prompts, group, prompt_len, completion_len, remat=remat, chunk=chunk)
        if est * XLA_TEMP_FACTOR <= budget:
            return remat
    return True


def loss_fn(params: Params, cfg: ModelConfig, lc: LossConfig, prompt_len: int, batch: dict[str, jax.Array]
            ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GRPO loss of one (micro-)batch of either layout, and its metrics."""
    logp, ent = _completion_lp(params, cfg, batch, prompt_len, temperature=lc.temperature, chunk=lc.chunk,
                               remat=lc.remat, with_entropy=True)  # [N, C]
    cmask = batch["completion_mask"]
    loss, metrics = grpo_loss(
        logp, batch.get("old_logp"), batch.get("ref_logp") if lc.beta > 0 else None, batch["advantages"],
        cmask.astype(jnp.float32), epsilon_low=lc.epsilon_low, epsilon_high=lc.epsilon_high, beta=lc.beta,
        kl_estimator=lc.kl_estimator, loss_type=lc.loss_type, max_completion_length=lc.max_completion_length,
        num_items=jnp.mean(batch["num_items"]) if "num_items" in batch else None)
    metrics = dict(metrics)
    metrics["entropy"] = masked_mean(ent, cmask)
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


def micro_batch(batch: dict[str, np.ndarray], start: int, rows: int, group: int) -> dict[str, np.ndarray]:
    """Rows [start, start + rows) of a rollout batch; of a grouped one, their prompts too (whole groups)."""
    if not is_grouped(batch):
        return {k: v[start:start + rows] for k, v in batch.items()}
    lo, hi = start // group, (start + rows) // group
    return {k: (v[lo:hi] if k.startswith("prompt_") else v[start:start + rows]) for k, v in batch.items()}
