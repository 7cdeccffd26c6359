"""The slot engine's device programs: W decode slots, filled with waiting rows as rows finish.

A chunked decode ran each chunk of rows in one `lax.while_loop` until its longest row was done:
a finished row kept its place and ran every step to the end. Here W slots hold rows; three
jitted programs (JetStream's prefill / insert / generate split) share one donated `SlotState`:

  * `admit`: prefills n waiting rows' prompts (u distinct ones: a GRPO group's G rows share one
    prefill), samples their first tokens and writes them into n free slots (their KV at slots
    [0, P) of each slot's cache, P the admitted prompts' own bucket; the slot's write index at P);
  * `segment`: up to K decode steps of every live slot, each row writing at its own cache index
    (`KVCache.index` per row) and drawing its t-th token with fold_in(key_r, t) (`kernels._slot_keys`);
    it returns early once `min_free` slots are free, so the host can refill them, and counts what
    it executed;
  * `compact`: gathers the live slots into a narrower state once no row waits (the tail of a call
    runs at the width of its live rows, not of the call).

The host side (`sampling.scheduler`) admits and collects between programs. A row's tokens depend
on its prompt, key and budget only: not on its slot, its batch-mates, W or K
(tests/test_slots.py). A step's attention reads the cache up to the largest write index of the
live slots (`models.cache_attention`), and finished slots stop growing.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from jaxrl_mt.models.cache_attention import read_length
from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import KVCache, Params, forward, init_cache, positions_from_mask, read_bound
from jaxrl_mt.models.prefix_attention import PrefixCache
from jaxrl_mt.sampling.kernels import _DECODE_OPTIONS, FINISH_LENGTH, Method, Rows, _finished, _slot_keys
from jaxrl_mt.sampling.methods import RowParams

# what a segment executed: decode steps, row-steps, row-steps of live rows, cache slots read, live slots
STAT_KEYS = ("steps", "row_steps", "live_row_steps", "slots_read", "live_slots")


@flax.struct.dataclass
class SlotState:
    """W decode slots (N: the output buffer of a slot, S: its cache slots)."""

    cache: KVCache  # [L, W, Hkv, S, K], index [W]
    pos: jax.Array  # [W] RoPE position of `last`
    last: jax.Array  # [W] last sampled token (not in the cache)
    count: jax.Array  # [W] tokens drawn by the slot's row
    live: jax.Array  # [W] bool: the row still generates
    finish: jax.Array  # [W] 0 running, FINISH_STOP, FINISH_LENGTH
    tokens: jax.Array  # [W, N]
    logprobs: jax.Array  # [W, N]
    rows: Rows  # per-slot constants (next_pos: the first new token's position, copied to `pos` on admission)
    shared: KVCache | None = None  # prompts stored once per group [L, U, Hkv, P, K] (`admit_shared`); index unused


def state_shardings(mesh: Any, state: SlotState) -> SlotState:
    """The shardings of a slot state on `mesh`: the cache by `parallel.CACHE_RULES`, every per-slot
    array's slot axis over (data, fsdp) (works on abstract arrays: callable inside jit)."""
    from jax.sharding import NamedSharding, PartitionSpec

    from jaxrl_mt.parallel import batch_sharding, cache_shardings, row_shards

    n = row_shards(mesh)

    def rows(a: Any) -> NamedSharding:
        split = a.ndim and a.shape[0] % n == 0
        return batch_sharding(mesh, a.ndim) if split else NamedSharding(mesh, PartitionSpec())

    out = jax.tree_util.tree_map(rows, state.replace(cache=None, shared=None))
    shared = None if state.shared is None else cache_shardings(mesh, state.shared)
    return out.replace(cache=cache_shardings(mesh, state.cache), shared=shared)


def _laid_out(state: SlotState, mesh: Any) -> SlotState:
    """`state` constrained to `state_shardings` (inside jit; no mesh: as is)."""
    return state if mesh is None else jax.lax.with_sharding_constraint(state, state_shardings(mesh, state))


def empty_slots(cfg: ModelConfig, width: int, cache_len: int, max_new: int, stop_width: int,
                mesh: Any = None, shared: tuple[int, int] | None = None) -> SlotState:
    """W free slots with caches of `cache_len` slots and output buffers of `max_new` tokens (placed on
    `mesh` by `state_shardings` when given; a mesh over several processes: made in place by a
    program, `_empty_on`); `shared` = (U, P): a store of U prompts of P slots read once per group
    (`admit_shared`)."""
    from jaxrl_mt.parallel import spans_processes

    if spans_processes(mesh):
        return _empty_on(cfg, width, cache_len, max_new, stop_width, shared, mesh)
    state = _empty(cfg, width, cache_len, max_new, stop_width, shared)
    return state if mesh is None else jax.device_put(state, state_shardings(mesh, state))


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5, 6))
def _empty_on(cfg: ModelConfig, width: int, cache_len: int, max_new: int, stop_width: int,
              shared: tuple[int, int] | None, mesh: Any) -> SlotState:
    """`_empty` made on `mesh` by `state_shardings` (a collective program: no host array to place)."""
    return _laid_out(_empty(cfg, width, cache_len, max_new, stop_width, shared), mesh)


def _empty(cfg: ModelConfig, width: int, cache_len: int, max_new: int, stop_width: int,
           shared: tuple[int, int] | None) -> SlotState:
    """The free slots of `empty_slots`, unplaced."""
    c = init_cache(cfg, width, cache_len)

    def zi():  # a fresh buffer each: the programs donate the state, and a buffer may be donated once
        return jnp.zeros((width,), jnp.int32)

    rp = RowParams(jnp.zeros((width,), jnp.float32), zi(), jnp.ones((width,), jnp.float32))
    rows = Rows(zi(), -jnp.ones((width, stop_width), jnp.int32), zi(), rp,
                jax.random.split(jax.random.PRNGKey(0), width), zi())
    store = None
    if shared is not None:
        sc = init_cache(cfg, *shared)
        store = KVCache(sc.k, sc.v, sc.valid, jnp.zeros((shared[0],), jnp.int32))
    return SlotState(KVCache(c.k, c.v, c.valid, zi()), zi(), zi(), zi(), jnp.zeros((width,), bool), zi(),
                     jnp.zeros((width, max_new), jnp.int32), jnp.zeros((width, max_new), jnp.float32), rows, store)


def _put(a: jax.Array, slots: jax.Array, x: jax.Array, axis: int = 0) -> jax.Array:
    """a with x written at `slots` along `axis` (slots >= a.shape[axis]: dropped, the padding rows)."""
    idx = (slice(None),) * axis + (slots,)
    return a.at[idx].set(x, mode="drop")


@functools.partial(jax.jit, static_argnames=("cfg", "method", "mesh"), donate_argnames=("state",),
                   compiler_options=_DECODE_OPTIONS)
def admit(params: Params, cfg: ModelConfig, state: SlotState, slots: jax.Array, tokens: jax.Array,
          mask: jax.Array, rows: Rows, source: jax.Array, *, method: Method, mesh: Any = None) -> SlotState:
    """Prefills u prompts and writes n rows continuing them into `slots` [n] (W or more: a padding
    row, dropped).

    Args:
      tokens, mask: [u, P] left-padded prompts (P <= the slots' cache length).
      rows: the n rows' constants (keys: their own, offsets: tokens drawn before).
      source: [n] int, the prompt (of u) row i continues.
    """
    n = source.shape[0]
    p = tokens.shape[1]
    cache = jax.lax.optimization_barrier(init_cache(cfg, tokens.shape[0], p))
    logits, _, cache = forward(params, cfg, tokens, positions_from_mask(mask), mask, cache, logits="last", fresh=True)
    logits, mask, ck, cv = logits[source], mask[source], cache.k[:, source], cache.v[:, source]
    c = state.cache
    valid = jnp.concatenate([mask.astype(bool), jnp.zeros((n, c.valid.shape[1] - p), bool)], axis=1)
    # slots [0, P) of each admitted slot; the rest keeps the previous row's (finite) values, never seen
    new_cache = KVCache(c.k.at[:, slots, :, :p].set(ck.astype(c.k.dtype), mode="drop"),
                        c.v.at[:, slots, :, :p].set(cv.astype(c.v.dtype), mode="drop"),
                        _put(c.valid, slots, valid), _put(c.index, slots, jnp.full((n,), p, jnp.int32)))
    return _seat(state, slots, rows, logits[:, 0], method, new_cache, state.shared, mesh)


@functools.partial(jax.jit, static_argnames=("cfg", "method", "mesh"), donate_argnames=("state",),
                   compiler_options=_DECODE_OPTIONS)
def extend(params: Params, cfg: ModelConfig, state: SlotState, slots: jax.Array, positions: jax.Array,
           tokens: jax.Array, mask: jax.Array, rows: Rows, *, method: Method, mesh: Any = None) -> SlotState:
    """Appends a segment to the cached context of the rows held in `slots` [n] (W or more: a padding
    row, dropped) and seats their next replies: a conversation's next turn, its earlier turns read
    from its slot's cache, not prefilled again.

    Args:
      positions: [n] RoPE position of each segment's first token (the tokens in the row's context).
      tokens, mask: [n, T] left-padded segments, written at each slot's own cache index (the padding
        slots stay holes, never read); the slots need room for T + the reply's tokens.
      rows: the n rows' constants (next_pos: positions + segment lengths).
    """
    c = state.cache
    at = jnp.minimum(slots, c.index.shape[0] - 1)  # padding rows read a real slot; their write is dropped
    mine = KVCache(c.k[:, at], c.v[:, at], c.valid[at], c.index[at])
    seg_pos = positions[:, None] + positions_from_mask(mask)
    logits, _, mine = forward(params, cfg, tokens, seg_pos, mask, mine, logits="last")
    cache = KVCache(c.k.at[:, slots].set(mine.k, mode="drop"), c.v.at[:, slots].set(mine.v, mode="drop"),
                    _put(c.valid, slots, mine.valid), _put(c.index, slots, mine.index))
    return _seat(state, slots, rows, logits[:, 0], method, cache, state.shared, mesh)


@functools.partial(jax.jit, static_argnames=("length", "mesh"))  # no donation: no buffer of the old size is reused
def widen(state: SlotState, *, length: int, mesh: Any = None) -> SlotState:
    """`state` with caches of `length` slots (>= the current S): the new slots empty."""
    c = state.cache
    more = length - c.valid.shape[1]
    pad = ((0, 0), (0, 0), (0, 0), (0, more), (0, 0))
    cache = KVCache(jnp.pad(c.k, pad), jnp.pad(c.v, pad), jnp.pad(c.valid, ((0, 0), (0, more))), c.index)
    return _laid_out(state.replace(cache=cache), mesh)


def _seat(state: SlotState, slots: jax.Array, rows: Rows, logits: jax.Array, method: Method, cache: KVCache,
          shared: KVCache | None, mesh: Any) -> SlotState:
    """The state with n admitted rows in `slots`: their first tokens drawn from `logits` [n, V] (each
    row's key at count 0), their constants, outputs and live flags written; `cache` and `shared`
    already hold their context."""
    n = logits.shape[0]
    tok, lp = method(logits, _slot_keys(rows, jnp.zeros((n,), jnp.int32)), rows.params)
    active = rows.budget > 0
    finish = jnp.where(active, _finished(tok, jnp.ones((n,), jnp.int32), rows), FINISH_LENGTH)
    out = jnp.zeros((n, state.tokens.shape[1]), jnp.int32).at[:, 0].set(jnp.where(active, tok, 0))
    outlp = jnp.zeros((n, state.tokens.shape[1]), jnp.float32).at[:, 0].set(jnp.where(active, lp, 0.0))
    put = functools.partial(_put, slots=slots)
    return _laid_out(SlotState(cache, put(state.pos, x=rows.next_pos), put(state.last, x=tok),
                               put(state.count, x=active.astype(jnp.int32)), put(state.live, x=finish == 0),
                               put(state.finish, x=finish), put(state.tokens, x=out), put(state.logprobs, x=outlp),
                               jax.tree_util.tree_map(lambda a, x: _put(a, slots, x), state.rows, rows), shared), mesh)


@functools.partial(jax.jit, static_argnames=("cfg", "method", "mesh"), donate_argnames=("state",),
                   compiler_options=_DECODE_OPTIONS)
def admit_shared(params: Params, cfg: ModelConfig, state: SlotState, slots: jax.Array, stored: jax.Array,
                 tokens: jax.Array, mask: jax.Array, rows: Rows, source: jax.Array, *, method: Method,
                 mesh: Any = None) -> SlotState:
    """`admit` of groups whose prompt is stored once: the u prompts' KV go to the store's places
    `stored` [u] (U or more: padding, dropped); each of the n rows starts with an empty own cache."""
    n, p = source.shape[0], tokens.shape[1]
    cache = jax.lax.optimization_barrier(init_cache(cfg, tokens.shape[0], p))
    logits, _, cache = forward(params, cfg, tokens, positions_from_mask(mask), mask, cache, logits="last", fresh=True)
    st, c = state.shared, state.cache
    valid = jnp.concatenate([mask.astype(bool), jnp.zeros((mask.shape[0], st.valid.shape[1] - p), bool)], axis=1)
    store = KVCache(st.k.at[:, stored, :, :p].set(cache.k.astype(st.k.dtype), mode="drop"),
                    st.v.at[:, stored, :, :p].set(cache.v.astype(st.v.dtype), mode="drop"),
                    _put(st.valid, stored, valid), st.index)
    own = KVCache(c.k, c.v, _put(c.valid, slots, jnp.zeros((n, c.valid.shape[1]), bool)),
                  _put(c.index, slots, jnp.zeros((n,), jnp.int32)))
    return _seat(state, slots, rows, logits[source][:, 0], method, own, store, mesh)


def _step(params: Params, cfg: ModelConfig, st: SlotState, method: Method,
          tables: tuple[jax.Array, jax.Array, jax.Array] | None = None) -> tuple[SlotState, jax.Array]:
    """One decode step of the live slots, and what it executed ([5] int32, `STAT_KEYS` but steps)."""
    w = st.live.shape[0]
    live = st.live
    read = w * read_length(read_bound(st.cache.index, live[:, None]), st.cache.valid.shape[1])
    context = jnp.sum(jnp.where(live, jnp.sum(st.cache.valid, axis=-1, dtype=jnp.int32), 0))
    prefix = None
    if st.shared is not None:  # every stored prompt read once; a prompt with a live row is live context
        prefix = PrefixCache(st.shared.k, st.shared.v, st.shared.valid, *tables)
        u, p = st.shared.valid.shape
        read += u * p
        held = jnp.zeros((u + 1,), jnp.int32).at[jnp.minimum(tables[0], u)].max(live.astype(jnp.int32))[:u] > 0
        context += jnp.sum(jnp.where(held, jnp.sum(st.shared.valid, axis=-1, dtype=jnp.int32), 0))
    stats = jnp.stack([jnp.int32(1), jnp.int32(w), jnp.sum(live, dtype=jnp.int32), read, context])
    logits, _, cache = forward(params, cfg, st.last[:, None], st.pos[:, None], live[:, None], st.cache,
                               logits="last", prefix=prefix)
    cache = cache._replace(index=st.cache.index + live.astype(jnp.int32))  # finished slots stop growing
    tok, lp = method(logits[:, 0], _slot_keys(st.rows, st.count), st.rows.params)
    count = st.count + live.astype(jnp.int32)
    col = jnp.minimum(st.count, st.tokens.shape[1] - 1)
    ar = jnp.arange(w)
    fin = jnp.where(live, _finished(tok, count, st.rows), st.finish)
    return st.replace(
        cache=cache, pos=st.pos + live, last=jnp.where(live, tok, st.last), count=count,
        tokens=st.tokens.at[ar, col].set(jnp.where(live, tok, st.tokens[ar, col])),
        logprobs=st.logprobs.at[ar, col].set(jnp.where(live, lp, st.logprobs[ar, col])),
        finish=fin, live=live & (fin == 0)), stats


@functools.partial(jax.jit, static_argnames=("cfg", "method", "steps", "mesh"), donate_argnames=("state",),
                   compiler_options=_DECODE_OPTIONS)
def segment(params: Params, cfg: ModelConfig, state: SlotState, min_free: jax.Array,
            tables: tuple[jax.Array, jax.Array, jax.Array] | None = None, *, method: Method, steps: int,
            mesh: Any = None) -> tuple[SlotState, jax.Array]:
    """At least one and up to `steps` decode steps of the live slots; stops early once `min_free` slots
    are not live (or none is). With stored prompts (`state.shared`), `tables` = (pid [W], gpos [W],
    members [U, G]): which stored prompt each slot's row continues (`models.prefix_attention`).

    Returns:
      The state and [5] int32 counts of what ran (`STAT_KEYS`).
    """

    def cond(carry):
        i, st, _ = carry
        return (i < steps) & jnp.any(st.live) & ((i == 0) | (jnp.sum(~st.live) < min_free))

    def body(carry):
        i, st, total = carry
        st, stats = _step(params, cfg, st, method, tables)
        return i + 1, _laid_out(st, mesh), total + stats

    _, state, total = jax.lax.while_loop(cond, body, (jnp.int32(0), state, jnp.zeros((len(STAT_KEYS),), jnp.int32)))
    return state, total


@functools.partial(jax.jit, static_argnames=("mesh",))
def compact(state: SlotState, keep: jax.Array, *, mesh: Any = None) -> SlotState:
    """The slots `keep` [W'] of `state`, in that order: a state of width W' (the cache's row axis is 1)."""
    cache = state.cache
    narrow = KVCache(cache.k[:, keep], cache.v[:, keep], cache.valid[keep], cache.index[keep])
    fields = ("pos", "last", "count", "live", "finish", "tokens", "logprobs", "rows")
    rest = jax.tree_util.tree_map(lambda a: a[keep], {f: getattr(state, f) for f in fields})
    return _laid_out(SlotState(narrow, **rest, shared=state.shared), mesh)  # stored prompts stay in place
