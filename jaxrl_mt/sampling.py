"""Batched generation: a jitted prefill plus a `lax.while_loop` decode over a preallocated KV cache.

Prompts are left-padded; each row has its own stop tokens and its own budget of new tokens.
Prompt length and batch are bucketed (powers of two) so a run compiles a handful of programs.
The returned log-probabilities are those of the sampled tokens under the distribution they were
sampled from before truncation: log_softmax(logits / temperature) (raw log_softmax when greedy),
i.e. what TRL stores as the "old" log-probs of a GRPO rollout.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mt.chat import ChatError, Conversation, encode_prompt, left_pad
from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import KVCache, Params, decode_params, forward, init_cache, positions_from_mask

FINISH_STOP, FINISH_LENGTH = 1, 2
FINISH_NAMES = {0: "none", FINISH_STOP: "stop", FINISH_LENGTH: "length"}


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


@dataclasses.dataclass
class GenerationResult:
    """Per-row outputs, trimmed to each row's length."""

    tokens: list[list[int]]  # generated ids, stop token included when one ended the row
    logprobs: list[np.ndarray]  # [len] log-probs of the generated ids
    lengths: np.ndarray  # [B] number of generated ids
    finish_reasons: list[str]  # "stop" | "length"
    texts: list[str] | None = None  # decoded, stop token excluded
    stats: dict[str, float] = dataclasses.field(default_factory=dict)


def filter_logits(logits: jax.Array, top_k: jax.Array, top_p: jax.Array, use_top_k: bool,
                  use_top_p: bool) -> jax.Array:
    """Masks logits [B, V] outside the top-k set and/or the top-p nucleus with -inf."""
    neg = jnp.finfo(logits.dtype).min
    if not (use_top_k or use_top_p):
        return logits
    sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]  # [B, V] descending
    if use_top_k:
        k = jnp.clip(top_k, 1, logits.shape[-1])
        kth = jnp.take_along_axis(sorted_logits, (k - 1)[:, None], axis=-1)  # [B, 1]
        logits = jnp.where(logits < kth, neg, logits)
        sorted_logits = jnp.where(jnp.arange(logits.shape[-1])[None] < k[:, None], sorted_logits, neg)
    if use_top_p:
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        cum_before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly before each sorted token
        keep = cum_before < top_p[:, None]  # smallest prefix whose mass reaches top_p
        cutoff = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, neg, logits)
    return logits


def _sample_step(logits: jax.Array, key: jax.Array, temperature: jax.Array, top_k: jax.Array,
                 top_p: jax.Array, greedy: bool, use_top_k: bool, use_top_p: bool
                 ) -> tuple[jax.Array, jax.Array]:
    """Next token [B] and its log-prob [B] from logits [B, V] (fp32)."""
    if greedy:
        tok = jnp.argmax(logits, axis=-1)
        lp = jax.nn.log_softmax(logits, axis=-1)
    else:
        scaled = logits / temperature[:, None]
        lp = jax.nn.log_softmax(scaled, axis=-1)
        tok = jax.random.categorical(key, filter_logits(scaled, top_k, top_p, use_top_k, use_top_p), axis=-1)
    return tok.astype(jnp.int32), jnp.take_along_axis(lp, tok[:, None], axis=-1)[:, 0]


@functools.partial(jax.jit, static_argnames=("cfg", "max_new", "greedy", "use_top_k", "use_top_p", "fuse"))
def generate_tokens(params: Params, cfg: ModelConfig, tokens: jax.Array, token_mask: jax.Array,
                    rng: jax.Array, stop_ids: jax.Array, max_new_per_row: jax.Array,
                    temperature: jax.Array, top_k: jax.Array, top_p: jax.Array, *, max_new: int,
                    greedy: bool, use_top_k: bool, use_top_p: bool, fuse: bool = False) -> dict[str, jax.Array]:
    """The jitted sampler.

    Args:
      tokens: [B, P] left-padded prompt ids; token_mask: [B, P] real tokens.
      rng: a PRNG key; stop_ids: [B, E] stop ids per row (-1 = unused).
      max_new_per_row: [B] new-token budget per row (<= max_new; 0 = row is done at once).
      temperature, top_k, top_p: [B] per-row sampling parameters.
      max_new: static size of the output buffers (the cache holds P + max_new slots).
      fuse: decode with `decode_params` (fused Q/K/V and gate/up, a row-major head): faster on
        CPU, at the cost of a second copy of the weights during the call.

    Returns:
      tokens [B, N], logprobs [B, N], lengths [B], finish [B] (1 stop, 2 length).
    """
    b, p = tokens.shape
    if fuse:
        params = decode_params(params, cfg)
    cache = jax.lax.optimization_barrier(init_cache(cfg, b, p + max_new))  # no constant folding
    positions = positions_from_mask(token_mask)
    logits, _, cache = forward(params, cfg, tokens, positions, token_mask, cache, logits="last")
    prompt_len = jnp.sum(token_mask, axis=-1).astype(jnp.int32)  # [B]
    sample = functools.partial(_sample_step, temperature=temperature, top_k=top_k, top_p=top_p,
                               greedy=greedy, use_top_k=use_top_k, use_top_p=use_top_p)

    def is_stop(tok):
        return jnp.any(tok[:, None] == stop_ids, axis=-1)

    key, sub = jax.random.split(rng)
    tok, lp = sample(logits[:, 0], sub)
    out_tok = jnp.zeros((b, max_new), jnp.int32)
    out_lp = jnp.zeros((b, max_new), jnp.float32)
    active = max_new_per_row > 0
    out_tok = out_tok.at[:, 0].set(jnp.where(active, tok, 0))
    out_lp = out_lp.at[:, 0].set(jnp.where(active, lp, 0.0))
    lengths = active.astype(jnp.int32)
    finish = jnp.where(active & is_stop(tok), FINISH_STOP,
                       jnp.where(active & (lengths >= max_new_per_row), FINISH_LENGTH, 0))
    finish = jnp.where(active, finish, FINISH_LENGTH)

    def cond(state):
        step, _, _, _, _, _, finish, _ = state
        return (step < max_new) & jnp.any(finish == 0)

    def body(state):
        step, cache, last, out_tok, out_lp, lengths, finish, key = state
        live = finish == 0
        pos = (prompt_len + step - 1)[:, None]
        logits, _, cache = forward(params, cfg, last[:, None], pos, live[:, None], cache, logits="last")
        key, sub = jax.random.split(key)
        tok, lp = sample(logits[:, 0], sub)
        out_tok = out_tok.at[:, step].set(jnp.where(live, tok, 0))
        out_lp = out_lp.at[:, step].set(jnp.where(live, lp, 0.0))
        lengths = lengths + live.astype(jnp.int32)
        new_finish = jnp.where(is_stop(tok), FINISH_STOP,
                               jnp.where(lengths >= max_new_per_row, FINISH_LENGTH, 0))
        finish = jnp.where(live, new_finish, finish)
        return step + 1, cache, jnp.where(live, tok, last), out_tok, out_lp, lengths, finish, key

    state = (jnp.int32(1), cache, tok, out_tok, out_lp, lengths, finish, key)
    _, _, _, out_tok, out_lp, lengths, finish, _ = jax.lax.while_loop(cond, body, state)
    return {"tokens": out_tok, "logprobs": out_lp, "lengths": lengths, "finish": finish}


def bucket(n: int, minimum: int) -> int:
    """The smallest power-of-two multiple of `minimum` that is >= n."""
    b = minimum
    while b < n:
        b *= 2
    return b


class Sampler:
    """Host-side driver: tokenises, buckets shapes, calls `generate_tokens`, decodes."""

    def __init__(self, params: Params, cfg: ModelConfig, tokenizer: Any = None, *,
                 eos_ids: Sequence[int] = (), pad_id: int = 0, min_prompt_bucket: int = 32,
                 min_new_bucket: int = 16, max_batch: int | None = None, mesh: Any = None,
                 fuse_weights: bool | None = None):
        self.params, self.cfg, self.tokenizer = params, cfg, tokenizer
        # fused decode weights (`decode_params`): default on the CPU backend, where they are faster
        self.fuse_weights = jax.default_backend() == "cpu" if fuse_weights is None else fuse_weights
        self.eos_ids = tuple(eos_ids)
        self.pad_id = pad_id
        self.min_prompt_bucket, self.min_new_bucket = min_prompt_bucket, min_new_bucket
        self.max_batch = max_batch
        self.mesh = mesh
        self.compiled_shapes: set[tuple[int, int, int]] = set()

    @classmethod
    def from_model(cls, model: Any, **kw: Any) -> "Sampler":
        return cls(model.params, model.cfg, model.tokenizer, eos_ids=model.eos_ids, pad_id=model.pad_id, **kw)

    def generate_ids(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, *,
                     seed: int | jax.Array = 0, max_new_tokens: Sequence[int] | None = None,
                     stop_ids: Sequence[Sequence[int]] | None = None) -> GenerationResult:
        """Generates continuations of token-id prompts.

        Args:
          prompts: B prompts of token ids (non-empty).
          sampling: the sampling config (its max_new_tokens is the default per-row budget).
          seed: an int seed or a PRNG key; the same seed gives the same outputs.
          max_new_tokens: optional per-row budgets (each <= sampling.max_new_tokens).
          stop_ids: optional per-row stop ids (default: the model's EOS ids for every row).
        """
        sampling.validate()
        if not prompts:
            raise ValueError("no prompts")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty")
        n = sampling.max_new_tokens
        budgets = np.full(len(prompts), n, np.int32) if max_new_tokens is None else np.asarray(max_new_tokens, np.int32)
        if np.any(budgets <= 0) or np.any(budgets > n):
            raise ValueError(f"per-row max_new_tokens must be in [1, {n}]")
        longest = max(len(p) for p in prompts)
        ctx = self.cfg.max_position_embeddings
        if longest + n > ctx:
            raise ValueError(f"prompt of {longest} tokens + {n} new tokens exceeds the model context ({ctx})")
        key = jax.random.PRNGKey(seed) if isinstance(seed, (int, np.integer)) else seed
        chunk = self.max_batch or len(prompts)
        results: list[dict[str, np.ndarray]] = []
        t0 = time.perf_counter()
        for s in range(0, len(prompts), chunk):
            key, sub = jax.random.split(key) if s else (key, key)
            results.append(self._run(prompts[s:s + chunk], budgets[s:s + chunk], sampling, sub,
                                     None if stop_ids is None else stop_ids[s:s + chunk]))
        out = {k: np.concatenate([r[k] for r in results]) for k in results[0]}
        dt = time.perf_counter() - t0
        lengths = out["lengths"]
        toks = [out["tokens"][i, : lengths[i]].tolist() for i in range(len(prompts))]
        lps = [out["logprobs"][i, : lengths[i]] for i in range(len(prompts))]
        res = GenerationResult(toks, lps, lengths, [FINISH_NAMES[int(f)] for f in out["finish"]],
                               stats={"seconds": dt, "new_tokens": float(lengths.sum())})
        if self.tokenizer is not None:
            stops = set(self.eos_ids)
            res.texts = [self.tokenizer.decode([t for t in (tk[:-1] if (tk and tk[-1] in stops and fr == "stop") else tk)],
                                               skip_special_tokens=False)
                         for tk, fr in zip(toks, res.finish_reasons)]
        return res

    def _run(self, prompts, budgets, sampling, key, stop_ids) -> dict[str, np.ndarray]:
        b = len(prompts)
        bb = bucket(b, 1)
        pb = min(bucket(max(len(p) for p in prompts), self.min_prompt_bucket),
                 self.cfg.max_position_embeddings - sampling.max_new_tokens)
        nb = min(bucket(sampling.max_new_tokens, self.min_new_bucket), self.cfg.max_position_embeddings - pb)
        rows = list(prompts) + [[self.pad_id]] * (bb - b)
        tokens, mask = left_pad(rows, self.pad_id, pb)
        budget = np.zeros(bb, np.int32)
        budget[:b] = budgets
        stops = [list(stop_ids[i]) if stop_ids is not None else list(self.eos_ids) for i in range(b)]
        width = max(1, max(len(s) for s in stops))
        stop_arr = np.full((bb, width), -1, np.int32)
        for i, s in enumerate(stops):
            stop_arr[i, : len(s)] = s
        greedy = sampling.temperature == 0
        self.compiled_shapes.add((bb, pb, nb))
        args = [tokens, mask, stop_arr, budget]
        if self.mesh is not None:
            from jaxrl_mt.parallel import shard_batch

            args = shard_batch(self.mesh, args)
        tokens, mask, stop_arr, budget = args
        r = generate_tokens(
            self.params, self.cfg, tokens, mask, key, stop_arr, budget,
            jnp.full((bb,), max(sampling.temperature, 1e-6), jnp.float32),
            jnp.full((bb,), sampling.top_k, jnp.int32), jnp.full((bb,), sampling.top_p, jnp.float32),
            max_new=nb, greedy=greedy, use_top_k=sampling.top_k > 0 and not greedy,
            use_top_p=sampling.top_p < 1.0 and not greedy, fuse=self.fuse_weights)
        r = jax.device_get(r)
        return {k: np.asarray(v)[:b] for k, v in r.items()}

    def generate(self, conversations: Sequence[Conversation], sampling: SamplingConfig, *,
                 seed: int | jax.Array = 0, system: str | None = None, **kw: Any) -> GenerationResult:
        """Generates the next assistant message of each conversation (chat template applied)."""
        if self.tokenizer is None:
            raise ChatError("Sampler.generate needs a tokenizer")
        prompts = [encode_prompt(self.tokenizer, c, system=system) for c in conversations]
        return self.generate_ids(prompts, sampling, seed=seed, **kw)
