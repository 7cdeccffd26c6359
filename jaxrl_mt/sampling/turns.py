"""Conversations on the slot engine: a slot holds a conversation across its turns.

`run_turns` drives the programs of `sampling.slots` for conversations that proceed apart, not in
lockstep. A conversation enters a free slot with its first prompt (`admit`); when its reply ends,
the caller's `advance` hook (the user's next message, the judges) gives its next segment: the
template text between the reply and the next generation prompt, appended to the same slot's cache
(`extend`), so its earlier turns are read from the cache, not prefilled again. A conversation the
hook does not continue frees its slot for the next waiting one; only conversations in flight hold
a cache. Segments return once an eighth of the slots has stopped, so a finished reply waits at most
that long for its next turn; once no conversation waits, the slots narrow as in `run_slots`.

A server's work arrives while the loop runs: the optional `poll` hook, called before each
segment, returns new conversations (fresh feeds, queued first come first served) and
conversations to drop (a dropped one holding a slot stops at once, its slot freed and no reply
made; a waiting one is removed). The state then grows (`slot_growth.grow`): up to W slots when
more conversations wait than slots are free, and output buffers to the largest budget admitted
(the engine's new-token bucket of it: powers of two). Each feed may carry its own budget (at most
the SamplingConfig's `max_new_tokens`), stop ids, temperature, top-p and PRNG key; the static
sampling method is the call's.

A reply's tokens depend on its conversation's context, its row key and its budget only (keys as
`sampling.kernels._slot_keys`), not on its slot, its batch-mates or when it ran. A slot's cache
grows (`widen`, powers of two) when a conversation outgrows it; left-padded segments leave holes
of at most their bucket's padding, never read.

On a mesh over several processes every process runs this loop on the same conversations, with
the same feeds and hooks (a replicated caller: a multi-process evaluation simulates every
conversation on every process): its host values go in replicated and the device values it reads
come out whole on every process (`sampling.multiprocess.Transfers`, as in `run_slots`), so every
process takes the same decisions and launches the same programs in the same order.
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
from jaxrl_mt.sampling.methods import RowParams, SamplingConfig
from jaxrl_mt.sampling.multiprocess import Transfers
from jaxrl_mt.sampling.scheduler import _fit, _narrow, slot_widths
from jaxrl_mt.sampling.slot_growth import grow, halt
from jaxrl_mt.sampling.slots import STAT_KEYS, admit, empty_slots, extend, segment, widen


@dataclasses.dataclass(frozen=True)
class Feed:
    """What a conversation appends to its context before its next reply (None: the call's value)."""

    conv: int  # the conversation (the caller's index)
    tokens: Sequence[int]  # the segment (fresh: the whole prompt)
    seed: int  # the reply's row seed: its key is fold_in(key, row seed), key this feed's or the call's
    fresh: bool = False  # start the context over (a cached one is dropped)
    budget: int | None = None  # the reply's new tokens at most: in [1, SamplingConfig.max_new_tokens]
    stop_ids: Sequence[int] | None = None  # the reply ends on one of these (None: the engine's EOS ids)
    temperature: float | None = None  # the reply's sampling values (the static method is the call's)
    top_p: float | None = None
    key: Any = None  # the PRNG key its row seed folds into


@dataclasses.dataclass
class Reply:
    """A reply that ended, as `advance` sees it."""

    conv: int
    tokens: list[int]
    logprobs: np.ndarray
    finish: str  # "stop" | "length"
    context: int  # tokens of its context before the reply (cached + segment)
    pending: int  # its last token: not in the cache (feed it in the next segment, or drop it)


@dataclasses.dataclass(frozen=True)
class Poll:
    """What the `poll` hook brings: new conversations, conversations to drop, and whether more may come."""

    feeds: Sequence[Feed] = ()  # fresh feeds of conversations that hold no slot (queued in this order)
    drops: Sequence[int] = ()  # conversations to stop: no reply is made for them
    closed: bool = False  # no more feeds will come: the loop ends once nothing is held or waiting


Advance = Callable[[list[Reply]], list[Feed]]
PollHook = Callable[[bool], Poll]  # called with `idle` (nothing held or waiting) before each segment


class _Slots:
    """The host's view of the slots: who holds each, and each conversation's context length."""

    def __init__(self, width: int):
        self.owner = np.full(width, -1)  # conversation held by each slot
        self.context: dict[int, int] = {}  # conversation -> tokens in its context (= its next RoPE position)

    def slot_of(self, conv: int) -> int:
        return int(np.flatnonzero(self.owner == conv)[0])

    def free(self) -> list[int]:
        return [i for i in range(len(self.owner)) if self.owner[i] < 0]


def run_turns(params: Params, engine: Any, feeds: Sequence[Feed], sampling: SamplingConfig, key: jax.Array,
              advance: Advance, *, width: int, on_shape: Callable[[tuple[Any, ...]], None] | None = None,
              poll: PollHook | None = None) -> dict[str, int]:
    """Answers conversations turn after turn through at most W slots (see the module doc).

    Args:
      params: the decode weights; engine: the `DecodeEngine` (cfg, pad and stop ids, buckets, mesh,
        `segment_steps`). A mesh over several processes: every process calls with the same feeds,
        key and hooks (see the module doc).
      feeds: each conversation's first feed (fresh; may be empty when `poll` brings the work);
        key: the call's PRNG key (a feed's own `key` replaces it for that feed).
      advance: called with the replies that ended (after each segment); returns the feeds of the
        conversations that go on (a conversation not fed frees its slot; a feed for one that does
        not hold a slot must be fresh).
      width: W; on_shape: called with each program shape run.
      poll: optional, called with `idle` before each segment (see `Poll`). While the loop is idle
        and the last poll was not closed, it is called again at once: a hook with nothing to give
        may block there until work arrives, or return closed to end the loop. Without it the loop
        ends once every conversation has ended.

    Returns:
      The counters: segments, admissions, extensions, compactions, widenings, growths, drops and
      `STAT_KEYS` summed.
    """
    loop = _Loop(params, engine, feeds, sampling, key, width, on_shape)
    closed = poll is None
    while True:
        if not closed:
            got = poll(loop.idle())
            loop.take_in(got.feeds, got.drops)
            closed = got.closed
        if loop.idle():
            if closed:
                return loop.counters
            continue
        loop.turn(advance)


class _Loop:
    """The state of one `run_turns` call and its steps."""

    def __init__(self, params: Params, engine: Any, feeds: Sequence[Feed], sampling: SamplingConfig, key: jax.Array,
                 width: int, on_shape: Callable[[tuple[Any, ...]], None] | None):
        from jaxrl_mt.parallel import row_shards

        self.params, self.engine, self.sampling, self.mesh = params, engine, sampling, engine.mesh
        self.io = Transfers(self.mesh)
        self.key = self.io.host_key(key)
        m = row_shards(self.mesh)
        self.widths = tuple(w for w in slot_widths(width) if w % m == 0)
        self.most = self.widths[-1]
        self.note = on_shape or (lambda shape: None)
        for f in feeds:
            self._check(f)
        self.waiting = collections.deque(sorted(feeds, key=lambda f: -len(f.tokens)))  # longest first (stable)
        first = bucket(max((len(f.tokens) for f in feeds), default=1), engine.min_prompt_bucket)
        self.out = self._new_bucket(feeds)  # N, the output buffer of a slot
        self.stop_width = max([engine.stop_width(None)] + [len(f.stop_ids) for f in feeds if f.stop_ids is not None])
        self.state = empty_slots(engine.cfg, _fit(self.widths, min(max(len(feeds), 1), self.most)),
                                 bucket(first + self.out, 1), self.out, self.stop_width, self.mesh)
        self.at = _Slots(len(self.state.live))
        self.counters = dict.fromkeys(("segments", "admissions", "extensions", "compactions", "widenings", "growths",
                                       "drops") + STAT_KEYS, 0)
        self.ready: list[Feed] = []  # continuations of conversations holding a slot

    def _check(self, f: Feed) -> None:
        """Refuses a feed whose budget is not in [1, max_new_tokens] or that has no tokens."""
        if f.budget is not None and not 1 <= f.budget <= self.sampling.max_new_tokens:
            raise ValueError(f"conversation {f.conv}: budget {f.budget} not in [1, {self.sampling.max_new_tokens}]")
        if not len(f.tokens):
            raise ValueError(f"conversation {f.conv}: an empty feed")

    def _budget(self, f: Feed) -> int:
        return self.sampling.max_new_tokens if f.budget is None else f.budget

    def _new_bucket(self, feeds: Sequence[Feed]) -> int:
        """The output buffer the replies of `feeds` need (the engine's bucket of their largest budget)."""
        return self.engine.new_bucket(max((self._budget(f) for f in feeds), default=1))

    def idle(self) -> bool:
        """Nothing held, waiting or about to continue."""
        return not (self.waiting or self.ready or (self.at.owner >= 0).any())

    def take_in(self, feeds: Sequence[Feed], drops: Sequence[int]) -> None:
        """Queues the polled fresh `feeds` (in order) and stops the conversations `drops`."""
        for f in feeds:
            self._check(f)
            if not f.fresh or f.conv in self.at.context:
                raise ValueError(f"conversation {f.conv}: a polled feed must be fresh, its conversation slotless")
        self.waiting.extend(feeds)
        gone = set(drops)
        if not gone:
            return
        self.waiting = collections.deque(f for f in self.waiting if f.conv not in gone)
        self.ready = [f for f in self.ready if f.conv not in gone]
        held = [self.at.slot_of(c) for c in gone if c in self.at.context]
        if held:
            w = len(self.at.owner)
            idx = np.full(w, w, np.int32)
            idx[: len(held)] = held
            self.state = halt(self.state, self.io.put(idx), mesh=self.mesh)
            for s in held:
                del self.at.context[int(self.at.owner[s])]
                self.at.owner[s] = -1
        self.counters["drops"] += len(gone)

    def room(self, need: int) -> None:
        """Caches of `need` slots at least (widened to a power of two)."""
        if need > self.state.cache.valid.shape[1]:
            self.counters["widenings"] += 1
            self.state = widen(self.state, length=bucket(need, 1), mesh=self.mesh)

    def fit(self, feeds: Sequence[Feed], held_and_waiting: int = 0) -> None:
        """Grows the state for `feeds`' budgets and stop ids, and to hold `held_and_waiting` conversations
        (up to W slots)."""
        w = len(self.at.owner)
        width = max(w, _fit(self.widths, min(held_and_waiting, self.most)))
        out = max(self.out, self._new_bucket(feeds))
        stop_width = max([self.stop_width] + [len(f.stop_ids) for f in feeds if f.stop_ids is not None])
        if (width, out, stop_width) == (w, self.out, self.stop_width):
            return
        self.state = grow(self.state, width=width, max_new=out, stop_width=stop_width, mesh=self.mesh)
        self.at.owner = np.concatenate([self.at.owner, np.full(width - w, -1)])
        self.out, self.stop_width = out, stop_width
        self.counters["growths"] += 1

    def turn(self, advance: Advance) -> None:
        """Continues the ready conversations, admits waiting ones into free slots, runs one segment,
        hands the replies that ended to `advance`, and narrows the slots once none waits."""
        at = self.at
        fresh = [f for f in self.ready if f.fresh and f.conv in at.context]  # restarts in their own slots
        self.waiting.extendleft(reversed([f for f in self.ready if f.fresh and f.conv not in at.context]))
        self.ready = [f for f in self.ready if not f.fresh]
        if self.ready:
            self.fit(self.ready)
            self._extend(self.ready)
            self.counters["extensions"] += 1
            self.ready = []
        if len(self.waiting) > len(at.free()):
            self.fit((), int((at.owner >= 0).sum()) + len(self.waiting))
        free = at.free()
        take = fresh + [self.waiting.popleft() for _ in range(min(len(free), len(self.waiting)))]
        if take:
            self.fit(take)
            self._admit(take, free)
            self.counters["admissions"] += 1
        self._segment()
        replies = _collect(self.state, at, self.io)
        if replies:
            self.ready = _next(advance(replies), replies, at)
        held, w = int((at.owner >= 0).sum()), len(at.owner)
        narrower = max([x for x in self.widths if x < w], default=0)
        if not self.waiting and 0 < held <= narrower:
            self.state, at.owner = _narrow(self.state, at.owner, _fit(self.widths, held), self.mesh, self.io)
            self.counters["compactions"] += 1

    def _segment(self) -> None:
        """One segment of the live slots: returns once an eighth more of the slots has stopped."""
        w = len(self.at.owner)
        (live,) = self.io.get(self.state.live)
        if not live.any():
            return
        stopped = int((~live).sum())
        self.state, stats = segment(self.params, self.engine.cfg, self.state,
                                    self.io.put(np.int32(min(w, stopped + max(1, w // 8)))),
                                    method=self.sampling.method(), steps=self.engine.segment_steps, mesh=self.mesh)
        self.note(("segment", w, int(self.state.cache.valid.shape[1]), self.out))
        self.counters["segments"] += 1
        for k, v in zip(STAT_KEYS, self.io.get(stats)[0].tolist()):
            self.counters[k] += int(v)

    def _rows(self, feeds: Sequence[Feed], n: int, next_pos: Sequence[int]) -> Rows:
        """The constants of n admitted rows (feeds first, padding rows with budget 0), on the host."""
        s, k = self.sampling, len(feeds)
        seeds = np.zeros(n, np.uint32)
        seeds[:k] = [f.seed % (1 << 32) for f in feeds]
        pos, budget = np.zeros(n, np.int32), np.zeros(n, np.int32)
        pos[:k], budget[:k] = next_pos, [self._budget(f) for f in feeds]
        stops = self.engine.stops([self.engine.eos_ids if f.stop_ids is None else f.stop_ids for f in feeds], k, n,
                                  self.stop_width)
        rp = s.row_params(n)
        rp.temperature[:k] = [max(s.temperature if f.temperature is None else f.temperature, 1e-6) for f in feeds]
        rp.top_p[:k] = [s.top_p if f.top_p is None else f.top_p for f in feeds]
        if all(f.key is None for f in feeds):
            keys = row_keys(self.key, jnp.asarray(seeds), n)
        else:
            base = jnp.stack([self.key if f.key is None else f.key for f in feeds] + [self.key] * (n - k))
            keys = jax.vmap(jax.random.fold_in)(base, jnp.asarray(seeds))
        return Rows(pos, stops, budget, RowParams(rp.temperature, rp.top_k, rp.top_p), keys,
                    np.zeros(n, np.int32))

    def _admit(self, take: list[Feed], free: list[int]) -> None:
        """Prefills the fresh feeds `take` into their own slots (restarts) or free ones."""
        at, eng = self.at, self.engine
        slots = [at.slot_of(f.conv) if f.conv in at.context else free.pop(0) for f in take]
        p = bucket(max(len(f.tokens) for f in take), eng.min_prompt_bucket)
        self.room(p + self._new_bucket(take))
        rows, tokens, mask, idx = _layout(take, slots, len(at.owner), p, eng.pad_id)
        consts = self._rows(take, rows, [len(f.tokens) for f in take])
        args = self.io.put((idx, tokens, mask, consts, np.arange(rows, dtype=np.int32)))
        self.state = admit(self.params, eng.cfg, self.state, *args, method=self.sampling.method(), mesh=self.mesh)
        self.note(("admit", rows, rows, p))
        for f, s in zip(take, slots):
            at.owner[s], at.context[f.conv] = f.conv, len(f.tokens)

    def _extend(self, ready: list[Feed]) -> None:
        """Appends the continuations `ready` to their slots' caches and seats their next replies."""
        at, eng = self.at, self.engine
        slots = [at.slot_of(f.conv) for f in ready]
        t = bucket(max(len(f.tokens) for f in ready), eng.min_new_bucket)
        self.room(int(self.io.get(self.state.cache.index)[0][slots].max()) + t + self._new_bucket(ready))
        rows, tokens, mask, idx = _layout(ready, slots, len(at.owner), t, eng.pad_id)
        pos = np.zeros(rows, np.int32)
        pos[: len(ready)] = [at.context[f.conv] for f in ready]
        consts = self._rows(ready, rows, [at.context[f.conv] + len(f.tokens) for f in ready])
        args = self.io.put((idx, pos, tokens, mask, consts))
        self.state = extend(self.params, eng.cfg, self.state, *args, method=self.sampling.method(), mesh=self.mesh)
        self.note(("extend", rows, t, int(self.state.cache.valid.shape[1])))
        for f in ready:
            at.context[f.conv] += len(f.tokens)


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


def _collect(state: Any, at: _Slots, io: Transfers) -> list[Reply]:
    """The replies that ended (every held slot that stopped: a continued one was seated again before
    the segment); their slots stay held until `_next`."""
    (live,) = io.get(state.live)
    ended = [i for i in range(len(at.owner)) if at.owner[i] >= 0 and not live[i]]
    if not ended:
        return []
    toks, lps, count, fin = io.get(state.tokens, state.logprobs, state.count, state.finish)
    out = []
    for i in ended:
        c, m = int(at.owner[i]), int(count[i])
        out.append(Reply(c, toks[i, :m].tolist(), lps[i, :m], FINISH_NAMES[int(fin[i])], at.context[c],
                         int(toks[i, m - 1])))
        at.context[c] += m - 1  # the last token is not in the cache
    return out
