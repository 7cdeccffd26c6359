"""`DecodeSession`: rows whose KV caches persist across generation calls (multi-turn without re-prefill).

Each `step` appends a segment of new tokens to every active row's context and generates its
continuation; only the segment is prefilled, the context before it is read from the cache.
Rows are grouped once, at the first step, into chunks sorted by the length of their first
segment (`batching.plan_chunks`: at most `sampler.max_batch` rows each, fewer for long segments
under `max_cells`), each with one device cache. Per row the session keeps the exact token ids in
its cache (`tokens`), the last sampled token, which is never written to the cache (`pending`),
and how its last generation ended (`finish`).

Each step repacks a chunk's cache (`resize_cache`: holes removed, capacity rounded up by
`cache_bucket`), prefills the segments and decodes (`continue_tokens`, which donates the cache
it is given). Rows that are `release`d are emptied, and dropped from their chunk when that lets
the chunk use a smaller power-of-two batch. Under the sampler's mesh a chunk's rows, and its
cache by `parallel.CACHE_RULES`, are split over the (data, fsdp) axes.

Row i samples with its own key (fold_in(key(seed), row_seeds[i]), default row seed i:
`sampling.engine`), so its tokens do not depend on the chunk it is in or on the other rows.
The session drives its host's frozen `DecodeEngine`; the parameters are those of each step's
`params=` (default: the host's).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import jax
import numpy as np

from jaxrl_mt.batching import bucket, cache_bucket, plan_chunks
from jaxrl_mt.models.decoder import KVCache, Params
from jaxrl_mt.sampling.engine import DecodeHost, row_seed_array
from jaxrl_mt.sampling.kernels import FINISH_NAMES, resize_cache
from jaxrl_mt.sampling.methods import SamplingConfig
from jaxrl_mt.sampling.results import GenerationResult


@dataclasses.dataclass
class _Chunk:
    """Rows that share one device cache."""

    rows: list[int]  # session rows, in batch order (batch rows beyond them are padding)
    cache: KVCache | None = None  # [L, bucket(len(rows)), Hkv, S, K]; None before the first call


@dataclasses.dataclass
class _StepOut:
    """Per-row outputs of one step, over all session rows."""

    tokens: list[list[int]]
    logprobs: list[np.ndarray]
    lengths: np.ndarray
    finish: list[str]

    @classmethod
    def empty(cls, n: int) -> "_StepOut":
        return cls([[] for _ in range(n)], [np.zeros(0, np.float32) for _ in range(n)], np.zeros(n, np.int64),
                   ["none"] * n)


class DecodeSession:
    """Rows whose KV caches persist across generation calls (see the module doc)."""

    def __init__(self, sampler: DecodeHost, n_rows: int, *, max_cells: int | None = None,
                 min_segment_bucket: int = 16, cache_quantum: int = 128):
        """Args:
          sampler: the host (a `Sampler`): its engine (cfg, eos/pad ids, max_batch, mesh), default
            params, fused decode weights and texts.
          n_rows: number of rows.
          max_cells: optional memory bound of a chunk at the first step, in cells
            rows x segment bucket x (segment bucket + new-token bucket) (see
            `LengthSortedSampler`); later steps keep the chunks.
          min_segment_bucket: smallest segment bucket (segments are padded to a power-of-two multiple).
          cache_quantum: granularity of cache capacities (`cache_bucket`).
        """
        if n_rows < 1:
            raise ValueError(f"n_rows must be >= 1, got {n_rows}")
        self.sampler, self.engine, self.n_rows = sampler, sampler.engine, n_rows
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
        lengths = [len(g) if g is not None else 0 for g in segments]
        live = [i for i in range(self.n_rows) if i not in self.released]

        def cells(rows: int, longest: int) -> int:
            tb = self._segment_bucket(longest)
            return bucket(rows, 1) * tb * (tb + new_bucket)

        groups = plan_chunks([lengths[i] for i in live], self.engine.max_batch, cells, self.max_cells)
        return [_Chunk([live[j] for j in g]) for g in groups]

    def _budgets(self, segments: Sequence[Sequence[int] | None], nmax: int,
                 max_new_tokens: Sequence[int] | None) -> np.ndarray:
        """[B] each active row's budget, after checking its segment and its room in the context."""
        if len(segments) != self.n_rows:
            raise ValueError(f"expected {self.n_rows} segments (one per row), got {len(segments)}")
        budgets = np.zeros(self.n_rows, np.int32)
        ctx = self.engine.cfg.max_position_embeddings
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
            if len(self.tokens[i]) + len(g) + int(budgets[i]) > ctx:
                raise ValueError(f"row {i}: {len(self.tokens[i])} cached + {len(g)} new + {budgets[i]} generated "
                                 f"tokens exceed the model context ({ctx})")
        return budgets

    def step(self, segments: Sequence[Sequence[int] | None], sampling: SamplingConfig, *,
             seed: int | jax.Array = 0, max_new_tokens: Sequence[int] | None = None,
             stop_ids: Sequence[Sequence[int]] | None = None, row_seeds: Sequence[int] | None = None,
             params: Params | None = None, row_offsets: Sequence[int] | None = None) -> GenerationResult:
        """Appends segments to the rows' contexts and generates each active row's continuation.

        Args:
          segments: per row, the token ids to append to its context, or None: the row is idle
            (nothing fed, nothing generated). A row's pending token (`pending[i]`, the last
            token it sampled) is not fed unless the caller puts it in the segment: a pending
            token left out is dropped.
          sampling: the sampling config (its max_new_tokens is the default per-row budget).
          seed: an int seed or a PRNG key.
          max_new_tokens: optional per-row budgets (each in [1, sampling.max_new_tokens] for an
            active row; ignored for an idle one).
          stop_ids: optional per-row stop ids (default: the model's EOS ids).
          row_seeds: optional [n_rows] seeds: row i samples with fold_in(key(seed), row_seeds[i])
            (default: i).
          params: the parameters of this step (default: the host's).
          row_offsets: optional [n_rows] tokens each row drew in earlier steps of the same reply:
            its t-th token of this step is drawn as its (offset + t)-th (`kernels._slot_keys`), so
            a reply decoded in slices with one seed draws what one call draws (default: 0).

        Returns:
          A GenerationResult over all rows (idle rows: no tokens, finish "none"); stats hold
          "prefill_tokens" (segment tokens fed) and "context_tokens" (cached + segment tokens of
          the active rows).

        Raises:
          ValueError: wrong number of segments, an empty or released active row, a budget out of
            range, or a row whose context + segment + budget exceeds the model context.
        """
        sampling.validate()
        budgets = self._budgets(segments, sampling.max_new_tokens, max_new_tokens)
        nb = bucket(sampling.max_new_tokens, self.engine.min_new_bucket)
        call = _Call(sampling, nb, seed, row_seed_array(row_seeds, self.n_rows), stop_ids,
                     self.sampler.params if params is None else params,
                     row_offsets=None if row_offsets is None else np.asarray(row_offsets, np.int32))
        call.dparams = self.sampler.decode_weights(call.params)
        if self.chunks is None:
            self.chunks = self._plan(segments, nb)
        t0 = time.perf_counter()
        prefill = sum(len(g) for g in segments if g is not None)
        context = sum(len(self.tokens[i]) + len(g) for i, g in enumerate(segments) if g is not None)
        out = _StepOut.empty(self.n_rows)
        new_chunks: list[_Chunk] = []
        for ch in self.chunks:
            chunk = self._step_chunk(ch, segments, budgets, call, out)
            if chunk is not None:
                new_chunks.append(chunk)
        self.chunks = new_chunks
        self._cleared -= {i for ch in new_chunks for i in ch.rows}
        self._cleared -= self.released
        result = GenerationResult(out.tokens, out.logprobs, out.lengths, out.finish,
                                  stats={"seconds": time.perf_counter() - t0, "new_tokens": float(out.lengths.sum()),
                                         "prefill_tokens": float(prefill), "context_tokens": float(context)})
        result.texts = self.sampler.decode_texts(out.tokens, out.finish)
        return result

    def _step_chunk(self, ch: _Chunk, segments: Sequence[Sequence[int] | None], budgets: np.ndarray,
                    call: "_Call", out: _StepOut) -> _Chunk | None:
        """One chunk's part of a step: regroup, repack, generate and record; the chunk to keep (None: freed)."""
        kept = [i for i in ch.rows if i not in self.released]
        if not kept:
            return None  # every row released: the cache is freed
        rb = self.engine.rows_bucket
        rows = kept if rb(len(kept)) < rb(len(ch.rows)) else ch.rows
        active = [i for i in rows if segments[i] is not None]
        if not active and rows == ch.rows and not any(i in self._cleared for i in rows):
            return ch
        tb = self._segment_bucket(max(len(segments[i]) for i in active)) if active else 0
        if self.engine.multi:  # one program on every process
            from jaxrl_mt.parallel import agree_max

            tb = agree_max(tb)
        chunk = self._repack(ch, rows, tb + call.nb - 1 if active else 0)
        ch.cache = None  # the repacked copy replaces it: free the old one now
        if active:
            res, chunk.cache = self._continue(chunk, segments, budgets, call, tb)
            self._record(rows, segments, res, out)
        return chunk

    def _record(self, rows: list[int], segments: Sequence[Sequence[int] | None], res: dict[str, np.ndarray],
                out: _StepOut) -> None:
        """Appends each active row's segment and reply to its cached tokens and copies its outputs."""
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
            out.tokens[i], out.logprobs[i] = gen, res["logprobs"][b, :m]
            out.lengths[i], out.finish[i] = m, self.finish[i]

    def _repack(self, ch: _Chunk, rows: list[int], room: int) -> _Chunk:
        """The chunk of `rows` (a subset of ch.rows, in order) with its cache repacked and `room`
        free slots after the longest context."""
        s = self.engine
        bb, old_bb = s.rows_bucket(len(rows)), s.rows_bucket(len(ch.rows))
        src = np.array([ch.rows.index(i) for i in rows] + [0] * (bb - len(rows)), np.int32)
        keep = np.array([i not in self._cleared for i in rows] + [False] * (bb - len(rows)))
        longest = max(len(self.tokens[i]) for i in rows)
        capacity = cache_bucket(longest + room, self.cache_quantum)
        n_proc = 1
        if s.multi:  # the cache holds every process's rows (process q's block at q * bb): global indices
            from jaxrl_mt.parallel import agree_max, allgather_ints, check_same_rows

            check_same_rows(len(ch.rows), "DecodeSession chunk")
            check_same_rows(len(rows), "DecodeSession chunk")
            capacity = agree_max(capacity)
            srcs, keeps = allgather_ints(src), allgather_ints(keep.astype(np.int32))
            n_proc = srcs.shape[0]
            src = (srcs + old_bb * np.arange(n_proc, dtype=np.int32)[:, None]).reshape(-1)
            keep = keeps.reshape(-1).astype(bool)
        if ch.cache is None:  # no cache yet (nothing fed): zero slots, in ch.rows' batch layout
            shape = (s.cfg.num_layers, old_bb * n_proc, s.cfg.num_kv_heads, 0, s.cfg.head_dim)
            dt = s.cfg.jnp_dtype
            old = KVCache(np.zeros(shape, dt), np.zeros(shape, dt), np.zeros((old_bb * n_proc, 0), bool),
                          np.zeros((), np.int32))
            if s.multi:
                from jaxrl_mt.parallel import put_replicated

                old = put_replicated(s.mesh, old)
        else:
            old = ch.cache
        cache = resize_cache(old, src, keep, capacity=capacity)
        if s.mesh is not None:
            from jaxrl_mt.parallel import shard_cache

            cache = shard_cache(cache, s.mesh)  # KV-cache rules: rows over (data, fsdp), KV heads over tensor
        return _Chunk(list(rows), cache)

    def _continue(self, chunk: _Chunk, segments: Sequence[Sequence[int] | None], budgets: np.ndarray,
                  call: "_Call", tb: int) -> tuple[dict[str, np.ndarray], KVCache]:
        """One `continue_tokens` call for a chunk (`DecodeEngine.continue_`)."""
        rows = chunk.rows
        bb = self.engine.rows_bucket(len(rows))  # this process's rows (the cache: every process's)
        segs = [list(segments[i]) if segments[i] is not None else [] for i in rows] + [[]] * (bb - len(rows))
        positions = np.zeros(bb, np.int32)
        positions[: len(rows)] = [len(self.tokens[i]) for i in rows]
        budget, seeds, offsets = np.zeros(bb, np.int32), np.zeros(bb, np.uint32), np.zeros(bb, np.int32)
        budget[: len(rows)], seeds[: len(rows)] = budgets[rows], call.row_seeds[rows]
        if call.row_offsets is not None:
            offsets[: len(rows)] = call.row_offsets[rows]
        stops = None if call.stop_ids is None else [call.stop_ids[i] for i in rows]
        self.sampler.compiled_shapes.add((bb, tb, int(chunk.cache.valid.shape[1]), call.nb))
        return self.engine.continue_(call.params, chunk.cache, positions, segs, tb, budget, call.sampling, call.nb,
                                     call.seed, seeds, stops, call.dparams, offsets)


@dataclasses.dataclass
class _Call:
    """What every chunk of one `DecodeSession.step` shares."""

    sampling: SamplingConfig
    nb: int  # new-token bucket
    seed: int | jax.Array
    row_seeds: np.ndarray  # [n_rows] uint32
    stop_ids: Sequence[Sequence[int]] | None
    params: Params
    dparams: Params | None = None
    row_offsets: np.ndarray | None = None  # [n_rows] tokens each row drew before this step
