"""Conversations on the slot engine: a slot holds a conversation across its turns.

`run_turns` drives the programs of `sampling.slots` for conversations that proceed apart, not in
lockstep. A conversation enters a free slot with its first prompt (`admit`); when its reply ends,
the caller's `advance` hook (the user's next message, the judges) gives its next segment: the
template text between the reply and the next generation prompt, appended to the same slot's cache
(`extend`), so its earlier turns are read from the cache, not prefilled again. A conversation the
hook does not continue frees its slot for the next waiting one; only conversations in flight hold
a cache. Segments return once an eighth of the slots has stopped, so a finished reply waits at most
that long for its next turn; once no conversation waits, the slots narrow as in `run_slots`.

A reply's tokens depend on its conversation's context, its row seed and the budget only (keys as
`sampling.kernels._slot_keys`), not on its slot, its batch-mates or when it ran. A slot's cache
grows (`widen`, powers of two) when a conversation outgrows it; left-padded segments leave holes
of at most their bucket's padding, never read.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mt.batching import bucket
from jaxrl_mt.chat import left_pad
from jaxrl_mt.models.decoder import Params
from jaxrl_mt.sampling.kernels import FINISH_NAMES, Rows, row_keys
from jaxrl_mt.sampling.methods import SamplingConfig
from jaxrl_mt.sampling.scheduler import _fit, _narrow, slot_widths
from jaxrl_mt.sampling.slots import STAT_KEYS, admit, empty_slots, extend, segment, widen


@dataclasses.dataclass(frozen=True)
class Feed:
    """What a conversation appends to its context before its next reply."""

    conv: int  # the conversation (the caller's index)
    tokens: Sequence[int]  # the segment (fresh: the whole prompt)
    seed: int  # the reply's row seed: its key is fold_in(key(seed), row seed)
    fresh: bool = False  # start the context over (a cached one is dropped)


@dataclasses.dataclass
class Reply:
    """A reply that ended, as `advance` sees it."""

    conv: int
    tokens: list[int]
    logprobs: np.ndarray
    finish: str  # "stop" | "length"
    context: int  # tokens of its context before the reply (cached + segment)
    pending: int  # its last token: not in the cache (feed it in the next segment, or drop it)


Advance = Callable[[list[Reply]], list[Feed]]


class _Slots:
    """The host's view of the slots: who holds each, and each conversation's context length."""

    def __init__(self, width: int):
        self.owner = np.full(width, -1)  # conversation held by each slot
        self.context: dict[int, int] = {}  # conversation -> tokens in its context (= its next RoPE position)

    def slot_of(self, conv: int) -> int:
        return int(np.flatnonzero(self.owner == conv)[0])

    def free(self) -> list[int]:
        return [i for i in range(len(self.owner)) if self.owner[i] < 0]


def _rows(feeds: Sequence[Feed], n: int, next_pos: Sequence[int], key: jax.Array, sampling: SamplingConfig,
          stops: np.ndarray) -> Rows:
    """The constants of n admitted rows (feeds first, padding rows with budget 0)."""
    seeds = np.zeros(n, np.uint32)
    seeds[: len(feeds)] = [f.seed % (1 << 32) for f in feeds]
    pos, budget = np.zeros(n, np.int32), np.zeros(n, np.int32)
    pos[: len(feeds)], budget[: len(feeds)] = next_pos, sampling.max_new_tokens
    rp = jax.tree_util.tree_map(jnp.asarray, sampling.row_params(n))
    return Rows(jnp.asarray(pos), jnp.asarray(stops[:n]), jnp.asarray(budget), rp,
                row_keys(key, jnp.asarray(seeds), n), jnp.zeros(n, jnp.int32))


def run_turns(params: Params, engine: Any, feeds: Sequence[Feed], sampling: SamplingConfig, key: jax.Array,
              advance: Advance, *, width: int, on_shape: Callable[[tuple[Any, ...]], None] | None = None
              ) -> dict[str, int]:
    """Answers conversations turn after turn through W slots (see the module doc).

    Args:
      params: the decode weights; engine: the `DecodeEngine` (cfg, pad and stop ids, buckets, mesh
        within this process).
      feeds: each conversation's first feed (fresh); key: the call's PRNG key.
      advance: called with the replies that ended (after each segment); returns the feeds of the
        conversations that go on (a conversation not fed frees its slot; a feed for one that does
        not hold a slot must be fresh).
      width: W; on_shape: called with each program shape run.

    Returns:
      The counters: segments, admissions, extensions, compactions, widenings and `STAT_KEYS` summed.
    """
    cfg, mesh, nb = engine.cfg, engine.mesh, engine.new_bucket(sampling.max_new_tokens)
    from jaxrl_mt.parallel import row_shards

    m = row_shards(mesh)
    widths = tuple(w for w in slot_widths(width) if w % m == 0)
    stops = engine.stops(None, width, width, engine.stop_width(None))
    note = on_shape or (lambda shape: None)
    waiting = collections.deque(sorted(feeds, key=lambda f: -len(f.tokens)))  # longest first (stable)
    first = bucket(max((len(f.tokens) for f in feeds), default=1), engine.min_prompt_bucket)
    state = empty_slots(cfg, _fit(widths, min(max(len(feeds), 1), width)), bucket(first + nb, 1), nb,
                        stops.shape[1], mesh)
    at = _Slots(len(state.live))
    counters = dict.fromkeys(("segments", "admissions", "extensions", "compactions", "widenings") + STAT_KEYS, 0)
    ready: list[Feed] = []  # continuations of conversations holding a slot

    def room(st: Any, need: int) -> Any:  # the state with caches of `need` slots at least
        if need <= st.cache.valid.shape[1]:
            return st
        counters["widenings"] += 1
        return widen(st, length=bucket(need, 1), mesh=mesh)

    while waiting or ready or (at.owner >= 0).any():
        fresh = [f for f in ready if f.fresh and f.conv in at.context]  # restarts in their own slots
        waiting.extendleft(reversed([f for f in ready if f.fresh and f.conv not in at.context]))
        ready = [f for f in ready if not f.fresh]
        if ready:
            state = _extend(params, engine, state, at, ready, sampling, key, stops, nb, room, note)
            counters["extensions"] += 1
            ready = []
        free = at.free()
        take = fresh + [waiting.popleft() for _ in range(min(len(free), len(waiting)))]
        if take:
            state = _admit(params, engine, state, at, take, free, sampling, key, stops, nb, room, note)
            counters["admissions"] += 1
        w = len(at.owner)
        live = np.asarray(state.live)
        if live.any():  # returns once an eighth more of the slots has stopped
            stopped = int((~live).sum())
            state, stats = segment(params, cfg, state, jnp.int32(min(w, stopped + max(1, w // 8))),
                                   method=sampling.method(), steps=engine.segment_steps, mesh=mesh)
            note(("segment", w, int(state.cache.valid.shape[1]), nb))
            counters["segments"] += 1
            for k, v in zip(STAT_KEYS, np.asarray(stats).tolist()):
                counters[k] += int(v)
        replies = _collect(state, at)
        if replies:
            ready = _next(advance(replies), replies, at)
        held = int((at.owner >= 0).sum())
        narrower = max([x for x in widths if x < w], default=0)
        if not waiting and 0 < held <= narrower:
            state, at.owner = _narrow(state, at.owner, _fit(widths, held), mesh)
            counters["compactions"] += 1
    return counters


def _next(feeds: list[Feed], replies: list[Reply], at: _Slots) -> list[Feed]:
    """The feeds of the conversations that go on; frees the slots of those that replied and do not."""
    going = {f.conv for f in feeds}
    for f in feeds:
        if not f.fresh and f.conv not in at.context:
            raise ValueError(f"conversation {f.conv} holds no cache: its feed must be fresh")
    for r in replies:
        if r.conv not in going:
            at.owner[at.owner == r.conv] = -1
            del at.context[r.conv]
    return feeds


def _layout(feeds: Sequence[Feed], slots: list[int], width: int, length: int, pad_id: int
            ) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """(rows, tokens [rows, length], mask, slot index [rows]) of an admission or extension: a power of
    two of rows, at least W / 8; padding rows hold no token and an out-of-range slot (dropped)."""
    n = len(feeds)
    rows = min(width, bucket(max(n, width // 8, 1), 1))
    tokens, mask = left_pad([list(f.tokens) for f in feeds] + [[pad_id]] * (rows - n), pad_id, length)
    idx = np.full(rows, width, np.int32)
    idx[:n] = slots
    return rows, tokens, mask, idx


def _admit(params, engine, state, at: _Slots, take: list[Feed], free: list[int], sampling, key, stops, nb,
           room, note):
    """Prefills the fresh feeds `take` into their own slots (restarts) or free ones."""
    slots = [at.slot_of(f.conv) if f.conv in at.context else free.pop(0) for f in take]
    p = bucket(max(len(f.tokens) for f in take), engine.min_prompt_bucket)
    state = room(state, p + nb)
    rows, tokens, mask, idx = _layout(take, slots, len(at.owner), p, engine.pad_id)
    consts = _rows(take, rows, [len(f.tokens) for f in take], key, sampling, stops)
    state = admit(params, engine.cfg, state, jnp.asarray(idx), jnp.asarray(tokens), jnp.asarray(mask), consts,
                  jnp.arange(rows, dtype=jnp.int32), method=sampling.method(), mesh=engine.mesh)
    note(("admit", rows, rows, p))
    for f, s in zip(take, slots):
        at.owner[s], at.context[f.conv] = f.conv, len(f.tokens)
    return state


def _extend(params, engine, state, at: _Slots, ready: list[Feed], sampling, key, stops, nb, room, note):
    """Appends the continuations `ready` to their slots' caches and seats their next replies."""
    slots = [at.slot_of(f.conv) for f in ready]
    t = bucket(max(len(f.tokens) for f in ready), engine.min_new_bucket)
    state = room(state, int(np.asarray(state.cache.index)[slots].max()) + t + nb)
    rows, tokens, mask, idx = _layout(ready, slots, len(at.owner), t, engine.pad_id)
    pos = np.zeros(rows, np.int32)
    pos[: len(ready)] = [at.context[f.conv] for f in ready]
    consts = _rows(ready, rows, [at.context[f.conv] + len(f.tokens) for f in ready], key, sampling, stops)
    state = extend(params, engine.cfg, state, jnp.asarray(idx), jnp.asarray(pos), jnp.asarray(tokens),
                   jnp.asarray(mask), consts, method=sampling.method(), mesh=engine.mesh)
    note(("extend", rows, t, int(state.cache.valid.shape[1])))
    for f in ready:
        at.context[f.conv] += len(f.tokens)
    return state


def _collect(state, at: _Slots) -> list[Reply]:
    """The replies that ended (every held slot that stopped: a continued one was seated again before
    the segment); their slots stay held until `_next`."""
    live = np.asarray(state.live)
    ended = [i for i in range(len(at.owner)) if at.owner[i] >= 0 and not live[i]]
    if not ended:
        return []
    toks, lps, count, fin = (np.asarray(x) for x in (state.tokens, state.logprobs, state.count, state.finish))
    out = []
    for i in ended:
        c, m = int(at.owner[i]), int(count[i])
        out.append(Reply(c, toks[i, :m].tolist(), lps[i, :m], FINISH_NAMES[int(fin[i])], at.context[c],
                         int(toks[i, m - 1])))
        at.context[c] += m - 1  # the last token is not in the cache
    return out
