"""The host side of generation: `Sampler` tokenises, buckets shapes, calls the jitted kernel, decodes.

Prompts are left-padded; each row has its own stop tokens and its own budget of new tokens.
Prompt length and batch are bucketed (powers of two, `jaxrl_mt.batching`) so a run compiles a
handful of programs. Rows beyond `max_batch` are answered in chunks (chunk j sampled with
`batching.chunk_key(seed, j)`). Under a mesh the rows are placed over its (data, fsdp) axes
(`parallel.put_rows`: `shard_batch` within one process, global rows across processes).
"""

from __future__ import annotations

import time
import weakref
from typing import Any, Sequence

import jax
import numpy as np

from jaxrl_mt.batching import bucket, chunk_key
from jaxrl_mt.chat import ChatError, Conversation, encode_prompt, left_pad
from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import Params
from jaxrl_mt.sampling.kernels import FINISH_NAMES, decode_params_jit, generate_tokens
from jaxrl_mt.sampling.methods import RowParams, SamplingConfig
from jaxrl_mt.sampling.results import GenerationResult, stop_array
from jaxrl_mt.sampling.session import DecodeSession


class Sampler:
    """Host-side driver: tokenises, buckets shapes, calls `generate_tokens`, decodes."""

    def __init__(self, params: Params, cfg: ModelConfig, tokenizer: Any = None, *,
                 eos_ids: Sequence[int] = (), pad_id: int = 0, min_prompt_bucket: int = 32,
                 min_new_bucket: int = 16, max_batch: int | None = None, mesh: Any = None,
                 fuse_weights: bool | None = None, row_multiple: int | None = None,
                 unstack_layers: bool = False):
        self.params, self.cfg, self.tokenizer = params, cfg, tokenizer
        # fused decode weights (`decode_params`): default on the CPU backend, where they are faster;
        # made once per parameter version (`decode_weights`)
        self.fuse_weights = jax.default_backend() == "cpu" if fuse_weights is None else fuse_weights
        # the kept decode weights as a tuple of per-layer dicts (`decode_params(unstack=True)`): the
        # decoder unrolls its layer loop and reads each layer's weights in place, where the scan
        # copies every layer's weights out of the stacked arrays at every decode step on XLA:CPU.
        # Off by default: on an idle AVX2 host it decoded no faster (7.36 vs 7.25 s for 8 x 64 tokens)
        # and compiled 7 s longer per shape (docs/performance.md, "Where a decode step goes")
        self.unstack_layers = unstack_layers
        self._decode_cache: tuple[list[Any], Params] | None = None  # (weakrefs to the params' leaves, dparams)
        self.eos_ids = tuple(eos_ids)
        self.pad_id = pad_id
        self.min_prompt_bucket, self.min_new_bucket = min_prompt_bucket, min_new_bucket
        self.max_batch = max_batch
        self.row_multiple = row_multiple  # rows bucket: a multiple of this above it (None: powers of two)
        self.mesh = mesh
        # shapes run so far: (B, P, N) for generate_tokens, ("grouped", U, B, P, N) for generate_tokens
        # with shared prompts, (B, T, S, N) for continue_tokens
        self.compiled_shapes: set[tuple[Any, ...]] = set()

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
            dparams = decode_params_jit(self.params, self.cfg, unstack=self.unstack_layers)
            self._decode_cache = ([weakref.ref(x) for x in leaves], dparams)
        return self._decode_cache[1]

    def release_decode_weights(self) -> None:
        """Drops the kept fused decode weights (a training loop, whose parameters change every
        step, calls it after generating, so no second copy of the weights lives through the update)."""
        self._decode_cache = None

    def rows_bucket(self, n: int) -> int:
        """Rows of a call of n rows: a power of two (with `row_multiple` k: a multiple of k once n > k),
        padded to a multiple of the mesh's row shards (`parallel.row_shards`), so that the rows (and
        the KV cache) are split over the devices."""
        from jaxrl_mt.parallel import row_shards, rows_multiple, spans_processes

        m = rows_multiple(self.mesh) if spans_processes(self.mesh) else row_shards(self.mesh)  # this process's share
        k = self.row_multiple
        rows = -(-n // k) * k if k and n > k else bucket(n, 1)
        return -(-rows // m) * m

    @classmethod
    def from_model(cls, model: Any, *, mesh: Any = None, **kw: Any) -> "Sampler":
        """A sampler of a registry Model; with a `mesh`, its parameters placed by the partition rules
        (`parallel.shard_params`; already placed arrays are not copied)."""
        params = model.params
        if mesh is not None:
            from jaxrl_mt.parallel import shard_params

            params = shard_params(params, mesh)
        return cls(params, model.cfg, model.tokenizer, eos_ids=model.eos_ids, pad_id=model.pad_id, mesh=mesh, **kw)

    def generate_ids(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, *,
                     seed: int | jax.Array = 0, max_new_tokens: Sequence[int] | None = None,
                     stop_ids: Sequence[Sequence[int]] | None = None, group_size: int = 1) -> GenerationResult:
        """Generates continuations of token-id prompts.

        Args:
          prompts: U prompts of token ids (non-empty).
          sampling: the sampling config (its max_new_tokens is the default per-row budget).
          seed: an int seed or a PRNG key; the same seed gives the same outputs (chunk j uses
            `batching.chunk_key(seed, j)`).
          max_new_tokens: optional per-row budgets (each <= sampling.max_new_tokens).
          stop_ids: optional per-row stop ids (default: the model's EOS ids for every row).
          group_size: G: each prompt is answered G times, in rows p0 x G, p1 x G, ... (B = U * G
            rows; `max_new_tokens` and `stop_ids` are per row). Each prompt is prefilled once per
            call and its KV cache copied to its G rows. A chunk holds whole groups
            (max(1, max_batch // G) prompts); with G = 1 a chunk is `max_batch` rows. When one
            chunk holds every row, the draws are those of the same rows with each prompt passed
            G times (the prefill differs only by the rounding of a smaller batch).
        """
        sampling.validate()
        if not prompts:
            raise ValueError("no prompts")
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty")
        n, G = sampling.max_new_tokens, group_size
        n_rows = len(prompts) * G
        budgets = np.full(n_rows, n, np.int32) if max_new_tokens is None else np.asarray(max_new_tokens, np.int32)
        if budgets.shape != (n_rows,):
            raise ValueError(f"max_new_tokens: {budgets.shape[0] if budgets.ndim else 1} budgets for {n_rows} rows")
        if np.any(budgets <= 0) or np.any(budgets > n):
            raise ValueError(f"per-row max_new_tokens must be in [1, {n}]")
        longest = max(len(p) for p in prompts)
        ctx = self.cfg.max_position_embeddings
        if longest + n > ctx:
            raise ValueError(f"prompt of {longest} tokens + {n} new tokens exceeds the model context ({ctx})")
        chunk = max(1, (self.max_batch or n_rows) // G)  # prompts per chunk
        results: list[dict[str, np.ndarray]] = []
        t0 = time.perf_counter()
        for j, s in enumerate(range(0, len(prompts), chunk)):
            r0, r1 = s * G, min(s + chunk, len(prompts)) * G
            results.append(self._run(prompts[s:s + chunk], budgets[r0:r1], sampling, chunk_key(seed, j),
                                     None if stop_ids is None else stop_ids[r0:r1], G))
        out = {k: np.concatenate([r[k] for r in results]) for k in results[0]}
        dt = time.perf_counter() - t0
        lengths = out["lengths"]
        toks = [out["tokens"][i, : lengths[i]].tolist() for i in range(n_rows)]
        lps = [out["logprobs"][i, : lengths[i]] for i in range(n_rows)]
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

    def _run(self, prompts, budgets, sampling, key, stop_ids, group: int = 1) -> dict[str, np.ndarray]:
        from jaxrl_mt.parallel import agree_max_many, fetch_rows, put_replicated, put_rows, spans_processes

        multi = spans_processes(self.mesh)  # a mesh over several processes: a collective call on per-process rows
        if multi and group > 1:  # the processes agree on row counts, not on prompt counts: tile on the host
            prompts, group = [p for p in prompts for _ in range(group)], 1
        b = len(prompts) * group
        bb = self.rows_bucket(b)
        pb = min(bucket(max(len(p) for p in prompts), self.min_prompt_bucket),
                 self.cfg.max_position_embeddings - sampling.max_new_tokens)
        stops = [list(stop_ids[i]) if stop_ids is not None else list(self.eos_ids) for i in range(b)]
        width = max(1, max((len(s) for s in stops), default=0))
        if multi:  # one program: every process pads to the largest row, prompt and stop-list buckets
            bb, pb, width = agree_max_many([bb, pb, width])
        nb = min(bucket(sampling.max_new_tokens, self.min_new_bucket), self.cfg.max_position_embeddings - pb)
        src = None
        if group == 1:
            rows = list(prompts) + [[self.pad_id]] * (bb - b)
        else:  # distinct prompts once; output row i continues prompt src[i] (padding rows: prompt 0, budget 0)
            ub = self.rows_bucket(len(prompts))
            rows = list(prompts) + [[self.pad_id]] * (ub - len(prompts))
            src = np.zeros(bb, np.int32)
            src[:b] = np.repeat(np.arange(len(prompts), dtype=np.int32), group)
        tokens, mask = left_pad(rows, self.pad_id, pb)
        budget = np.zeros(bb, np.int32)
        budget[:b] = budgets
        stop_arr = stop_array(stops, bb)
        if multi:
            stop_arr = np.pad(stop_arr, ((0, 0), (0, width - stop_arr.shape[1])), constant_values=-1)
        self.compiled_shapes.add((bb, pb, nb) if src is None else ("grouped", len(rows), bb, pb, nb))
        rp = sampling.row_params(bb)
        args = [tokens, mask, stop_arr, budget, rp.temperature, rp.top_k, rp.top_p]
        if self.mesh is not None:  # rows over (data, fsdp): one process shard_batch, several global rows
            args = put_rows(self.mesh, args)
        if multi:
            key = put_replicated(self.mesh, key)
        if self.mesh is not None and src is not None:
            src = put_replicated(self.mesh, src)
        tokens, mask, stop_arr, budget, *rp = args
        r = generate_tokens(self.params, self.cfg, tokens, mask, key, stop_arr, budget, RowParams(*rp), max_new=nb,
                            method=sampling.method(), fuse=self.fuse_weights, dparams=self.decode_weights(),
                            mesh=self.mesh, row_source=src)
        r = fetch_rows(r)  # this process's rows; jax.device_get when the arrays are addressable
        return {k: np.asarray(v)[:b] for k, v in r.items()}

    def session(self, n_rows: int, **kw: Any) -> DecodeSession:
        """A `DecodeSession` of `n_rows` rows on this sampler (keyword arguments: its options)."""
        return DecodeSession(self, n_rows, **kw)

    def generate(self, conversations: Sequence[Conversation], sampling: SamplingConfig, *,
                 seed: int | jax.Array = 0, system: str | None = None, **kw: Any) -> GenerationResult:
        """Generates the next assistant message of each conversation (chat template applied)."""
        if self.tokenizer is None:
            raise ChatError("Sampler.generate needs a tokenizer")
        prompts = [encode_prompt(self.tokenizer, c, system=system) for c in conversations]
        return self.generate_ids(prompts, sampling, seed=seed, **kw)
