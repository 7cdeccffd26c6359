"""The jitted GRPO train step: a rollout example -> per-token log-probs (the scorer) -> loss -> optax.

One layout (`jaxrl_mt.rl.example.TrainExample`): each of the Bp prompts once [Bp, P] and the
Bp * G completions [Bp * G, C], scored by `scoring.grouped_logprobs`: a prompt goes through the
model once per group instead of G times, forward and backward, with or without a mesh.
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

from jax.sharding import Mesh

from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import Params
from jaxrl_mt.parallel import shard_train_step
from jaxrl_mt.rewards.registry import RefLogprobs
from jaxrl_mt.rl.example import TrainExample
from jaxrl_mt.rl.cov import DEFAULT_COV, CovConfig
from jaxrl_mt.rl.grpo import grpo_loss
from jaxrl_mt.rl.run_config import RLSection
from jaxrl_mt.scoring import grouped_logprobs, masked_mean, token_logprobs


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
    loss_variant: str = "clip"  # "clip" | "clip_cov" | "kl_cov" (`rl.cov`); clip_cov needs `TrainExample.seed`
    cov: CovConfig = DEFAULT_COV  # the Cov variants' settings


def loss_config(rl: RLSection) -> LossConfig:
    """The loss settings of a config's ``rl`` section (``rl.remat = "auto"``: False here, the loop
    chooses per prompt bucket). A method without rollouts (SFT, DPO: no ``rl.loss``) reads its
    forward's settings only (``remat``, ``chunk``)."""
    remat = False if rl.remat == "auto" else rl.remat
    lo, ro = rl.loss, rl.rollout
    if lo is None or ro is None:
        return LossConfig(remat=remat)
    cov = CovConfig(clip_cov_ratio=lo.clip_cov_ratio, clip_cov_lb=lo.clip_cov_lb, clip_cov_ub=lo.clip_cov_ub,
                    kl_cov_ratio=lo.kl_cov_ratio, ppo_kl_coef=lo.ppo_kl_coef)
    return LossConfig(epsilon_low=lo.epsilon_low, epsilon_high=lo.epsilon_high, beta=lo.beta,
                      kl_estimator=lo.kl_estimator, loss_type=lo.loss_type, temperature=ro.temperature,
                      max_completion_length=rl.max_new_tokens, remat=remat, loss_variant=lo.loss_variant, cov=cov)


def micro_seed(seed: int, step: int, inner: int, micro: int) -> np.ndarray:
    """The [] uint32 seed of one micro-step's random loss choices (``TrainExample.seed``): a function of
    the run's seed, the step, the ``rl.mu`` iteration and the micro-batch, so a resumed run repeats it."""
    return np.asarray(np.random.SeedSequence([seed, step, inner, micro]).generate_state(1)[0], np.uint32)


def dapo_num_items(completion_mask: np.ndarray, grad_accum: int, tokens: int | None = None) -> np.ndarray:
    """The ``dapo`` normaliser of every row [N]: the step's completion tokens / ``grad_accum``.

    ``tokens`` is the count over every process (TRL's gathered ``num_items_in_batch``); default:
    this batch's. Each row carries the value, so the micro-batches (row slices) all get it.
    """
    total = int(completion_mask.sum()) if tokens is None else int(tokens)
    return np.full(completion_mask.shape[0], max(total, 1) / grad_accum, np.float32)


def _completion_lp(params: Params, cfg: ModelConfig, ex: TrainExample, *, temperature: float, chunk: int,
                   remat: bool | str = False, with_entropy: bool = False) -> tuple[jax.Array, jax.Array | None]:
    """Log-probs [N, C] (and entropies) of the completion tokens of a rollout example.

    ``group == 1`` (a prompt per row) runs the rows [prompt | completion] (`token_logprobs`): no
    prompt is shared, and the full-row program is the one the flat layout always ran.
    """
    if ex.group == 1:
        p = ex.prompt_tokens.shape[1]
        tokens = jnp.concatenate([ex.prompt_tokens, ex.completion_tokens], axis=1)
        mask = jnp.concatenate([ex.prompt_mask, ex.completion_mask], axis=1)
        lp, _, ent = token_logprobs(params, cfg, tokens, mask, temperature=temperature, chunk=chunk, remat=remat,
                                    with_entropy=with_entropy)
        return lp[:, p:], (None if ent is None else ent[:, p:])
    lp, _, ent = grouped_logprobs(params, cfg, ex.prompt_tokens, ex.prompt_mask, ex.completion_tokens,
                                  ex.completion_mask, temperature=temperature, chunk=chunk, remat=remat,
                                  with_entropy=with_entropy)
    return lp, ent


@functools.partial(jax.jit, static_argnames=("cfg", "temperature", "chunk"))
def completion_logprobs(params: Params, cfg: ModelConfig, ex: TrainExample, *, temperature: float = 1.0,
                        chunk: int = 128) -> jax.Array:
    """Log-probs [N, C] of an example's completion tokens (no gradient use; for old/ref log-probs)."""
    return _completion_lp(params, cfg, ex, temperature=temperature, chunk=chunk)[0]


def reused_logprobs(ref: RefLogprobs | None, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                    width: int, *, temperature: float = 1.0) -> np.ndarray | None:
    """The reward's reference log-probs as [N, width], when it scored exactly these (prompt, completion) pairs.

    The anchor reward scores every completion under the frozen reference model; when its context
    is the policy's own prompt (a single-turn item), those log-probs are the KL term's and the
    reference model need not run a second time. ``prompts`` holds one prompt per row (N). Rows the
    reward left unscored (empty completions) are all pads and need no log-prob. None otherwise,
    and at a sampling temperature other than 1 (the reward scores at temperature 1).
    """
    if ref is None or temperature != 1.0 or len(ref.contexts) != len(prompts):
        return None
    out = np.zeros((len(prompts), width), np.float32)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        if not len(c):
            continue
        lp = ref.logprobs[i]
        if lp is None or list(ref.contexts[i]) != list(p) or list(ref.completions[i]) != list(c):
            return None
        out[i, :len(lp)] = lp
    return out


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


def loss_fn(params: Params, cfg: ModelConfig, lc: LossConfig, ex: TrainExample
            ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GRPO loss of one (micro-)batch, and its metrics."""
    logp, ent = _completion_lp(params, cfg, ex, temperature=lc.temperature, chunk=lc.chunk, remat=lc.remat,
                               with_entropy=True)  # [N, C]
    cmask = ex.completion_mask
    loss, metrics = grpo_loss(
        logp, ex.old_logp, ex.ref_logp if lc.beta > 0 else None, ex.advantages,
        cmask.astype(jnp.float32), epsilon_low=lc.epsilon_low, epsilon_high=lc.epsilon_high, beta=lc.beta,
        kl_estimator=lc.kl_estimator, loss_type=lc.loss_type, max_completion_length=lc.max_completion_length,
        num_items=None if ex.num_items is None else jnp.mean(ex.num_items), loss_variant=lc.loss_variant,
        cov=lc.cov, key=None if ex.seed is None else jax.random.key(ex.seed))
    metrics = dict(metrics)
    metrics["entropy"] = masked_mean(ent, cmask)
    metrics["loss"] = loss
    return loss, metrics


def make_train_step(cfg: ModelConfig, optimizer: optax.GradientTransformation, lc: LossConfig, *,
                    mesh: Mesh | None = None, state: Any = None, donate: bool = False,
                    loss: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """A jitted `step(params, opt_state, example) -> (params, opt_state, metrics)`.

    A non-finite loss or gradient leaves params and optimizer state unchanged and reports
    metrics["finite"] = 0, so the caller can stop with the last good state. With `donate`, the
    parameters and optimizer state passed in are donated (updated in place: one copy of the
    train state instead of two; the caller must not read them again). With a `mesh`, shardings
    are decided here, once: parameters and optimizer state keep the partition rules
    (`parallel.shard_train_step`; `state` = (params, opt_state) examples of the trees), metrics
    are replicated and the example keeps the sharding it arrives with. ``loss(params, cfg, lc, batch)
    -> (loss, metrics)`` replaces the GRPO loss (`loss_fn`) for other objectives (SFT, DPO); its
    metrics must hold ``loss``.
    """
    objective = loss_fn if loss is None else loss

    def step(params: Params, opt_state: Any, ex: TrainExample):
        (loss, metrics), grads = jax.value_and_grad(objective, has_aux=True)(params, cfg, lc, ex)
        gnorm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(gnorm)
        updates, new_opt = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        keep = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
        metrics = dict(metrics, grad_norm=gnorm, finite=finite.astype(jnp.float32))
        return keep(new_params, params), keep(new_opt, opt_state), metrics

    params, opt_state = state if state is not None else (None, None)
    return shard_train_step(step, mesh, params, opt_state, donate=donate)
