"""The slot engine: a fixed width of decode slots, refilled with waiting rows as rows finish.

A call of `Sampler.generate_ids` used to run each chunk of rows in one `lax.while_loop` until its
longest row was done: a finished row kept its place and ran every step to the end. Here W slots
hold rows; three jitted programs (JetStream's prefill / insert / generate split) share one
`SlotState`:

  * `admit`: prefills n waiting rows (fresh caches of P slots), samples their first tokens and
    writes them into n free slots (their KV at slots [0, P) of each slot's cache, the slot's write
    index at P);
  * `segment`: up to K decode steps of every live slot, each row writing at its own cache index
    (`KVCache.index` per row) and drawing its t-th token with fold_in(key_r, t) (`kernels._slot_keys`);
    it returns early once `min_free` slots are free, so the host can refill them;
  * the host (`run_slots`) admits waiting rows into free slots between segments and collects
    finished rows.

A row's tokens depend on its prompt, key and budget only: not on its slot, its batch-mates or W
and K (tests/test_slots.py). The attention of a step reads the cache up to the largest write
index of the slots (`models.cache_attention`), and finished slots stop growing.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mt.chat import left_pad
from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import KVCache, Params, forward, init_cache, positions_from_mask
from jaxrl_mt.sampling.kernels import _DECODE_OPTIONS, FINISH_LENGTH, Method, Rows, _finished, _slot_keys, row_keys
from jaxrl_mt.sampling.methods import RowParams


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


def empty_slots(cfg: ModelConfig, width: int, cache_len: int, max_new: int, stop_width: int) -> SlotState:
    """W free slots with caches of `cache_len` slots and output buffers of `max_new` tokens."""
    c = init_cache(cfg, width, cache_len)

    def zi():  # a fresh buffer each: the programs donate the state, and a buffer may be donated once
        return jnp.zeros((width,), jnp.int32)

    rp = RowParams(jnp.zeros((width,), jnp.float32), zi(), jnp.ones((width,), jnp.float32))
    rows = Rows(zi(), -jnp.ones((width, stop_width), jnp.int32), zi(), rp,
                jax.random.split(jax.random.PRNGKey(0), width), zi())
    return SlotState(KVCache(c.k, c.v, c.valid, zi()), zi(), zi(), zi(), jnp.zeros((width,), bool), zi(),
                     jnp.zeros((width, max_new), jnp.int32), jnp.zeros((width, max_new), jnp.float32), rows)


def _put(a: jax.Array, slots: jax.Array, x: jax.Array, axis: int = 0) -> jax.Array:
    """a with x written at `slots` along `axis` (slots >= a.shape[axis]: dropped, the padding rows)."""
    idx = (slice(None),) * axis + (slots,)
    return a.at[idx].set(x, mode="drop")


@functools.partial(jax.jit, static_argnames=("cfg", "method"), donate_argnames=("state",),
                   compiler_options=_DECODE_OPTIONS)
def admit(params: Params, cfg: ModelConfig, state: SlotState, slots: jax.Array, tokens: jax.Array,
          mask: jax.Array, rows: Rows, *, method: Method) -> SlotState:
    """Prefills n rows and writes them into `slots` [n] (W or more: a padding row, dropped).

    Args:
      tokens, mask: [n, P] left-padded prompts (P <= the slots' cache length).
      rows: the n rows' constants (keys: their own, offsets: tokens drawn before).
    """
    n, p = tokens.shape
    cache = jax.lax.optimization_barrier(init_cache(cfg, n, p))
    logits, _, cache = forward(params, cfg, tokens, positions_from_mask(mask), mask, cache, logits="last", fresh=True)
    tok, lp = method(logits[:, 0], _slot_keys(rows, jnp.zeros((n,), jnp.int32)), rows.params)
    active = rows.budget > 0
    finish = jnp.where(active, _finished(tok, jnp.ones((n,), jnp.int32), rows), FINISH_LENGTH)
    c = state.cache
    valid = jnp.concatenate([mask.astype(bool), jnp.zeros((n, c.valid.shape[1] - p), bool)], axis=1)
    # slots [0, P) of each admitted slot; the rest keeps the previous row's (finite) values, never seen
    new_cache = KVCache(c.k.at[:, slots, :, :p].set(cache.k.astype(c.k.dtype), mode="drop"),
                        c.v.at[:, slots, :, :p].set(cache.v.astype(c.v.dtype), mode="drop"),
                        _put(c.valid, slots, valid), _put(c.index, slots, jnp.full((n,), p, jnp.int32)))
    out = jnp.zeros((n, state.tokens.shape[1]), jnp.int32).at[:, 0].set(jnp.where(active, tok, 0))
    outlp = jnp.zeros((n, state.tokens.shape[1]), jnp.float32).at[:, 0].set(jnp.where(active, lp, 0.0))
    put = functools.partial(_put, slots=slots)
    return SlotState(new_cache, put(state.pos, x=rows.next_pos), put(state.last, x=tok),
                     put(state.count, x=active.astype(jnp.int32)), put(state.live, x=finish == 0),
                     put(state.finish, x=finish), put(state.tokens, x=out), put(state.logprobs, x=outlp),
                     jax.tree_util.tree_map(lambda a, x: _put(a, slots, x), state.rows, rows))


@functools.partial(jax.jit, static_argnames=("cfg", "method", "steps"), donate_argnames=("state",),
                   compiler_options=_DECODE_OPTIONS)
def segment(params: Params, cfg: ModelConfig, state: SlotState, min_free: jax.Array, *, method: Method,
            steps: int) -> SlotState:
    """Up to `steps` decode steps of the live slots; stops early once `min_free` slots are not live."""
    w = state.live.shape[0]

    def cond(carry):
        i, st = carry
        return (i < steps) & jnp.any(st.live) & (jnp.sum(~st.live) < min_free)

    def body(carry):
        i, st = carry
        live = st.live
        logits, _, cache = forward(params, cfg, st.last[:, None], st.pos[:, None], live[:, None], st.cache,
                                   logits="last")
        cache = cache._replace(index=st.cache.index + live.astype(jnp.int32))  # finished slots stop growing
        tok, lp = method(logits[:, 0], _slot_keys(st.rows, st.count), st.rows.params)
        count = st.count + live.astype(jnp.int32)
        col = jnp.minimum(st.count, st.tokens.shape[1] - 1)
        ar = jnp.arange(w)
        fin = jnp.where(live, _finished(tok, count, st.rows), st.finish)
        return i + 1, st.replace(
            cache=cache, pos=st.pos + live, last=jnp.where(live, tok, st.last), count=count,
            tokens=st.tokens.at[ar, col].set(jnp.where(live, tok, st.tokens[ar, col])),
            logprobs=st.logprobs.at[ar, col].set(jnp.where(live, lp, st.logprobs[ar, col])),
            finish=fin, live=live & (fin == 0))

    return jax.lax.while_loop(cond, body, (jnp.int32(0), state))[1]


def run_slots(params: Params, cfg: ModelConfig, prompts: Sequence[Sequence[int]], budgets: np.ndarray,
              stops: np.ndarray, row_params: RowParams, key: jax.Array, row_seeds: np.ndarray, *, method: Method,
              pad_id: int, width: int, steps: int, prompt_bucket: int, max_new: int) -> dict[str, Any]:
    """Generates every row through W slots, refilling freed slots between segments.

    Args:
      prompts: R token-id prompts; budgets: [R]; stops: [R, E]; row_params: [R] values;
      key: the call's PRNG key; row_seeds: [R] (row r draws with fold_in(fold_in(key, seed_r), t)).
      width: W; steps: K, decode steps per segment; prompt_bucket: the widest prompt (slots hold
        prompt_bucket + max_new cache slots); max_new: the output buffer.

    Returns:
      {tokens [R, max_new], logprobs, lengths [R], finish [R], counters {segments, row_steps,
      live_row_steps}}.
    """
    n_rows = len(prompts)
    keys = np.asarray(row_keys(key, jnp.asarray(row_seeds, jnp.uint32), n_rows))
    state = empty_slots(cfg, width, prompt_bucket + max_new, max_new, stops.shape[1])
    owner = np.full(width, -1)  # row held by each slot
    out_t, out_lp = np.zeros((n_rows, max_new), np.int32), np.zeros((n_rows, max_new), np.float32)
    lengths, finish = np.zeros(n_rows, np.int32), np.zeros(n_rows, np.int32)
    waiting, done = list(range(n_rows)), 0
    counters = {"segments": 0, "row_steps": 0, "live_row_steps": 0}
    while done < n_rows:
        free = [i for i in range(width) if owner[i] < 0]
        if waiting and free:
            state = _admit(params, cfg, state, free, waiting[: len(free)], prompts, budgets, stops, row_params,
                           keys, method, pad_id, prompt_bucket)
            for slot, r in zip(free, waiting[: len(free)]):
                owner[slot] = r
            waiting = waiting[len(free):]
        before = np.asarray(state.count)
        min_free = min(width, max(1, width // 4)) if waiting else width + 1
        state = segment(params, cfg, state, jnp.int32(min_free), method=method, steps=steps)
        live, count, fin = (np.asarray(x) for x in (state.live, state.count, state.finish))
        counters["segments"] += 1
        counters["live_row_steps"] += int((count - before)[owner >= 0].sum())
        counters["row_steps"] += width * int((count - before).max(initial=0))
        ended = [i for i in range(width) if owner[i] >= 0 and not live[i]]
        if ended:
            toks, lps = np.asarray(state.tokens), np.asarray(state.logprobs)
            for i in ended:
                r = owner[i]
                out_t[r], out_lp[r], lengths[r], finish[r] = toks[i], lps[i], count[i], fin[i]
                owner[i], done = -1, done + 1
    return {"tokens": out_t, "logprobs": out_lp, "lengths": lengths, "finish": finish, "counters": counters}


def _admit(params, cfg, state, free, rows, prompts, budgets, stops, row_params, keys, method, pad_id, pb):
    """`admit` of `rows` into the first len(rows) of `free`, padded to a power of two of rows."""
    n = len(rows)
    nb = 1 << (n - 1).bit_length()
    slots = np.full(nb, state.live.shape[0], np.int32)  # padding rows: out of range, dropped
    slots[:n] = free[:n]
    pick = np.asarray(rows + [rows[0]] * (nb - n))
    tokens, mask = left_pad([list(prompts[r]) for r in pick], pad_id, pb)
    rp = jax.tree_util.tree_map(lambda x: jnp.asarray(np.asarray(x)[pick]), row_params)
    plen = np.asarray([len(prompts[r]) for r in pick], np.int32)
    zero = np.zeros(nb, np.int32)
    rows_c = Rows(jnp.asarray(plen), jnp.asarray(stops[pick]), jnp.asarray(np.asarray(budgets, np.int32)[pick]), rp,
                  jnp.asarray(keys[pick]), jnp.asarray(zero))
    return admit(params, cfg, state, jnp.asarray(slots), jnp.asarray(tokens), jnp.asarray(mask), rows_c,
                 method=method)
