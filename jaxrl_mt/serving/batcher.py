"""Answers concurrent chat requests on the slot engine, refilling freed slots between segments.

Requests (``Job``: token ids, budget, sampling settings, stop strings, n) wait in a queue. When
the engine is idle and a job arrives, the batcher waits until ``window_s`` after the oldest
waiting job's arrival for company (or until ``max_rows`` rows are waiting), then starts a busy
spell: one ``sampling.turns.run_turns`` call on one worker thread, so the event loop keeps
accepting requests meanwhile. A job's ``n`` choices are n rows; at most ``max_rows`` rows hold a
slot at once (W, the engine's slot width of it: 64 clients x n = 16 are never 1,024 rows of KV
cache), the others wait in the spell's queue, first come first served. Between decode segments
(at most ``slice_tokens`` steps; a segment returns once an eighth of the slots is free) the spell
polls the queue: jobs that arrived meanwhile are admitted into the slots that rows freed (refill,
as vLLM, SGLang and JetStream do), and the rows of jobs whose client left are dropped. The spell
ends once nothing is held or waiting.

Methods: greedy and sampled jobs (and sampled ones with or without a top-p filter) need
different static sampling methods; a spell serves one. Once a job of another method waits, the
spell admits no new job, drains, and the next spell takes the oldest waiting job's method (no
starvation). Per-row temperature and top-p are dynamic: sampled jobs of any values share a spell.

Cancellation: a job whose client leaves (its ``submit`` is cancelled) is dropped from the queue,
or its rows stop at the next segment (their slots free for other requests at once).

Long prompts: a prompt longer than ``prefill_tokens`` is admitted as its first piece and extended
piece by piece (each intermediate piece with a budget of one token, dropped: the cache holds
exactly the prompt), so other rows keep decoding between pieces and a short request is not
starved by a long prompt; a row whose client leaves during its prefill stops before it decodes.

Seeds: choice i of a job draws with the row key fold_in(key(seed), i) (`Sampler.generate_ids`
with that seed and row seed i), seed the job's or, unseeded, a server counter: a seeded request
gets the same replies alone or among others, whenever it runs. Stop strings cut the reply text
(``cut_at_stops``); single-token ones and the EOS ids stop decoding (``Job.stop_ids``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from jaxrl_mt.batching import as_key
from jaxrl_mt.sampling import Sampler, SamplingConfig
from jaxrl_mt.sampling.counters import KEYS
from jaxrl_mt.sampling.turns import Feed, Poll, Reply, run_turns
from jaxrl_mt.serving.protocol import Choice

__all__ = ["Batcher", "Job", "cut_at_stops"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class Job:
    """One request's generation work."""

    prompt: list[int]  # token ids of the rendered conversation
    budget: int  # max new tokens
    temperature: float
    top_p: float
    seed: int | None
    n: int = 1  # choices (rows)
    stops: tuple[str, ...] = ()  # stop strings: the reply is cut before the first one
    stop_ids: tuple[int, ...] = ()  # stop token ids (the model's EOS ids and single-token stop strings)
    future: asyncio.Future | None = None
    queued_at: float = 0.0
    cancelled: bool = False  # the client left: set on the event loop, read by the worker between segments
    replies: list[list[int]] | None = None  # the choices' token ids, set when answered

    @property
    def method(self) -> Any:
        """The static sampling method of its rows (jobs of one method can share a spell)."""
        return self.sampling(1).method()

    def sampling(self, max_new_tokens: int) -> SamplingConfig:
        """Its sampling settings with a budget cap."""
        return SamplingConfig(max_new_tokens=max_new_tokens, temperature=self.temperature,
                              top_p=self.top_p if self.temperature > 0 else 1.0)


def cut_at_stops(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` up to the first stop string, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


class _Spell:
    """One busy spell: its method and the progress of its jobs' rows (a row is a conversation of
    `run_turns`). Written by the worker; `active` is read by the event loop."""

    def __init__(self) -> None:
        self.method: Any = None
        self.sampling: SamplingConfig | None = None
        self.active: dict[int, Job] = {}  # id(job) -> job neither answered nor dropped
        self.rows: dict[int, tuple[Job, int]] = {}  # conversation -> (job, choice) of the rows in flight
        self.rest: dict[int, list[list[int]]] = {}  # conversation -> prompt pieces still to feed
        self.got: dict[int, list[tuple[list[int], str] | None]] = {}  # id(job) -> (tokens, finish) per choice
        self.keys: dict[int, Any] = {}  # id(job) -> its PRNG key


class Batcher:
    """The request queue and the loop that answers it (start with :meth:`start` inside the loop)."""

    def __init__(self, sampler: Sampler, *, window_s: float = 0.005, max_rows: int = 64, seed: int = 0,
                 slice_tokens: int = 16, prefill_tokens: int = 512):
        """Args:
          sampler: the model's sampler (one process).
          window_s: how long an idle batcher waits after the first arrival for more requests.
          max_rows: a spell starts at once when this many rows are waiting; at most this many rows
            (the engine's slot width of it) hold a slot at once.
          seed: base of the seeds of unseeded sampled jobs.
          slice_tokens: decode steps per segment at most: requests are admitted and rows of clients
            that left are dropped between segments, so a request arriving while every slot decodes
            waits at most this many steps (0: the engine's ``segment_steps``).
          prefill_tokens: a longer prompt is admitted in pieces of this many tokens, other rows
            decoding between pieces (0: one prefill).
        """
        if window_s < 0 or max_rows < 1 or slice_tokens < 0 or prefill_tokens < 0:
            raise ValueError(f"Batcher: bad window_s={window_s}, max_rows={max_rows}, slice_tokens={slice_tokens} "
                             f"or prefill_tokens={prefill_tokens}")
        if sampler.engine.multi:
            raise ValueError("Batcher runs in one process (the slot engine's host loop)")
        self.sampler, self.window_s, self.max_rows, self.slice_tokens = sampler, window_s, max_rows, slice_tokens
        self.prefill_tokens = prefill_tokens
        self._seed = seed
        self._pending: list[Job] = []  # guarded by _lock (the event loop appends, the worker takes)
        self._lock = threading.Lock()
        self._wake: asyncio.Event | None = None
        self._loop_ref: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sampler")
        self._spell: _Spell | None = None
        self._stopping = False  # stop(): the running spell drops its rows and ends at its next poll
        self._conv = 0  # the next row's conversation id
        # spells, jobs, rows, refills (jobs admitted into a running spell), cancelled (clients that left),
        # dropped (jobs dropped before their spell), stopped_rows (rows stopped in flight because their
        # client left), stopped_in_prefill (of which with prompt pieces still to feed), tokens (of the
        # answered rows), decoded (decode steps of live rows, dropped rows' included), segments, admissions,
        # extensions, prefill_pieces (pieces of long prompts fed), failed
        self.stats: Counter = Counter()
        self.max_rows_seen = 0  # the widest slot state a spell decoded with
        self.wait_s = 0.0  # summed time jobs spent queued before their spell took them

    @property
    def in_flight(self) -> list[Job]:
        """The jobs of the running spell not yet answered or dropped."""
        spell = self._spell
        return list(spell.active.values()) if spell is not None else []

    @property
    def idle(self) -> bool:
        """No spell runs and no job waits (a spell's counters are final once it is over)."""
        return self._spell is None and not self._waiting()

    def start(self) -> None:
        """Starts the batching loop on the running event loop."""
        self._wake = asyncio.Event()
        self._loop_ref = asyncio.get_running_loop()
        self._task = self._loop_ref.create_task(self._loop())

    async def stop(self) -> None:
        """Stops the loop and the worker thread (a running spell stops at its next segment)."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def submit(self, job: Job) -> list[Choice]:
        """Queues a job and waits for its choices (cancelling the wait drops the job).

        Raises:
          ValueError: an empty prompt, n < 1, or a budget outside [1, the model's context].
        """
        if self._wake is None:
            raise RuntimeError("Batcher.start() was not called")
        ctx = self.sampler.cfg.max_position_embeddings
        if not job.prompt or job.n < 1 or not 1 <= job.budget <= ctx:
            raise ValueError(f"bad job: {len(job.prompt)} prompt tokens, n={job.n}, budget={job.budget}")
        job.future = asyncio.get_running_loop().create_future()
        job.queued_at = time.perf_counter()
        with self._lock:
            self._pending.append(job)
        self._wake.set()
        try:
            return await job.future
        except asyncio.CancelledError:
            job.cancelled = True  # the worker drops its rows at the next segment
            self.stats["cancelled"] += 1
            raise

    def _waiting(self) -> list[Job]:
        """The queued jobs whose clients are still there."""
        with self._lock:
            return [j for j in self._pending if not j.cancelled]

    async def _loop(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._waiting():
                continue
            await self._window()
            spell = self._spell = _Spell()
            try:
                await asyncio.get_running_loop().run_in_executor(self._pool, self._run_spell, spell)
            except Exception as e:  # noqa: BLE001 (reported to the waiting clients as a 500; the loop goes on)
                log.exception("spell failed")
                for j in spell.active.values():
                    self.stats["failed"] += 1
                    if not j.future.done():
                        j.future.set_exception(e)
            finally:
                self._spell = None
            if self._waiting():
                self._wake.set()  # the next spell (they have waited their window)

    async def _window(self) -> None:
        """Waits until ``window_s`` after the oldest waiting job's arrival, or ``max_rows`` rows wait."""
        assert self._wake is not None
        waiting = self._waiting()
        if not waiting or self.window_s <= 0 or sum(j.n for j in waiting) >= self.max_rows:
            return
        ends = min(j.queued_at for j in waiting) + self.window_s  # no extra wait after a busy spell
        while sum(j.n for j in self._waiting()) < self.max_rows and time.perf_counter() < ends:
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), ends - time.perf_counter())
            except asyncio.TimeoutError:
                break

    def _run_spell(self, spell: _Spell) -> None:
        """One busy spell on the worker thread: `run_turns` polling the queue between segments."""
        sampler = self.sampler
        engine = sampler.engine
        if self.slice_tokens:
            engine = dataclasses.replace(engine, segment_steps=self.slice_tokens)
        first = self._poll(spell, True)
        if not first.feeds:
            return
        weights = engine.weights(sampler.params, sampler.decode_weights(sampler.params))
        counters = run_turns(weights, engine, first.feeds, spell.sampling, as_key(0),
                             lambda replies: self._advance(spell, replies), width=engine.slot_width(self.max_rows),
                             on_shape=self._on_shape, poll=lambda idle: self._poll(spell, idle))
        for k in KEYS:
            sampler.totals[k] += int(counters.get(k, 0))
        for k in ("admissions", "extensions"):
            self.stats[k] += counters[k]
        self.stats["decoded"] += counters["live_row_steps"]
        self.stats["spells"] += 1

    def _on_shape(self, shape: tuple[Any, ...]) -> None:
        self.sampler.compiled_shapes.add(shape)
        if shape[0] == "segment":
            self.stats["segments"] += 1
            self.max_rows_seen = max(self.max_rows_seen, shape[1])

    def _poll(self, spell: _Spell, idle: bool) -> Poll:
        """Between segments (worker): the rows of jobs whose client left, and the waiting jobs of the
        spell's method as fresh feeds, unless a job of another method waits; closed once idle with
        nothing to admit."""
        drops = [c for c, (j, _) in spell.rows.items() if j.cancelled or self._stopping]
        for c in drops:
            job, _ = spell.rows.pop(c)
            self.stats["stopped_rows"] += 1
            self.stats["stopped_in_prefill"] += bool(spell.rest.pop(c, None))
            spell.active.pop(id(job), None)
        if self._stopping:
            return Poll(drops=drops, closed=True)
        with self._lock:
            live = [j for j in self._pending if not j.cancelled]
            self.stats["dropped"] += len(self._pending) - len(live)
            if spell.method is None and live:  # the oldest job's method, and every waiting job of it
                spell.method = live[0].method
                spell.sampling = live[0].sampling(self.sampler.cfg.max_position_embeddings)
                take = [j for j in live if j.method == spell.method]
            else:  # no admission once a job of another method waits
                take = [] if any(j.method != spell.method for j in live) else live
            taken = {id(j) for j in take}
            self._pending = [j for j in live if id(j) not in taken]
        feeds = [f for j in take for f in self._admit(spell, j)]
        self.stats["refills"] += len(take) if not idle else 0  # admitted while other rows decode
        return Poll(feeds=feeds, drops=drops, closed=idle and not feeds)

    def _admit(self, spell: _Spell, job: Job) -> list[Feed]:
        """The first feeds of a job's rows (worker): a row per choice, long prompts in pieces."""
        if job.seed is None:
            self._seed += 1
        spell.keys[id(job)] = as_key((self._seed if job.seed is None else job.seed) % (1 << 32))
        spell.active[id(job)] = job
        spell.got[id(job)] = [None] * job.n
        self.wait_s += time.perf_counter() - job.queued_at
        self.stats["jobs"] += 1
        self.stats["rows"] += job.n
        p = self.prefill_tokens or len(job.prompt)
        pieces = [job.prompt[k:k + p] for k in range(0, len(job.prompt), p)]
        feeds = []
        for i in range(job.n):
            c, self._conv = self._conv, self._conv + 1
            spell.rows[c], spell.rest[c] = (job, i), pieces[1:]
            feeds.append(self._feed(spell, c, pieces[0], fresh=True))
        return feeds

    def _feed(self, spell: _Spell, conv: int, tokens: list[int], fresh: bool = False) -> Feed:
        """Row `conv`'s next feed: a prompt piece, with a budget of 1 (dropped) while pieces remain."""
        job, i = spell.rows[conv]
        self.stats["prefill_pieces"] += len(job.prompt) > len(tokens) or not fresh
        return Feed(conv, tokens, seed=i, fresh=fresh, budget=job.budget if not spell.rest[conv] else 1,
                    stop_ids=job.stop_ids, temperature=job.temperature, top_p=job.top_p, key=spell.keys[id(job)])

    def _advance(self, spell: _Spell, replies: list[Reply]) -> list[Feed]:
        """The replies that ended (worker): the next prompt pieces of long prompts; the other replies
        are recorded, and a job whose choices are all done is answered."""
        feeds = []
        for r in replies:
            job, i = spell.rows[r.conv]
            if spell.rest[r.conv]:  # a piece of a long prompt: its token dropped, the next piece fed
                feeds.append(self._feed(spell, r.conv, spell.rest[r.conv].pop(0)))
                continue
            del spell.rows[r.conv], spell.rest[r.conv]
            got = spell.got[id(job)]
            got[i] = (r.tokens, r.finish)
            if all(g is not None for g in got) and spell.active.pop(id(job), None) is not None:
                self._answer(job, got)
        return feeds

    def _answer(self, job: Job, got: list[tuple[list[int], str]]) -> None:
        """Detokenizes a job's choices, cuts them at its stop strings and resolves its future."""
        tokens, finish = [g[0] for g in got], [g[1] for g in got]
        texts = self.sampler.decode_texts(tokens, finish) or [""] * len(got)
        choices = []
        for text, toks, fin in zip(texts, tokens, finish):
            text, cut = cut_at_stops(text, job.stops)
            choices.append(Choice(text, "stop" if cut else fin, len(toks)))
        self.stats["tokens"] += sum(len(t) for t in tokens)
        job.replies = tokens
        assert self._loop_ref is not None
        try:
            self._loop_ref.call_soon_threadsafe(_settle, job.future, choices)
        except RuntimeError:  # the event loop is closed: nobody waits for it
            log.debug("a job answered after the event loop closed")

    def summary(self) -> dict[str, Any]:
        """Counters, the widest slot state, mean rows per spell and mean queue wait of a job."""
        spells, jobs = self.stats["spells"] or 1, self.stats["jobs"] or 1
        return {**{k: int(v) for k, v in sorted(self.stats.items())}, "max_rows": self.max_rows_seen,
                "in_flight_rows": sum(j.n for j in self.in_flight),
                "mean_rows_per_spell": self.stats["rows"] / spells, "window_ms": self.window_s * 1000,
                "mean_queue_wait_ms": 1000 * self.wait_s / jobs}


def _settle(future: asyncio.Future | None, choices: list[Choice]) -> None:
    """Resolves a job's future on the event loop (unless its client left)."""
    if future is not None and not future.done():
        future.set_result(choices)
