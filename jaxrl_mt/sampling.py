"""Batched generation: a jitted prefill plus a `lax.while_loop` decode over a preallocated KV cache.

Prompts are left-padded; each row has its own stop tokens and its own budget of new tokens.
Prompt length and batch are bucketed (powers of two) so a run compiles a handful of programs.
`generate_tokens` starts from an empty cache; `continue_tokens` appends a segment to caches kept
from earlier calls (multi-turn decoding without re-prefill; `DecodeSession` is its host side).
Both decode with the same loop (`_decode`).
The returned log-probabilities are those of the sampled tokens under the distribution they were
sampled from before truncation: log_softmax(logits / temperature) (raw log_softmax when greedy),
i.e. what TRL stores as the "old" log-probs of a GRPO rollout.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import weakref
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mt.batching import bucket, cache_bucket, chunk_key, plan_chunks
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


def _decode(params: Params, cfg: ModelConfig, cache: KVCache, logits: jax.Array, next_pos: jax.Array,
            rng: jax.Array, stop_ids: jax.Array, max_new_per_row: jax.Array, temperature: jax.Array,
            top_k: jax.Array, top_p: jax.Array, *, max_new: int, greedy: bool, use_top_k: bool,
            use_top_p: bool) -> tuple[dict[str, jax.Array], KVCache]:
    """The decode loop shared by `generate_tokens` and `continue_tokens` (call inside jit).

    Samples each row's first token from `logits` (those of its last fed token), then feeds every
    sampled token back at the next position until each row has hit a stop id or spent its budget.
    The last sampled token of a row is never written to the cache.

    Args:
      cache: the cache holding everything fed so far (room for max_new - 1 more slots).
      logits: [B, 1, V] fp32 logits of each row's last fed token.
      next_pos: [B] RoPE position of each row's first new token.
      rng, stop_ids, max_new_per_row, temperature, top_k, top_p, max_new, greedy, use_top_k,
        use_top_p: as in `generate_tokens`.

    Returns:
      ({tokens [B, N], logprobs [B, N], lengths [B], finish [B], last [B] (the last sampled token,
      not in the cache)}, the updated cache).
    """
    b = logits.shape[0]
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
        pos = (next_pos + step - 1)[:, None]
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
    _, cache, last, out_tok, out_lp, lengths, finish, _ = jax.lax.while_loop(cond, body, state)
    return {"tokens": out_tok, "logprobs": out_lp, "lengths": lengths, "finish": finish, "last": last}, cache


@functools.partial(jax.jit, static_argnames=("cfg", "max_new", "greedy", "use_top_k", "use_top_p", "fuse"))
def generate_tokens(params: Params, cfg: ModelConfig, tokens: jax.Array, token_mask: jax.Array,
                    rng: jax.Array, stop_ids: jax.Array, max_new_per_row: jax.Array,
                    temperature: jax.Array, top_k: jax.Array, top_p: jax.Array, *, max_new: int,
                    greedy: bool, use_top_k: bool, use_top_p: bool, fuse: bool = False,
                    dparams: Params | None = None) -> dict[str, jax.Array]:
    """The jitted sampler.

    Args:
      tokens: [B, P] left-padded prompt ids; token_mask: [B, P] real tokens.
      rng: a PRNG key; stop_ids: [B, E] stop ids per row (-1 = unused).
      max_new_per_row: [B] new-token budget per row (<= max_new; 0 = row is done at once).
      temperature, top_k, top_p: [B] per-row sampling parameters.
      max_new: static size of the output buffers (the cache holds P + max_new slots).
      fuse: decode with `decode_params` (fused Q/K/V and gate/up, a row-major head): faster on
        CPU, at the cost of a second copy of the weights during the call.
      dparams: `decode_params(params, cfg)` made once by the caller (`Sampler.decode_weights`);
        it replaces `params` and spares the call the concatenations (~0.25 s for the embedded
        model on 2 CPU cores).

    Returns:
      tokens [B, N], logprobs [B, N], lengths [B], finish [B] (1 stop, 2 length).
    """
    b, p = tokens.shape
    if dparams is not None:
        params = dparams
    elif fuse:
        params = decode_params(params, cfg)
    cache = jax.lax.optimization_barrier(init_cache(cfg, b, p + max_new))  # no constant folding
    positions = positions_from_mask(token_mask)
    logits, _, cache = forward(params, cfg, tokens, positions, token_mask, cache, logits="last")
    prompt_len = jnp.sum(token_mask, axis=-1).astype(jnp.int32)  # [B]
    out, _ = _decode(params, cfg, cache, logits, prompt_len, rng, stop_ids, max_new_per_row, temperature,
                     top_k, top_p, max_new=max_new, greedy=greedy, use_top_k=use_top_k, use_top_p=use_top_p)
    del out["last"]
    return out


@functools.partial(jax.jit, static_argnames=("cfg", "max_new", "greedy", "use_top_k", "use_top_p", "fuse"))
def continue_tokens(params: Params, cfg: ModelConfig, cache: KVCache, positions: jax.Array, tokens: jax.Array,
                    token_mask: jax.Array, rng: jax.Array, stop_ids: jax.Array, max_new_per_row: jax.Array,
                    temperature: jax.Array, top_k: jax.Array, top_p: jax.Array, *, max_new: int,
                    greedy: bool, use_top_k: bool, use_top_p: bool, fuse: bool = False,
                    dparams: Params | None = None) -> tuple[dict[str, jax.Array], KVCache]:
    """The jitted continuation: appends a segment to each row's cached context, then samples.

    The segment is prefilled at slots cache.index..index+T-1 (slot order is free: RoPE positions
    are baked into the cached keys, `valid` masks the holes), then decoded by the same loop as
    `generate_tokens`. Greedy outputs equal those of `generate_tokens` on each row's whole
    context (cached tokens + segment).

    Args:
      cache: [L, B, Hkv, S, K] caches (see `resize_cache`) with room for T + max_new - 1 slots
        after cache.index.
      positions: [B] RoPE position of each row's first segment token (= its cached tokens).
      tokens: [B, T] left-padded segments; token_mask: [B, T] real tokens. A row with an empty
        segment must have budget 0 (it is idle: nothing is written or generated for it).
      rng, stop_ids, max_new_per_row, temperature, top_k, top_p, max_new, greedy, use_top_k,
        use_top_p, fuse, dparams: as in `generate_tokens`.

    Returns:
      ({tokens [B, N], logprobs [B, N], lengths [B], finish [B], last [B] (the last sampled token,
      not in the cache), positions [B] (the next position of each row: tokens now cached)},
      the updated cache).
    """
    if dparams is not None:
        params = dparams
    elif fuse:
        params = decode_params(params, cfg)
    seg_len = jnp.sum(token_mask, axis=-1).astype(jnp.int32)  # [B]
    seg_pos = positions[:, None] + positions_from_mask(token_mask)  # [B, T]
    logits, _, cache = forward(params, cfg, tokens, seg_pos, token_mask, cache, logits="last")
    out, cache = _decode(params, cfg, cache, logits, positions + seg_len, rng, stop_ids, max_new_per_row,
                         temperature, top_k, top_p, max_new=max_new, greedy=greedy, use_top_k=use_top_k,
                         use_top_p=use_top_p)
    out["positions"] = positions + seg_len + jnp.maximum(out["lengths"] - 1, 0)
    return out, cache


_decode_params_jit = jax.jit(decode_params, static_argnames=("cfg",))


@functools.partial(jax.jit, static_argnames=("capacity",))
def resize_cache(cache: KVCache, rows: jax.Array, keep: jax.Array, *, capacity: int) -> KVCache:
    """Selects rows of a cache and packs each row's valid slots into a cache of `capacity` slots.

    Each selected row's valid slots move, in order, to the right end of [0, C), C being the most
    valid slots of any selected row; the new index is C. Holes (padding, slots of rows that had
    stopped) disappear, so the cache never holds more than the longest context.

    Args:
      cache: [L, B, Hkv, S, K] caches (S may be 0).
      rows: [B'] int source row of each new row.
      keep: [B'] bool; False empties the row (no valid slot).
      capacity: static number of slots S' of the result (>= C).

    Returns:
      The KVCache [L, B', Hkv, S', K].
    """
    valid = cache.valid[rows] & keep[:, None]  # [B', S]
    k, v = cache.k[:, rows], cache.v[:, rows]  # [L, B', Hkv, S, K]
    b, s = valid.shape
    if s == 0:
        shape = k.shape[:3] + (capacity,) + k.shape[4:]
        return KVCache(jnp.zeros(shape, k.dtype), jnp.zeros(shape, v.dtype), jnp.zeros((b, capacity), bool),
                       jnp.zeros((), jnp.int32))
    counts = jnp.sum(valid, axis=-1).astype(jnp.int32)  # [B']
    c = jnp.max(counts)
    order = jnp.argsort(jnp.where(valid, 0, 1), axis=-1, stable=True)  # [B', S] valid slots first, in order
    rel = jnp.arange(capacity)[None] - (c - counts)[:, None]  # [B', S'] rank of the valid slot to put here
    new_valid = (rel >= 0) & (rel < counts[:, None])
    src = jnp.take_along_axis(order, jnp.clip(rel, 0, s - 1), axis=-1)  # [B', S']
    idx = src[None, :, None, :, None]  # [1, B', 1, S', 1]
    k = jnp.take_along_axis(k, idx, axis=3)
    v = jnp.take_along_axis(v, idx, axis=3)
    return KVCache(k, v, new_valid, c)


def _stop_array(stops: Sequence[Sequence[int]], rows: int) -> np.ndarray:
    """Stop ids [rows, E] (-1 = unused) from per-row lists (rows beyond the lists get none)."""
    width = max(1, max((len(s) for s in stops), default=0))
    arr = np.full((rows, width), -1, np.int32)
    for i, s in enumerate(stops):
        arr[i, : len(s)] = s
    return arr


def _sampling_args(sampling: SamplingConfig, rows: int) -> tuple[list[jax.Array], dict[str, bool]]:
    """The per-row temperature/top_k/top_p arrays and the static flags of the jitted samplers."""
    greedy = sampling.temperature == 0
    arrays = [jnp.full((rows,), max(sampling.temperature, 1e-6), jnp.float32),
              jnp.full((rows,), sampling.top_k, jnp.int32), jnp.full((rows,), sampling.top_p, jnp.float32)]
    flags = {"greedy": greedy, "use_top_k": sampling.top_k > 0 and not greedy,
             "use_top_p": sampling.top_p < 1.0 and not greedy}
    return arrays, flags


class Sampler:
    """Host-side driver: tokenises, buckets shapes, calls `generate_tokens`, decodes."""

    def __init__(self, params: Params, cfg: ModelConfig, tokenizer: Any = None, *,
                 eos_ids: Sequence[int] = (), pad_id: int = 0, min_prompt_bucket: int = 32,
                 min_new_bucket: int = 16, max_batch: int | None = None, mesh: Any = None,
                 fuse_weights: bool | None = None):
        self.params, self.cfg, self.tokenizer = params, cfg, tokenizer
        # fused decode weights (`decode_params`): default on the CPU backend, where they are faster;
        # made once per parameter version (`decode_weights`)
        self.fuse_weights = jax.default_backend() == "cpu" if fuse_weights is None else fuse_weights
        self._decode_cache: tuple[list[Any], Params] | None = None  # (weakrefs to the params' leaves, dparams)
        self.eos_ids = tuple(eos_ids)
        self.pad_id = pad_id
        self.min_prompt_bucket, self.min_new_bucket = min_prompt_bucket, min_new_bucket
        self.max_batch = max_batch
        self.mesh = mesh
        # shapes run so far: (B, P, N) for generate_tokens, (B, T, S, N) for continue_tokens
        self.compiled_shapes: set[tuple[int, ...]] = set()

    def decode_weights(self) -> Params | None:
        """`decode_params(self.params)`, made once per parameter version (None when not used).

        A new version is any change of a leaf's identity (`sampler.params = new_params`); the
        cache holds weak references to the leaves, so it keeps no old version alive. Under a
        mesh the fused weights are made inside each call instead, where they inherit the sharding.
        """
        if not self.fuse_weights or self.mesh is not None:
            return None
        leaves = jax.tree_util.tree_leaves(self.params)
        refs = self._decode_cache[0] if self._decode_cache is not None else []
        if len(refs) != len(leaves) or any(ref() is not leaf for ref, leaf in zip(refs, leaves)):
            self._decode_cache = None  # the old copy is freed before the new one is made
            self._decode_cache = ([weakref.ref(x) for x in leaves], _decode_params_jit(self.params, self.cfg))
        return self._decode_cache[1]

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
          seed: an int seed or a PRNG key; the same seed gives the same outputs (chunk j of
            `max_batch` rows uses `batching.chunk_key(seed, j)`).
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
        chunk = self.max_batch or len(prompts)
        results: list[dict[str, np.ndarray]] = []
        t0 = time.perf_counter()
        for j, s in enumerate(range(0, len(prompts), chunk)):
            results.append(self._run(prompts[s:s + chunk], budgets[s:s + chunk], sampling, chunk_key(seed, j),
                                     None if stop_ids is None else stop_ids[s:s + chunk]))
        out = {k: np.concatenate([r[k] for r in results]) for k in results[0]}
        dt = time.perf_counter() - t0
        lengths = out["lengths"]
        toks = [out["tokens"][i, : lengths[i]].tolist() for i in range(len(prompts))]
        lps = [out["logprobs"][i, : lengths[i]] for i in range(len(prompts))]
        res = GenerationResult(toks, lps, lengths, [FINISH_NAMES[int(f)] for f in out["finish"]],
                               stats={"seconds": dt, "new_tokens": float(lengths.sum())})
        res.texts = self.decode_texts(toks, res.finish_reasons)
        return res

    def decode_texts(self, tokens: Sequence[Sequence[int]], finish_reasons: Sequence[str]) -> list[str] | None:
        """Decoded replies, without the stop token of a row that ended on one (None: no tokenizer)."""
        if self.tokenizer is None:
            return None
        stops = set(self.eos_ids)
        return [self.tokenizer.decode([t for t in (tk[:-1] if (tk and tk[-1] in stops and fr == "stop") else tk)],
                                      skip_special_tokens=False)
                for tk, fr in zip(tokens, finish_reasons)]

    def _run(self, prompts, budgets, sampling, key, stop_ids) -> dict[str, np.ndarray]:
        from jaxrl_mt.parallel import agree_max_many, fetch_rows, put_replicated, put_rows, spans_processes

        multi = spans_processes(self.mesh)  # a mesh over several processes: a collective call on per-process rows
        b = len(prompts)
        bb = bucket(b, 1)
        pb = min(bucket(max(len(p) for p in prompts), self.min_prompt_bucket),
                 self.cfg.max_position_embeddings - sampling.max_new_tokens)
        stops = [list(stop_ids[i]) if stop_ids is not None else list(self.eos_ids) for i in range(b)]
        width = max(1, max((len(s) for s in stops), default=0))
        if multi:  # one program: every process pads to the largest row, prompt and stop-list buckets
            bb, pb, width = agree_max_many([bb, pb, width])
        nb = min(bucket(sampling.max_new_tokens, self.min_new_bucket), self.cfg.max_position_embeddings - pb)
        rows = list(prompts) + [[self.pad_id]] * (bb - b)
        tokens, mask = left_pad(rows, self.pad_id, pb)
        budget = np.zeros(bb, np.int32)
        budget[:b] = budgets
        stop_arr = _stop_array(stops, bb)
        if multi:
            stop_arr = np.pad(stop_arr, ((0, 0), (0, width - stop_arr.shape[1])), constant_values=-1)
        self.compiled_shapes.add((bb, pb, nb))
        args = [tokens, mask, stop_arr, budget]
        samp, flags = _sampling_args(sampling, bb)
        if self.mesh is not None:
            args = put_rows(self.mesh, args)  # one process: shard_batch, as before
        if multi:
            samp = put_rows(self.mesh, [np.asarray(a) for a in samp])
            key = put_replicated(self.mesh, key)
        tokens, mask, stop_arr, budget = args
        r = generate_tokens(self.params, self.cfg, tokens, mask, key, stop_arr, budget, *samp, max_new=nb,
                            fuse=self.fuse_weights, dparams=self.decode_weights(), **flags)
        r = fetch_rows(r)  # this process's rows; jax.device_get when the arrays are addressable
        return {k: np.asarray(v)[:b] for k, v in r.items()}

    def session(self, n_rows: int, **kw: Any) -> "DecodeSession":
        """A `DecodeSession` of `n_rows` rows on this sampler (keyword arguments: its options)."""
        return DecodeSession(self, n_rows, **kw)

    def generate(self, conversations: Sequence[Conversation], sampling: SamplingConfig, *,
                 seed: int | jax.Array = 0, system: str | None = None, **kw: Any) -> GenerationResult:
        """Generates the next assistant message of each conversation (chat template applied)."""
        if self.tokenizer is None:
            raise ChatError("Sampler.generate needs a tokenizer")
        prompts = [encode_prompt(self.tokenizer, c, system=system) for c in conversations]
        return self.generate_ids(prompts, sampling, seed=seed, **kw)


@dataclasses.dataclass
class _Chunk:
    """Rows that share one device cache."""

    rows: list[int]  # session rows, in batch order (batch rows beyond them are padding)
    cache: KVCache | None = None  # [L, bucket(len(rows)), Hkv, S, K]; None before the first call


class DecodeSession:
    """Rows whose KV caches persist across generation calls: multi-turn decoding without re-prefill.

    Each `step` appends a segment of new tokens to every active row's context and generates its
    continuation; only the segment is prefilled, the context before it is read from the cache.
    Rows are grouped once, at the first step, into chunks sorted by the length of their first
    segment (at most `sampler.max_batch` rows each, fewer for long segments under `max_cells`),
    each with one device cache. Per row the session keeps the exact token ids in its cache
    (`tokens`), the last sampled token, which is never written to the cache (`pending`), and how
    its last generation ended (`finish`).

    Each step repacks a chunk's cache (`resize_cache`: holes removed, capacity rounded up by
    `cache_bucket`), prefills the segments and decodes (`continue_tokens`). Rows that are
    `release`d are emptied, and dropped from their chunk when that lets the chunk use a smaller
    power-of-two batch.
    """

    def __init__(self, sampler: Sampler, n_rows: int, *, max_cells: int | None = None,
                 min_segment_bucket: int = 16, cache_quantum: int = 128):
        """Args:
          sampler: the sampler (its params, cfg, eos/pad ids, max_batch, mesh, fuse_weights).
          n_rows: number of rows.
          max_cells: optional memory bound of a chunk at the first step, in cells
            rows x segment bucket x (segment bucket + new-token bucket) (see
            `LengthSortedSampler`); later steps keep the chunks.
          min_segment_bucket: smallest segment bucket (segments are padded to a power-of-two multiple).
          cache_quantum: granularity of cache capacities (`cache_bucket`).
        """
        if n_rows < 1:
            raise ValueError(f"n_rows must be >= 1, got {n_rows}")
        self.sampler, self.n_rows = sampler, n_rows
        self.max_cells, self.min_segment_bucket, self.cache_quantum = max_cells, min_segment_bucket, cache_quantum
        self.tokens: list[list[int]] = [[] for _ in range(n_rows)]  # exact ids in each row's cache
        self.pending: list[int | None] = [None] * n_rows  # last sampled token, not in the cache
        self.finish: list[str] = ["none"] * n_rows  # how each row's last generation ended
        self.chunks: list[_Chunk] | None = None
        self.released: set[int] = set()
        self._cleared: set[int] = set()  # rows whose device slots must be emptied at the next step

    def positions(self) -> np.ndarray:
        """[B] next RoPE position of each row (= tokens in its cache)."""
        return np.array([len(t) for t in self.tokens], np.int32)

    def reset(self, rows: Sequence[int]) -> None:
        """Empties rows (their next segment starts a new context at position 0)."""
        for i in rows:
            self.tokens[i], self.pending[i], self.finish[i] = [], None, "none"
            self._cleared.add(i)

    def release(self, rows: Sequence[int]) -> None:
        """Rows that will not be continued: emptied, and dropped when their chunk can shrink (a chunk
        whose rows are all released is freed at once)."""
        self.reset(rows)
        self.released.update(rows)
        if self.chunks is not None:
            self.chunks = [c for c in self.chunks if any(i not in self.released for i in c.rows)]

    def _segment_bucket(self, n: int) -> int:
        return bucket(max(n, 1), self.min_segment_bucket)

    def _plan(self, segments: Sequence[Sequence[int] | None], new_bucket: int) -> list[_Chunk]:
        s = self.sampler
        lengths = [len(g) if g is not None else 0 for g in segments]
        live = [i for i in range(self.n_rows) if i not in self.released]

        def cells(rows: int, longest: int) -> int:
            tb = self._segment_bucket(longest)
            return bucket(rows, 1) * tb * (tb + new_bucket)

        groups = plan_chunks([lengths[i] for i in live], s.max_batch, cells, self.max_cells)
        return [_Chunk([live[j] for j in g]) for g in groups]

    def step(self, segments: Sequence[Sequence[int] | None], sampling: SamplingConfig, *,
             seed: int | jax.Array = 0, max_new_tokens: Sequence[int] | None = None,
             stop_ids: Sequence[Sequence[int]] | None = None) -> GenerationResult:
        """Appends segments to the rows' contexts and generates each active row's continuation.

        Args:
          segments: per row, the token ids to append to its context, or None: the row is idle
            (nothing fed, nothing generated). A row's pending token (`pending[i]`, the last
            token it sampled) is not fed unless the caller puts it in the segment: a pending
            token left out is dropped.
          sampling: the sampling config (its max_new_tokens is the default per-row budget).
          seed: an int seed or a PRNG key; chunk j uses `batching.chunk_key(seed, j)`.
          max_new_tokens: optional per-row budgets (each in [1, sampling.max_new_tokens] for an
            active row; ignored for an idle one).
          stop_ids: optional per-row stop ids (default: the model's EOS ids).

        Returns:
          A GenerationResult over all rows (idle rows: no tokens, finish "none"); stats hold
          "prefill_tokens" (segment tokens fed) and "context_tokens" (cached + segment tokens of
          the active rows).

        Raises:
          ValueError: wrong number of segments, an empty or released active row, a budget out of
            range, or a row whose context + segment + budget exceeds the model context.
        """
        sampling.validate()
        s, n = self.sampler, self.n_rows
        if len(segments) != n:
            raise ValueError(f"expected {n} segments (one per row), got {len(segments)}")
        nmax = sampling.max_new_tokens
        budgets = np.zeros(n, np.int32)
        ctx = s.cfg.max_position_embeddings
        for i, g in enumerate(segments):
            if g is None:
                continue
            if i in self.released:
                raise ValueError(f"row {i} was released and cannot be continued")
            if len(g) == 0:
                raise ValueError(f"row {i}: empty segment (use None for an idle row)")
            budgets[i] = nmax if max_new_tokens is None else int(max_new_tokens[i])
            if not 1 <= budgets[i] <= nmax:
                raise ValueError(f"row {i}: max_new_tokens must be in [1, {nmax}], got {budgets[i]}")
            need = len(self.tokens[i]) + len(g) + int(budgets[i])
            if need > ctx:
                raise ValueError(f"row {i}: {len(self.tokens[i])} cached + {len(g)} new + {budgets[i]} generated "
                                 f"tokens exceed the model context ({ctx})")
        nb = bucket(nmax, s.min_new_bucket)
        if self.chunks is None:
            self.chunks = self._plan(segments, nb)
        out_tok: list[list[int]] = [[] for _ in range(n)]
        out_lp: list[np.ndarray] = [np.zeros(0, np.float32) for _ in range(n)]
        lengths = np.zeros(n, np.int64)
        finish = ["none"] * n
        t0 = time.perf_counter()
        prefill = sum(len(g) for g in segments if g is not None)
        context = sum(len(self.tokens[i]) + len(g) for i, g in enumerate(segments) if g is not None)
        new_chunks: list[_Chunk] = []
        for j, ch in enumerate(self.chunks):
            kept = [i for i in ch.rows if i not in self.released]
            if not kept:
                continue  # every row released: the cache is freed
            rows = kept if bucket(len(kept), 1) < bucket(len(ch.rows), 1) else ch.rows
            active = [i for i in rows if segments[i] is not None]
            cleared = [i for i in rows if i in self._cleared]
            if not active and rows == ch.rows and not cleared:
                new_chunks.append(ch)
                continue
            if not active:  # only regroup / clear: no generation
                new_chunks.append(self._repack(ch, rows, 0))
                ch.cache = None
                continue
            tb = self._segment_bucket(max(len(segments[i]) for i in active))
            chunk = self._repack(ch, rows, tb + nb - 1)
            ch.cache = None  # the repacked copy replaces it: free the old one now
            new_chunks.append(chunk)
            res, chunk.cache = self._continue(chunk, segments, budgets, stop_ids, sampling, tb, nb,
                                              chunk_key(seed, j))
            for b, i in enumerate(rows):
                if segments[i] is None:
                    continue
                m = int(res["lengths"][b])
                gen = res["tokens"][b, :m].tolist()
                self.tokens[i] += list(segments[i]) + gen[:-1]
                self.pending[i] = gen[-1] if m else None
                self.finish[i] = FINISH_NAMES[int(res["finish"][b])]
                if int(res["positions"][b]) != len(self.tokens[i]):
                    raise RuntimeError(f"row {i}: cache position {int(res['positions'][b])} != "
                                       f"{len(self.tokens[i])} cached tokens")
                out_tok[i], out_lp[i], lengths[i], finish[i] = gen, res["logprobs"][b, :m], m, self.finish[i]
        self.chunks = new_chunks
        self._cleared -= {i for ch in new_chunks for i in ch.rows}
        self._cleared -= self.released
        dt = time.perf_counter() - t0
        result = GenerationResult(out_tok, out_lp, lengths, finish,
                                  stats={"seconds": dt, "new_tokens": float(lengths.sum()),
                                         "prefill_tokens": float(prefill), "context_tokens": float(context)})
        result.texts = s.decode_texts(out_tok, finish)
        return result

    def _repack(self, ch: _Chunk, rows: list[int], room: int) -> _Chunk:
        """The chunk of `rows` (a subset of ch.rows, in order) with its cache repacked and `room`
        free slots after the longest context."""
        s = self.sampler
        bb = bucket(len(rows), 1)
        src = [ch.rows.index(i) for i in rows] + [0] * (bb - len(rows))
        keep = [i not in self._cleared for i in rows] + [False] * (bb - len(rows))
        longest = max(len(self.tokens[i]) for i in rows)
        capacity = cache_bucket(longest + room, self.cache_quantum)
        if ch.cache is None:  # no cache yet (nothing fed): zero slots, in ch.rows' batch layout
            old_bb = bucket(len(ch.rows), 1)
            shape = (s.cfg.num_layers, old_bb, s.cfg.num_kv_heads, 0, s.cfg.head_dim)
            dt = s.cfg.jnp_dtype
            old = KVCache(jnp.zeros(shape, dt), jnp.zeros(shape, dt), jnp.zeros((old_bb, 0), bool),
                          jnp.zeros((), jnp.int32))
        else:
            old = ch.cache
        cache = resize_cache(old, jnp.asarray(src, jnp.int32), jnp.asarray(keep), capacity=capacity)
        return _Chunk(list(rows), cache)

    def _continue(self, chunk: _Chunk, segments, budgets, stop_ids, sampling, tb: int, nb: int, key
                  ) -> tuple[dict[str, np.ndarray], KVCache]:
        """One `continue_tokens` call for a chunk."""
        s = self.sampler
        rows = chunk.rows
        bb = chunk.cache.valid.shape[0]
        segs = [list(segments[i]) if segments[i] is not None else [] for i in rows] + [[]] * (bb - len(rows))
        tokens, mask = left_pad(segs, s.pad_id, tb)
        positions = np.zeros(bb, np.int32)
        positions[: len(rows)] = [len(self.tokens[i]) for i in rows]
        budget = np.zeros(bb, np.int32)
        budget[: len(rows)] = budgets[rows]
        stop_arr = _stop_array([list(stop_ids[i]) if stop_ids is not None else list(s.eos_ids) for i in rows], bb)
        s.compiled_shapes.add((bb, tb, int(chunk.cache.valid.shape[1]), nb))
        args = [positions, tokens, mask, stop_arr, budget]
        if s.mesh is not None:
            from jaxrl_mt.parallel import shard_batch

            args = shard_batch(s.mesh, args)
        positions, tokens, mask, stop_arr, budget = args
        samp, flags = _sampling_args(sampling, bb)
        out, cache = continue_tokens(s.params, s.cfg, chunk.cache, positions, tokens, mask, key, stop_arr, budget,
                                     *samp, max_new=nb, fuse=s.fuse_weights, dparams=s.decode_weights(), **flags)
        return {k: np.asarray(v) for k, v in jax.device_get(out).items()}, cache
