"""The jitted sampler kernels: prefill, then a `lax.while_loop` decode over a preallocated KV cache.

`generate_tokens` prefills a chunk of rows into an empty cache and decodes them all to the longest
row with one loop (`decode`), whose state is one `DecodeState` struct, picking tokens with a
sampling method object (`jaxrl_mt.sampling.methods`). It is only the reference of `benchmarks
workload` (`Sampler.generate_chunked`): every generation call, and every conversation that keeps
its cache across turns, runs the slot engine (`sampling.slots`, `scheduler`, `turns`), which
shares this module's per-row constants (`Rows`), keys and sampling steps.

The decoder stays a pure function of a parameter pytree (`models.decoder.forward`), called
here: the loop body is one `forward` of the last tokens at their positions, so the same
parameters serve prefill, decode, the scorer and the train step without a module object, and
their shardings come from the mesh rules (`jaxrl_mt.parallel`), not from module metadata.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import KVCache, Params, decode_params, forward, init_cache, positions_from_mask
from jaxrl_mt.parallel import cache_shardings
from jaxrl_mt.sampling.methods import Categorical, Greedy, RowParams

# The decode numerics' version, recorded with every evaluation (`experiments.provenance`): a change of
# a prefill's batch or summation order may flip a near-tie greedy token. 4: with reuse_cache, a
# conversation's later turns are prefilled onto its slot's kept cache (`sampling.turns`); 3: one device decodes with the
# slot engine (`sampling.scheduler`: a row is prefilled with the rows admitted beside it, at their
# prompt bucket); 2: the cache attention reads a prefix of the cache with dot products
# (`models.cache_attention`); 1: every slot, multiply-reduce.
ENGINE_VERSION = 4
FINISH_STOP, FINISH_LENGTH = 1, 2
FINISH_NAMES = {0: "none", FINISH_STOP: "stop", FINISH_LENGTH: "length"}
Method = Greedy | Categorical


def decode_compiler_options(dots: str | None = None, jaxlib_version: str | None = None) -> dict[str, str]:
    """XLA options of the jitted decode kernels (`generate_tokens`, the slot programs).

    From jaxlib 0.10, XLA:CPU hands every dot to YNNPACK by default. A decode step multiplies B
    (1-32) rows by every weight matrix, and at these row counts Eigen's dot (the one XLA:CPU used
    before) is faster: measured on a 2-core AVX2 host, the decode step at batch 8 went from
    186-187 to 120-141 ms (`docs/results/bench_decode/dots_session12.txt`), while the scorer's
    long rows (8 x 256 tokens) and the train step were faster with YNNPACK (scoring 9.96 against
    11.12 s), so only the decode kernels opt out. Their prefill runs long rows too: the LiC
    simulator, whose continuation calls then prefilled whole histories, gained only 1.04x where plain
    generation gained 1.19x (`docs/performance.md`). It is an XLA:CPU option: the GPU and TPU
    compilers do not read it (not exercised on a device here).

    Args:
      dots: "eigen" (drop YNNPACK's dots in these kernels) or "xla" (XLA's default). None reads
        $JAXRL_MT_DECODE_DOTS, default "eigen".
      jaxlib_version: for tests; None reads the installed jaxlib's. Before 0.10 the option is not
        set (older jaxlibs may not know it, and were not measured).

    Raises:
      ValueError: `dots` (or the environment variable) is neither "eigen" nor "xla".
    """
    if dots is None:
        dots = os.environ.get("JAXRL_MT_DECODE_DOTS", "eigen")
    if dots not in ("eigen", "xla"):
        raise ValueError(f"JAXRL_MT_DECODE_DOTS must be 'eigen' or 'xla', got {dots!r}")
    if jaxlib_version is None:
        import jaxlib

        jaxlib_version = jaxlib.__version__
    major_minor = tuple(int(v) for v in jaxlib_version.split(".")[:2])
    if dots == "xla" or major_minor < (0, 10):
        return {}
    return {"xla_cpu_experimental_ynn_fusion_type": ""}


_DECODE_OPTIONS = decode_compiler_options()


@flax.struct.dataclass
class DecodeState:
    """The carry of the decode loop (rows B, output buffers of N tokens)."""

    step: jax.Array  # [] next output slot
    cache: KVCache  # everything fed so far
    last: jax.Array  # [B] last sampled token of each row (not in the cache)
    tokens: jax.Array  # [B, N] sampled tokens (0 after a row ended)
    logprobs: jax.Array  # [B, N] their log-probs
    lengths: jax.Array  # [B] tokens generated per row
    finish: jax.Array  # [B] 0 running, FINISH_STOP, FINISH_LENGTH


@flax.struct.dataclass
class Rows:
    """Per-row constants of one decode call."""

    next_pos: jax.Array  # [B] RoPE position of each row's first new token
    stop_ids: jax.Array  # [B, E] stop ids (-1 = unused)
    budget: jax.Array  # [B] new-token budget (0: the row is done at once)
    params: RowParams  # per-row sampling values
    keys: jax.Array  # [B] PRNG keys: row r draws its output token t with fold_in(keys[r], offsets[r] + t)
    offsets: jax.Array  # [B] output tokens each row drew before this call (its own step counter's start)


def row_keys(rng: jax.Array, row_seeds: jax.Array | None, rows: int) -> jax.Array:
    """[B] per-row keys fold_in(rng, row_seeds[r]) (default row seeds: 0..B-1).

    A row's draws depend on its key only, so a row samples the same tokens whichever rows share
    its batch (`sampling.engine`).
    """
    if row_seeds is None:
        row_seeds = jnp.arange(rows, dtype=jnp.uint32)
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(rng, row_seeds)


def _slot_keys(rows: Rows, counts: jax.Array) -> jax.Array:
    """[B] keys of each row's next draw: fold_in(keys[r], offsets[r] + counts[r]), counts [B] the
    tokens the row drew in this call. A row's t-th token thus depends on its key and t only, not
    on the slot, segment or call it is drawn in (a sliced or resumed decode draws what one call
    would)."""
    return jax.vmap(jax.random.fold_in)(rows.keys, (rows.offsets + counts).astype(jnp.uint32))


def _finished(tok: jax.Array, lengths: jax.Array, rows: Rows) -> jax.Array:
    """[B] FINISH_STOP where tok is a stop id, else FINISH_LENGTH where the budget is spent, else 0."""
    stop = jnp.any(tok[:, None] == rows.stop_ids, axis=-1)
    return jnp.where(stop, FINISH_STOP, jnp.where(lengths >= rows.budget, FINISH_LENGTH, 0))


def _record(state: DecodeState, live: jax.Array, tok: jax.Array, lp: jax.Array, rows: Rows) -> DecodeState:
    """Writes the live rows' token at slot `step` and updates lengths and finish reasons."""
    s = state.step
    lengths = state.lengths + live.astype(jnp.int32)
    return state.replace(
        step=s + 1, last=jnp.where(live, tok, state.last),
        tokens=state.tokens.at[:, s].set(jnp.where(live, tok, 0)),
        logprobs=state.logprobs.at[:, s].set(jnp.where(live, lp, 0.0)),
        lengths=lengths, finish=jnp.where(live, _finished(tok, lengths, rows), state.finish))


def init_state(cache: KVCache, logits: jax.Array, rows: Rows, method: Method, max_new: int) -> DecodeState:
    """The state after sampling each row's first token from `logits` [B, 1, V] (its last fed token's)."""
    b = logits.shape[0]
    tok, lp = method(logits[:, 0], _slot_keys(rows, jnp.zeros((b,), jnp.int32)), rows.params)
    active = rows.budget > 0
    empty = DecodeState(step=jnp.int32(0), cache=cache, last=tok, tokens=jnp.zeros((b, max_new), jnp.int32),
                        logprobs=jnp.zeros((b, max_new), jnp.float32), lengths=jnp.zeros((b,), jnp.int32),
                        finish=jnp.zeros((b,), jnp.int32))
    state = _record(empty, active, tok, lp, rows)
    return state.replace(finish=jnp.where(active, state.finish, FINISH_LENGTH))


def decode(params: Params, cfg: ModelConfig, cache: KVCache, logits: jax.Array, rows: Rows, *,
           method: Method, max_new: int) -> DecodeState:
    """The decode loop of `generate_tokens` (call inside jit).

    Samples each row's first token from `logits`, then feeds every sampled token back at the next
    position until each row has hit a stop id or spent its budget. The last sampled token of a
    row is never written to the cache.

    Args:
      cache: the cache holding everything fed so far (room for max_new - 1 more slots).
      logits: [B, 1, V] fp32 logits of each row's last fed token.
      rows: the per-row constants (keys included); method: the sampling method (static).
      max_new: static size of the output buffers.

    Returns:
      The final DecodeState (tokens [B, N], logprobs, lengths, finish, last, cache).
    """

    def cond(state: DecodeState) -> jax.Array:
        return (state.step < max_new) & jnp.any(state.finish == 0)

    def body(state: DecodeState) -> DecodeState:
        live = state.finish == 0
        pos = (rows.next_pos + state.step - 1)[:, None]
        logits, _, cache = forward(params, cfg, state.last[:, None], pos, live[:, None], state.cache, logits="last")
        tok, lp = method(logits[:, 0], _slot_keys(rows, state.lengths), rows.params)  # live rows: lengths == step
        return _record(state.replace(cache=cache), live, tok, lp, rows)

    return jax.lax.while_loop(cond, body, init_state(cache, logits, rows, method, max_new))


def _outputs(state: DecodeState) -> dict[str, jax.Array]:
    return {"tokens": state.tokens, "logprobs": state.logprobs, "lengths": state.lengths, "finish": state.finish}


def _constrain(cache: KVCache, mesh: Any) -> KVCache:
    """The cache laid out by the KV-cache partition rules (`parallel.CACHE_RULES`) on `mesh` (None: as is)."""
    if mesh is None:
        return cache
    return jax.lax.with_sharding_constraint(cache, cache_shardings(mesh, cache))


def _weights(params: Params, cfg: ModelConfig, fuse: bool, dparams: Params | None) -> Params:
    if dparams is not None:
        return dparams
    return decode_params(params, cfg) if fuse else params


@functools.partial(jax.jit, static_argnames=("cfg", "max_new", "method", "fuse", "mesh"),
                   compiler_options=_DECODE_OPTIONS)
def generate_tokens(params: Params, cfg: ModelConfig, tokens: jax.Array, token_mask: jax.Array, rng: jax.Array,
                    stop_ids: jax.Array, max_new_per_row: jax.Array, row_params: RowParams, *, max_new: int,
                    method: Method, fuse: bool = False, dparams: Params | None = None, mesh: Any = None,
                    row_source: jax.Array | None = None, row_seeds: jax.Array | None = None
                    ) -> dict[str, jax.Array]:
    """The jitted sampler.

    Args:
      tokens: [B, P] left-padded prompt ids ([U, P] distinct prompts with `row_source`);
        token_mask: the same shape, real tokens.
      rng: a PRNG key; stop_ids: [B, E] stop ids per row (-1 = unused).
      max_new_per_row: [B] new-token budget per row (<= max_new; 0 = row is done at once).
      row_params: [B] per-row temperature / top_k / top_p; method: the sampling method (static).
      max_new: static size of the output buffers (the cache holds P + max_new slots).
      fuse: decode with `decode_params` (fused Q/K/V and gate/up, a row-major head): faster on
        CPU, at the cost of a second copy of the weights during the call.
      dparams: `decode_params(params, cfg)` made once by the caller (`Sampler.decode_weights`);
        it replaces `params` and spares the call the concatenations (~0.25 s for the embedded
        model on 2 CPU cores).
      mesh: the mesh of a sharded call (static): the KV cache follows `parallel.CACHE_RULES`
        (rows over data x fsdp, KV heads over tensor).
      row_source: optional [B] int, the prompt row (of U) each output row continues: each distinct
        prompt is prefilled once and its cache and last logits copied to its rows (a GRPO group's
        G completions share one prompt). Without it, row i continues prompt i.
      row_seeds: optional [B] uint32: row r samples with key fold_in(rng, row_seeds[r]) (`row_keys`;
        default: the row index).

    Returns:
      tokens [B, N], logprobs [B, N], lengths [B], finish [B] (1 stop, 2 length).
    """
    u, p = tokens.shape
    params = _weights(params, cfg, fuse, dparams)
    cache = jax.lax.optimization_barrier(init_cache(cfg, u, p + max_new))  # no constant folding
    if row_source is None:
        cache = _constrain(cache, mesh)
    logits, _, cache = forward(params, cfg, tokens, positions_from_mask(token_mask), token_mask, cache,
                               logits="last", fresh=True)  # logits [U, 1, V]; the empty cache: self-attention
    prompt_len = jnp.sum(token_mask, axis=-1).astype(jnp.int32)  # [U]
    if row_source is not None:  # [U] prompts -> [B] rows
        cache = _constrain(KVCache(cache.k[:, row_source], cache.v[:, row_source], cache.valid[row_source],
                                   cache.index), mesh)
        logits, prompt_len = logits[row_source], prompt_len[row_source]
    keys = row_keys(rng, row_seeds, max_new_per_row.shape[0])
    rows = Rows(prompt_len, stop_ids, max_new_per_row, row_params, keys, jnp.zeros(max_new_per_row.shape, jnp.int32))
    state = decode(params, cfg, cache, logits, rows, method=method, max_new=max_new)
    return _outputs(state)


decode_params_jit = jax.jit(decode_params, static_argnames=("cfg",))
