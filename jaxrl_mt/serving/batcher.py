"""Gathers concurrent chat requests into batched sampler calls.

Requests (``Job``: token ids, budget, sampling settings, stop strings, n) wait in a queue. When
the sampler is idle and a job arrives, the batcher waits until ``window_s`` after the oldest
waiting job's arrival for company (or until ``max_rows`` rows are waiting), then takes the
oldest waiting jobs up to ``max_rows`` rows (a job's ``n`` choices are n rows; one job is always
taken): 64 clients x n = 16 are never 1,024 rows of KV cache at once. The rest, and new arrivals
while a batch runs, form the next batch (without a further wait when they have waited a window
already). Jobs that can share one ``Sampler.generate_ids`` call (same sampling settings; greedy
jobs always can) go into one call, with per-row budgets and stop ids; jobs whose longest prompt
plus largest budget would not fit the context together are split into several calls, and so are
prompts longer than ``prefill_tokens`` from shorter ones (short ones first: a short prompt is
never padded to a long one's length). Sampler calls run one at a time on one worker thread, so
the event loop keeps accepting requests meanwhile.

Cancellation: a job whose client leaves (its ``submit`` is cancelled) is dropped from the queue
and from every call not yet started. A call whose budget exceeds ``slice_tokens`` is decoded in
slices of that many tokens on a ``DecodeSession`` (the KV cache is kept between slices, so a
slice prefills only the last sampled token); between slices the rows of jobs that left, and rows
that are done, are released, so an abandoned request stops generating within one slice. A row
draws its t-th token with its own step counter (`row_offsets`: the tokens it drew in earlier
slices), so a reply is the same sliced or not, greedy or sampled with the call's seed (up to the
rounding of a continuation against a fresh prefill).

Long prompts: a prompt longer than ``prefill_tokens`` is prefilled in pieces of that many tokens,
one session step each (the token sampled after a piece is dropped, so the cache holds exactly the
prompt). Between pieces a row whose client left is released (before any decode), and jobs that
arrived meanwhile are answered first (a nested batch, up to ``max_rows`` rows): a short request
waits at most one piece of another client's prefill, not its whole prompt.

Seeds: a sampled job with a ``seed`` only shares a call with jobs of the same seed and settings,
and that call is seeded with it (the same request alone with the same seed gives the same
replies); unseeded sampled jobs share calls seeded from a server counter.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from jaxrl_mt.batching import cache_bucket
from jaxrl_mt.sampling import DecodeSession, GenerationResult, Sampler, SamplingConfig
from jaxrl_mt.serving.protocol import Choice

__all__ = ["Batcher", "Job"]

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
    cancelled: bool = False  # the client left: set on the event loop, read by the worker between slices

    @property
    def key(self) -> tuple:
        """Jobs with equal keys can share one sampler call."""
        if self.temperature == 0:
            return ("greedy",)
        return ("sample", self.temperature, self.top_p, self.seed)


def cut_at_stops(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` up to the first stop string, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def split_to_fit(jobs: list[Job], context: int, long_prompt: int = 0) -> list[list[Job]]:
    """Consecutive groups, shortest prompts first, whose longest prompt plus largest budget fit the
    context; with ``long_prompt`` > 0, prompts longer than it never share a group with shorter ones."""
    groups: list[list[Job]] = []
    longest = budget = 0
    for job in sorted(jobs, key=lambda j: len(j.prompt)):
        apart = long_prompt > 0 and (len(job.prompt) > long_prompt) != (longest > long_prompt)
        if groups and not apart and max(longest, len(job.prompt)) + max(budget, job.budget) <= context:
            groups[-1].append(job)
            longest, budget = max(longest, len(job.prompt)), max(budget, job.budget)
        else:
            groups.append([job])
            longest, budget = len(job.prompt), job.budget
    return groups


def _advance(work: Generator[bool, None, Any]) -> tuple[bool, Any]:
    """Runs a call's next slice: (False, whether the call is prefilling) or (True, its result)."""
    try:
        return False, next(work)
    except StopIteration as e:
        return True, e.value


class Batcher:
    """The request queue and the loop that answers it (start with :meth:`start` inside the loop)."""

    def __init__(self, sampler: Sampler, *, window_s: float = 0.005, max_rows: int = 64, seed: int = 0,
                 slice_tokens: int = 64, prefill_tokens: int = 512):
        """Args:
          sampler: the model's sampler (its ``max_batch`` splits a large call into chunks).
          window_s: how long an idle batcher waits after the first arrival for more requests.
          max_rows: a batch starts at once when this many rows are waiting, and takes at most this
            many rows (the oldest jobs; a single larger job alone).
          seed: base of the seeds of unseeded sampled calls.
          slice_tokens: a call with a larger budget is decoded in slices of this many tokens, and
            rows whose client left are dropped between slices (0: one sampler call per group).
          prefill_tokens: a longer prompt gets a call of its own and is prefilled in pieces of this
            many tokens, answering other jobs between pieces (0: one prefill).
        """
        if window_s < 0 or max_rows < 1 or slice_tokens < 0 or prefill_tokens < 0:
            raise ValueError(f"Batcher: bad window_s={window_s}, max_rows={max_rows}, slice_tokens={slice_tokens} "
                             f"or prefill_tokens={prefill_tokens}")
        self.sampler, self.window_s, self.max_rows, self.slice_tokens = sampler, window_s, max_rows, slice_tokens
        self.prefill_tokens = prefill_tokens
        self._seed = seed
        self._pending: list[Job] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sampler")
        # batches, calls, rows, jobs, cancelled (clients that left), dropped (jobs dropped before their call),
        # stopped_rows (rows stopped mid-decode because their client left), slices, tokens, failed,
        # prefill_pieces (steps that fed a piece of a long prompt), nested (batches answered between them)
        self.stats: Counter = Counter()
        self.in_flight: list[Job] = []  # the jobs of the sampler call now running
        self.max_rows_seen = 0
        self.wait_s = 0.0  # summed time jobs spent queued before their sampler call started

    def start(self) -> None:
        """Starts the batching loop on the running event loop."""
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Stops the loop and the worker thread."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def submit(self, job: Job) -> list[Choice]:
        """Queues a job and waits for its choices (cancelling the wait drops the job)."""
        if self._wake is None:
            raise RuntimeError("Batcher.start() was not called")
        job.future = asyncio.get_running_loop().create_future()
        job.queued_at = time.perf_counter()
        self._pending.append(job)
        self._wake.set()
        try:
            return await job.future
        except asyncio.CancelledError:
            job.cancelled = True  # the worker drops its rows at the next slice
            self.stats["cancelled"] += 1
            raise

    async def _loop(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._pending:
                continue
            if sum(j.n for j in self._pending) < self.max_rows and self.window_s > 0:
                ends = min(j.queued_at for j in self._pending) + self.window_s  # no extra wait after a busy spell
                while sum(j.n for j in self._pending) < self.max_rows and time.perf_counter() < ends:
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), ends - time.perf_counter())
                    except asyncio.TimeoutError:
                        break
            jobs = self._take()
            if self._pending:
                self._wake.set()  # the rest form the next batch (they have waited their window)
            if not jobs:
                continue
            try:
                await self._answer(jobs)
            except Exception as e:  # noqa: BLE001 (never leave a client waiting on a dead loop)
                log.exception("batch failed")
                for j in jobs:
                    if not j.future.done():
                        j.future.set_exception(e)

    def _take(self) -> list[Job]:
        """The oldest waiting jobs, at most ``max_rows`` rows (at least one job); the rest stay queued."""
        live = [j for j in self._pending if not j.future.done()]
        self.stats["dropped"] += len(self._pending) - len(live)
        rows = 0
        for k, j in enumerate(live):
            if k and rows + j.n > self.max_rows:
                self._pending = live[k:]
                return live[:k]
            rows += j.n
        self._pending = []
        return live

    async def _answer(self, jobs: list[Job], nested: bool = False) -> None:
        """Runs the sampler calls of one batch and resolves the jobs' futures (``nested``: a batch
        answered between the prefill pieces of another call, which does not nest further)."""
        self.stats["batches"] += 1
        by_key: dict[tuple, list[Job]] = {}
        for job in jobs:
            by_key.setdefault(job.key, []).append(job)
        for group in by_key.values():
            for part in split_to_fit(group, self.sampler.cfg.max_position_embeddings, self.prefill_tokens):
                left = [j for j in part if j.future.done()]  # clients that left meanwhile
                self.stats["dropped"] += len(left)
                part = [j for j in part if not j.future.done()]
                if not part:
                    continue
                start = time.perf_counter()
                self.wait_s += sum(start - j.queued_at for j in part)
                outer, self.in_flight = self.in_flight, part
                try:
                    results = await self._run(part, nested)
                except Exception as e:  # noqa: BLE001 (reported to the waiting clients as a 500)
                    self.stats["failed"] += len(part)
                    for j in part:
                        if not j.future.done():
                            j.future.set_exception(e)
                    continue
                finally:
                    self.in_flight = outer
                for j, choices in zip(part, results):
                    if not j.future.done():
                        j.future.set_result(choices)

    async def _run(self, part: list[Job], nested: bool) -> list[list[Choice]]:
        """One call's slices on the worker; jobs that arrive while it prefills a long prompt are
        answered between its pieces (unless ``nested``)."""
        loop, work = asyncio.get_running_loop(), self._generate(part)
        while True:
            done, value = await loop.run_in_executor(self._pool, _advance, work)
            if done:
                return value
            if value and not nested and any(not j.future.done() for j in self._pending):
                self.stats["nested"] += 1
                await self._answer(self._take(), nested=True)

    def _generate(self, jobs: list[Job]) -> Generator[bool, None, list[list[Choice]]]:
        """One sampler call for jobs of one key, run a slice at a time on the worker thread: yields
        between slices (True while a long prompt is being prefilled), returns the jobs' choices."""
        first = jobs[0]
        rows = [j for j in jobs for _ in range(j.n)]
        seed = first.seed
        if seed is None:
            self._seed += 1
            seed = self._seed
        sampling = SamplingConfig(max_new_tokens=max(j.budget for j in rows), temperature=first.temperature,
                                  top_p=first.top_p if first.temperature > 0 else 1.0)
        long = 0 < self.prefill_tokens < max(len(j.prompt) for j in rows)
        if long or 0 < self.slice_tokens < sampling.max_new_tokens:
            res = yield from self._generate_sliced(rows, sampling, seed % (2**32))
        else:
            res = self.sampler.generate_ids([j.prompt for j in rows], sampling, seed=seed % (2**32),
                                            max_new_tokens=[j.budget for j in rows],
                                            stop_ids=[list(j.stop_ids) for j in rows])
            self.stats["slices"] += 1
        self.stats["tokens"] += sum(len(t) for t in res.tokens)
        self.stats["calls"] += 1
        self.stats["rows"] += len(rows)
        self.stats["jobs"] += len(jobs)
        self.max_rows_seen = max(self.max_rows_seen, len(rows))
        out: list[list[Choice]] = []
        k = 0
        for j in jobs:
            choices = []
            for _ in range(j.n):
                text, cut = cut_at_stops(res.texts[k] if res.texts is not None else "", j.stops)
                choices.append(Choice(text, "stop" if cut else res.finish_reasons[k], len(res.tokens[k])))
                k += 1
            out.append(choices)
        return out

    def _generate_sliced(self, rows: list[Job], sampling: SamplingConfig, seed: int
                         ) -> Generator[bool, None, GenerationResult]:
        """One call decoded in slices of ``slice_tokens`` on a DecodeSession, long prompts prefilled in
        pieces of ``prefill_tokens``, rows whose client left released between steps (runs on the
        worker thread, yielding after each step: True while a prompt is still being fed; ``rows``:
        each job once per choice)."""
        longest = max(len(j.prompt) for j in rows)
        size = cache_bucket(longest + max(j.budget for j in rows)) if 0 < self.prefill_tokens < longest else 128
        sess = DecodeSession(self.sampler, len(rows), min_segment_bucket=self.sampler.min_prompt_bucket,
                             cache_quantum=size)  # a long prompt's cache sized once: one program for its pieces
        todo: list[list[int]] = [list(j.prompt) for j in rows]  # tokens still to feed (prompt, or the pending one)
        tokens: list[list[int]] = [[] for _ in rows]
        finish: list[str | None] = [None] * len(rows)
        key, piece = jax.random.PRNGKey(seed), self.prefill_tokens or max(len(t) for t in todo)
        while True:  # each step feeds a piece of a prompt or yields >= 1 token per active row
            gone = [i for i, j in enumerate(rows) if finish[i] is None and j.cancelled]
            for i in gone:
                finish[i] = "cancelled"
            self.stats["stopped_rows"] += len(gone)
            self.stats["stopped_in_prefill"] += sum(1 for i in gone if not tokens[i])
            sess.release(gone)
            active = [i for i in range(len(rows)) if finish[i] is None]
            if not active:
                break
            feeding = {i for i in active if len(todo[i]) > piece}  # a piece of a long prompt; its sample dropped
            left = [rows[i].budget - len(tokens[i]) for i in range(len(rows))]
            nmax = min(self.slice_tokens or sampling.max_new_tokens,
                       max((left[i] for i in active if i not in feeding), default=1))
            segments: list[list[int] | None] = [None] * len(rows)
            for i in active:
                segments[i], todo[i] = todo[i][:piece], todo[i][piece:]
            budgets = [1 if i in feeding else min(nmax, max(left[i], 1)) for i in range(len(rows))]
            res = sess.step(segments, dataclasses.replace(sampling, max_new_tokens=nmax), seed=key,
                            max_new_tokens=budgets, stop_ids=[list(j.stop_ids) for j in rows],
                            row_offsets=[len(t) for t in tokens])  # a row's t-th token: its own count
            if not feeding:
                sess.min_segment_bucket = 16  # later slices feed one token per row: no prompt-sized padding
            self.stats["slices"] += 1
            self.stats["prefill_pieces"] += bool(feeding)
            done = []
            for i in set(active) - feeding:
                tokens[i] += res.tokens[i]
                if res.finish_reasons[i] == "stop" or len(tokens[i]) >= rows[i].budget:
                    finish[i] = res.finish_reasons[i]
                    done.append(i)
                else:
                    todo[i] = [res.tokens[i][-1]]  # the pending token, fed at the next slice
            sess.release(done)
            yield bool(feeding)  # True: the next step feeds more of a prompt (other jobs may go first)
        reasons = [f or "length" for f in finish]
        out = GenerationResult(tokens, [], np.array([len(t) for t in tokens]), reasons)
        out.texts = self.sampler.decode_texts(tokens, reasons)
        return out

    def summary(self) -> dict[str, Any]:
        """Counters, the largest batch, mean rows per sampler call and mean queue wait of a job."""
        calls, jobs = self.stats["calls"] or 1, self.stats["jobs"] or 1
        return {**{k: int(v) for k, v in sorted(self.stats.items())}, "max_rows": self.max_rows_seen,
                "in_flight_rows": sum(j.n for j in self.in_flight),
                "mean_rows_per_call": self.stats["rows"] / calls, "window_ms": self.window_s * 1000,
                "mean_queue_wait_ms": 1000 * self.wait_s / jobs}
