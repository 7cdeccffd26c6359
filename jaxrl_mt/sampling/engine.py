"""`DecodeEngine`: the frozen part of generation, driven by `Sampler`.

The engine holds what does not change during a run (the model config, stop and pad ids, the
shape buckets, the mesh, whether decode weights are fused) in one frozen, hashable dataclass,
and assembles the kernels' inputs from host rows: padding, buckets, per-row budgets, stop ids,
sampling values and keys, placement on the mesh and the fetch of this process's rows. The
parameters are an argument of every call, never an attribute (gemma's ``_sampler_loop``: a
frozen loop; ``Sampler`` is the stateful wrapper around it).

Sampling keys are per row: row r of a call draws its token at output slot t with
``fold_in(fold_in(key(seed), row_seed[r]), t)``, so what a row samples depends on its own seed
only, not on which other rows share its batch, chunk or device (a conversation passes the same
row seed wherever it is answered; `conversations.row_seed`). The default row seed is the row's
index in the call.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Sequence

import jax
import numpy as np

from jaxrl_mt.batching import as_key, bucket
from jaxrl_mt.chat import left_pad
from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import Params
from jaxrl_mt.sampling.kernels import decode_params_jit, generate_tokens
from jaxrl_mt.sampling.methods import RowParams, SamplingConfig
from jaxrl_mt.sampling.results import stop_array


def row_seed_array(row_seeds: Sequence[int] | None, n: int, offset: int = 0) -> np.ndarray:
    """[n] uint32 row seeds: the given ones, or the row indices offset..offset+n-1."""
    if row_seeds is None:
        return np.arange(offset, offset + n, dtype=np.uint32)
    arr = np.asarray(row_seeds, np.int64)
    if arr.shape != (n,):
        raise ValueError(f"row_seeds: {arr.size} seeds for {n} rows")
    return (arr % (1 << 32)).astype(np.uint32)


@dataclasses.dataclass(frozen=True)
class DecodeEngine:
    """Configuration, buckets, mesh and kernel-input assembly of generation (see the module doc)."""

    cfg: ModelConfig
    eos_ids: tuple[int, ...] = ()  # default stop ids of every row
    pad_id: int = 0
    min_prompt_bucket: int = 32  # smallest prompt bucket (prompts padded to a power-of-two multiple)
    min_new_bucket: int = 16  # smallest bucket of the new-token buffers
    max_batch: int | None = None  # rows per kernel call (None: all)
    row_multiple: int | None = None  # rows bucket: a multiple of this above it (None: powers of two)
    mesh: Any = None  # rows over its (data, fsdp) axes, the KV cache by `parallel.CACHE_RULES`
    fuse_weights: bool = False  # decode with `decode_params` (fused Q/K/V, gate/up)
    segment_steps: int = 16  # slot engine: decode steps per segment at most (`sampling.slots.segment`)

    @property
    def multi(self) -> bool:
        """Whether the mesh spans several processes (every call is then collective)."""
        from jaxrl_mt.parallel import spans_processes

        return spans_processes(self.mesh)

    def rows_bucket(self, n: int) -> int:
        """Rows of a call of n rows: a power of two (with `row_multiple` k: a multiple of k once n > k),
        padded to a multiple of this process's share of the mesh's row shards."""
        from jaxrl_mt.parallel import row_shards, rows_multiple

        m = rows_multiple(self.mesh) if self.multi else row_shards(self.mesh)
        k = self.row_multiple
        rows = -(-n // k) * k if k and n > k else bucket(n, 1)
        return -(-rows // m) * m

    def new_bucket(self, max_new: int, used: int = 0) -> int:
        """The new-token buffer of a call (at most the context left after `used` slots)."""
        return min(bucket(max_new, self.min_new_bucket), self.cfg.max_position_embeddings - used)

    def prompt_bucket(self, prompts: Sequence[Sequence[int]], max_new: int) -> int:
        """P of a call: its longest prompt's bucket, at most the context left after `max_new` tokens."""
        longest = max(len(p) for p in prompts)
        return min(bucket(longest, self.min_prompt_bucket), self.cfg.max_position_embeddings - max_new)

    def stop_width(self, stop_ids: Sequence[Sequence[int]] | None) -> int:
        """E, the stop ids of a row (at least 1): the longest given list, or the default `eos_ids`."""
        return max(1, max((len(s) for s in stop_ids), default=0) if stop_ids is not None else len(self.eos_ids))

    def stops(self, stop_ids: Sequence[Sequence[int]] | None, n: int, rows: int, width: int = 1) -> np.ndarray:
        """[rows, E] stop ids of n real rows (default: `eos_ids`; padding rows: none), at least `width` wide."""
        lists = [list(stop_ids[i]) if stop_ids is not None else list(self.eos_ids) for i in range(n)]
        arr = stop_array(lists, rows)
        return np.pad(arr, ((0, 0), (0, max(0, width - arr.shape[1]))), constant_values=-1)

    def _place(self, rows: list[Any], key: jax.Array, replicated: Any = None) -> tuple[list[Any], jax.Array, Any]:
        """Row arrays onto the mesh (rows over data x fsdp), the key and `replicated` everywhere."""
        if self.mesh is None:
            return rows, key, replicated
        from jaxrl_mt.parallel import put_replicated, put_rows

        rows = put_rows(self.mesh, rows)
        if self.multi:
            key = put_replicated(self.mesh, key)
        if replicated is not None:
            replicated = put_replicated(self.mesh, replicated)
        return rows, key, replicated

    def generate(self, params: Params, prompts: Sequence[Sequence[int]], budgets: np.ndarray,
                 sampling: SamplingConfig, seed: Any, row_seeds: np.ndarray,
                 stop_ids: Sequence[Sequence[int]] | None = None, group: int = 1, dparams: Params | None = None
                 ) -> tuple[dict[str, np.ndarray], tuple[Any, ...]]:
        """One `generate_tokens` call: rows p0 x group, p1 x group, ... ; their outputs and the call's shape.

        Args:
          params: the parameters; dparams: their `decode_params` (None: made inside the call if fused).
          prompts: U non-empty token-id prompts; budgets: [U * group] new-token budgets.
          seed: an int seed or a PRNG key; row_seeds: [U * group] uint32 seeds of the rows.
          stop_ids: optional per-row stop ids; group: completions per prompt (one prefill each).

        Returns:
          ({tokens, logprobs, lengths, finish}: this process's rows, trimmed to U * group), and the
          shape key (B, P, N) or ("grouped", U, B, P, N).
        """
        from jaxrl_mt.parallel import agree_max_many, fetch_rows

        if self.multi and group > 1:  # the processes agree on row counts, not on prompt counts: tile
            prompts, group = [p for p in prompts for _ in range(group)], 1
        b = len(prompts) * group
        bb = self.rows_bucket(b)
        pb = self.prompt_bucket(prompts, sampling.max_new_tokens)
        width = self.stop_width(stop_ids)
        if self.multi:  # one program: every process pads to the largest row, prompt and stop-list buckets
            bb, pb, width = agree_max_many([bb, pb, width])
        nb = self.new_bucket(sampling.max_new_tokens, pb)
        src = None
        if group == 1:
            rows = list(prompts) + [[self.pad_id]] * (bb - b)
        else:  # distinct prompts once; output row i continues prompt src[i] (padding rows: prompt 0, budget 0)
            rows = list(prompts) + [[self.pad_id]] * (self.rows_bucket(len(prompts)) - len(prompts))
            src = np.zeros(bb, np.int32)
            src[:b] = np.repeat(np.arange(len(prompts), dtype=np.int32), group)
        tokens, mask = left_pad(rows, self.pad_id, pb)
        budget, seeds = np.zeros(bb, np.int32), np.zeros(bb, np.uint32)
        budget[:b], seeds[:b] = budgets, row_seeds
        rp = sampling.row_params(bb)
        args = [tokens, mask, self.stops(stop_ids, b, bb, width), budget, seeds, rp.temperature, rp.top_k, rp.top_p]
        args, key, src = self._place(args, as_key(seed), src)
        tokens, mask, stops, budget, seeds, *rp = args
        r = generate_tokens(params, self.cfg, tokens, mask, key, stops, budget, RowParams(*rp), max_new=nb,
                            method=sampling.method(), fuse=self.fuse_weights, dparams=dparams, mesh=self.mesh,
                            row_source=src, row_seeds=seeds)
        r = fetch_rows(r)  # this process's rows; jax.device_get when the arrays are addressable
        shape = (bb, pb, nb) if src is None else ("grouped", len(rows), bb, pb, nb)
        return {k: np.asarray(v)[:b] for k, v in r.items()}, shape

    def weights(self, params: Params, dparams: Params | None = None) -> Params:
        """The weights the slot programs decode with: `dparams` when given (fused once by the host),
        else the fused `decode_params` when `fuse_weights`, else `params`."""
        if dparams is not None:
            return dparams
        return decode_params_jit(params, self.cfg) if self.fuse_weights else params

    def slot_width(self, rows: int, group: int = 1) -> int:
        """W, the slots of a call of `rows` rows: its row bucket, at most `max_batch` (at least a group),
        a multiple of the mesh's row shards. On a mesh over several processes `rows` are the global
        call's and the cap is `max_batch` per process (the devices hold as many slots as in one)."""
        from jaxrl_mt.parallel import row_shards

        cap = (self.max_batch or rows) * (jax.process_count() if self.multi else 1)
        w = max(group, self.rows_bucket(min(rows, cap)))
        m = row_shards(self.mesh)
        return -(-w // m) * m

    def generate_slots(self, params: Params, prompts: Sequence[Sequence[int]], budgets: np.ndarray,
                       sampling: SamplingConfig, seed: Any, row_seeds: np.ndarray,
                       stop_ids: Sequence[Sequence[int]] | None = None, group: int = 1,
                       dparams: Params | None = None, on_shape: Any = None) -> tuple[dict[str, np.ndarray], dict]:
        """Every row of a call through the slot engine (`sampling.scheduler.run_slots`), on one device or
        a mesh. On a mesh over several processes the call is collective: each process passes its
        own rows, every process runs the global call (every process's rows in process order,
        `sampling.multiprocess`) and keeps its own rows' outputs.

        Args: as `generate` (rows p0 x group, p1 x group, ...); on_shape: called with each program
        shape run.

        Returns:
          ({tokens, logprobs, lengths, finish} of the U * group rows, the engine's counters: those of
          the global call on several processes).
        """
        from jaxrl_mt.sampling.scheduler import run_slots

        key, budgets, row_seeds = as_key(seed), np.asarray(budgets, np.int32), np.asarray(row_seeds, np.uint32)
        block = None
        if self.multi:  # the global call on every process
            from jaxrl_mt.sampling.multiprocess import global_rows

            lists = [list(stop_ids[i]) if stop_ids is not None else list(self.eos_ids)
                     for i in range(len(prompts) * group)]
            prompts, budgets, row_seeds, stop_ids, block = global_rows(prompts, budgets, row_seeds, lists, group,
                                                                       sampling, key)
        b = len(prompts) * group
        pb = self.prompt_bucket(prompts, sampling.max_new_tokens)
        nb = self.new_bucket(sampling.max_new_tokens, pb)
        width = self.stop_width(stop_ids)
        weights = self.weights(params, dparams)
        out = run_slots(weights, self.cfg, prompts, budgets, self.stops(stop_ids, b, b, width),
                        sampling.row_params(b), key, row_seeds, method=sampling.method(), pad_id=self.pad_id,
                        width=self.slot_width(b, group), steps=self.segment_steps, prompt_bucket=pb, max_new=nb,
                        group=group, min_prompt_bucket=self.min_prompt_bucket, on_shape=on_shape, mesh=self.mesh)
        counters = out.pop("counters")
        if block is not None:  # this process's rows
            out = {k: v[block[0]:block[1]] for k, v in out.items()}
        return out, counters


class FusedWeights:
    """`decode_params(params)` made once per parameter version (a weak cache keyed by the leaves).

    A new version is any change of a leaf's identity; the cache holds weak references to the
    leaves, so it keeps no old version alive.
    """

    def __init__(self) -> None:
        self._cache: tuple[list[Any], Params] | None = None

    def get(self, engine: DecodeEngine, params: Params) -> Params | None:
        """The fused weights of `params` (None when the engine does not fuse, or under a mesh of more
        than one device, where they are made inside each call so that they inherit the sharding)."""
        if not engine.fuse_weights or (engine.mesh is not None and engine.mesh.size > 1):
            return None
        leaves = jax.tree_util.tree_leaves(params)
        refs = self._cache[0] if self._cache is not None else []
        if len(refs) != len(leaves) or any(ref() is not leaf for ref, leaf in zip(refs, leaves)):
            self._cache = None  # the old copy is freed before the new one is made
            self._cache = ([weakref.ref(x) for x in leaves], decode_params_jit(params, engine.cfg))
        return self._cache[1]

    def clear(self) -> None:
        """Drops the kept copy."""
        self._cache = None
