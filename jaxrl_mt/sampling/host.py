"""The host side of generation: `Sampler` tokenises, calls the frozen engine, decodes.

Prompts are left-padded; each row has its own stop tokens and its own budget of new tokens.
Prompt length and batch are bucketed (powers of two, `jaxrl_mt.batching`) so a run compiles a
handful of programs. A call runs the slot engine (`sampling.scheduler`): at most `max_batch`
slots, refilled with waiting rows as rows finish. On a mesh over several processes a call is
collective: each process passes its own rows, every process runs the same host loop on the
global rows (every process's, in process order; `sampling.multiprocess`) and returns its own.
`run_turns` runs conversations that keep their slot across turns (`sampling.turns`), on one
process or, replicated (every process the same conversations), on several.
`generate_chunked` (chunks of `max_batch` rows, each run to its longest row) is only the
reference of `benchmarks workload`. Row r draws its t-th token with
fold_in(fold_in(key(seed), row_seeds[r]), t) (default row seed: r), so a row's tokens do not
depend on the slot, chunk or batch it is answered in. Shapes, placement on the mesh and the
kernel calls are the `DecodeEngine`'s (`sampling.engine`); the parameters are passed per call
(`params=`), the sampler's own `params` being the default.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Sequence

import jax
import numpy as np

from jaxrl_mt.batching import as_key
from jaxrl_mt.chat import ChatError, Conversation, encode_prompt
from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import Params
from jaxrl_mt.sampling.counters import KEYS, add_counters, decode_counters, utilisation
from jaxrl_mt.sampling.engine import DecodeEngine, FusedWeights, row_seed_array
from jaxrl_mt.sampling.kernels import FINISH_NAMES
from jaxrl_mt.sampling.methods import SamplingConfig
from jaxrl_mt.sampling.results import GenerationResult


class Sampler:
    """Host-side driver around a `DecodeEngine`: tokenises, runs the engine, decodes texts.

    Args:
      params: the default parameters of a call (a call may pass its own, `params=`).
      cfg, eos_ids, pad_id, min_prompt_bucket, min_new_bucket, max_batch, mesh, row_multiple: the
        engine's fields (`DecodeEngine`).
      tokenizer: for `generate` and decoded texts (None: token ids only).
      fuse_weights: decode with fused weights (`decode_params`); default on the CPU backend,
        where they are faster; made once per parameter version (`decode_weights`).
    """

    def __init__(self, params: Params, cfg: ModelConfig, tokenizer: Any = None, *,
                 eos_ids: Sequence[int] = (), pad_id: int = 0, min_prompt_bucket: int = 32,
                 min_new_bucket: int = 16, max_batch: int | None = None, mesh: Any = None,
                 fuse_weights: bool | None = None, row_multiple: int | None = None):
        self.params, self.tokenizer = params, tokenizer
        fuse = jax.default_backend() == "cpu" if fuse_weights is None else fuse_weights
        self.engine = DecodeEngine(cfg, tuple(eos_ids), pad_id, min_prompt_bucket, min_new_bucket, max_batch,
                                   row_multiple, mesh, bool(fuse))
        self._fused = FusedWeights()
        # shapes run so far: ("admit", ...), ("segment", W, S, N), ("extend", ...) of the slot engine;
        # (B, P, N) for generate_tokens, ("grouped", U, B, P, N) with shared prompts (`generate_chunked`)
        self.compiled_shapes: set[tuple[Any, ...]] = set()
        # the decode counters (`sampling.counters`) of every generate_ids call so far, summed
        self.totals: dict[str, int] = dict.fromkeys(KEYS, 0)

    # the engine's fields, read through the sampler (to change one, replace the frozen engine:
    # `sampler.engine = dataclasses.replace(sampler.engine, max_batch=8)`)
    cfg = property(lambda self: self.engine.cfg)
    eos_ids = property(lambda self: self.engine.eos_ids)
    pad_id = property(lambda self: self.engine.pad_id)
    min_prompt_bucket = property(lambda self: self.engine.min_prompt_bucket)
    min_new_bucket = property(lambda self: self.engine.min_new_bucket)
    max_batch = property(lambda self: self.engine.max_batch)
    row_multiple = property(lambda self: self.engine.row_multiple)
    mesh = property(lambda self: self.engine.mesh)
    fuse_weights = property(lambda self: self.engine.fuse_weights)

    def bound(self, params: Params) -> "Sampler":
        """This sampler on other default parameters: a view sharing the engine, the tokenizer, the
        fused-weights cache, the compiled shapes and the counter totals; this sampler is unchanged."""
        view = copy.copy(self)
        view.params = params
        return view

    def decode_weights(self, params: Params | None = None) -> Params | None:
        """`decode_params(params)` (default: the sampler's), made once per parameter version (None
        when not used: not fused, or under a mesh, where each call fuses them; `FusedWeights`)."""
        return self._fused.get(self.engine, self.params if params is None else params)

    def release_decode_weights(self) -> None:
        """Drops the kept fused decode weights (a training loop, whose parameters change every
        step, calls it after generating, so no second copy of the weights lives through the update)."""
        self._fused.clear()

    def rows_bucket(self, n: int) -> int:
        """`DecodeEngine.rows_bucket`."""
        return self.engine.rows_bucket(n)

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
                     stop_ids: Sequence[Sequence[int]] | None = None, group_size: int = 1,
                     row_seeds: Sequence[int] | None = None, params: Params | None = None) -> GenerationResult:
        """Generates continuations of token-id prompts.

        Args:
          prompts: U prompts of token ids (non-empty).
          sampling: the sampling config (its max_new_tokens is the default per-row budget).
          seed: an int seed or a PRNG key; the same seed gives the same outputs.
          max_new_tokens: optional per-row budgets (each <= sampling.max_new_tokens).
          stop_ids: optional per-row stop ids (default: the model's EOS ids for every row).
          group_size: G: each prompt is answered G times, in rows p0 x G, p1 x G, ... (B = U * G
            rows; `max_new_tokens` and `stop_ids` are per row). Each prompt is prefilled once and
            its G rows admitted together; the slot engine stores the prompt once and reads it once
            per step (`models.prefix_attention`). The draws are those of the same rows with each
            prompt passed G times (up to the rounding of a different batch and summation order).
          row_seeds: optional [U * G] per-row seeds: row r samples with fold_in(key(seed), row_seeds[r]),
            whatever else is in the call (default: r).
          params: the parameters of this call (default: the sampler's).

        On a mesh over several processes the call is collective (every process calls it, with its
        own rows, the same sampling config, seed and group size): the result holds this process's
        rows; its stats (and `totals`) count the global call's work.
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
        # per-process rows of a multi-process call: default seeds apart by process (2^20 rows each)
        seeds = row_seed_array(row_seeds, n_rows, offset=jax.process_index() << 20 if self.engine.multi else 0)
        params = self.params if params is None else params
        dparams = self.decode_weights(params)
        t0 = time.perf_counter()
        out, counters = self.engine.generate_slots(params, prompts, budgets, sampling, seed, seeds, stop_ids, G,
                                                   dparams, on_shape=self.compiled_shapes.add)
        dt = time.perf_counter() - t0
        for k in KEYS:  # in place: views of this sampler (`bound`) add to the same totals
            self.totals[k] += int(counters.get(k, 0))
        lengths = out["lengths"]
        toks = [out["tokens"][i, : lengths[i]].tolist() for i in range(n_rows)]
        lps = [out["logprobs"][i, : lengths[i]] for i in range(n_rows)]
        extra = {k: float(counters[k]) for k in ("segments", "admissions", "compactions") if k in counters}
        res = GenerationResult(toks, lps, lengths, [FINISH_NAMES[int(f)] for f in out["finish"]],
                               stats={"seconds": dt, "new_tokens": float(lengths.sum()), **utilisation(counters),
                                      **extra})
        res.texts = self.decode_texts(toks, res.finish_reasons)
        return res

    def run_turns(self, feeds: Sequence[Any], sampling: SamplingConfig, advance: Any, *,
                  seed: int | jax.Array = 0, params: Params | None = None) -> dict[str, int]:
        """Answers conversations turn after turn on the slot engine, a slot holding a conversation's
        cache across its turns (`sampling.turns.run_turns`: `feeds` its first `Feed`s, `advance` the
        hook giving the next ones). Returns the engine's counters (also added to `totals`).

        On a mesh over several processes the call is collective and replicated: every process passes
        the same feeds, sampling config and seed (checked) and hooks that give the same feeds (every
        process runs every conversation, as a multi-process evaluation does), and every process gets
        every reply.
        """
        from jaxrl_mt.sampling.turns import run_turns

        sampling.validate()
        key = as_key(seed)
        if self.engine.multi:
            from jaxrl_mt.sampling.multiprocess import check_same, feeds_digest

            check_same(feeds_digest(feeds, sampling, key), "run_turns")
        params = self.params if params is None else params
        weights = self.engine.weights(params, self.decode_weights(params))
        counters = run_turns(weights, self.engine, feeds, sampling, key, advance,
                             width=self.engine.slot_width(max(len(feeds), 1)), on_shape=self.compiled_shapes.add)
        for k in KEYS:
            self.totals[k] += int(counters.get(k, 0))
        return counters

    def generate_chunked(self, params: Params, prompts: Sequence[Sequence[int]], budgets: np.ndarray,
                         sampling: SamplingConfig, seed: Any, seeds: np.ndarray,
                         stop_ids: Sequence[Sequence[int]] | None, G: int,
                         dparams: Params | None) -> tuple[dict[str, np.ndarray], dict[str, int]]:
        """The rows in chunks of `max_batch`, each one `generate_tokens` call run to its longest row: only
        the reference of `benchmarks workload` (`generate_ids` runs the slot engine, on one process
        or several). Arguments as `generate_ids` (checked there); returns the outputs and counters."""
        chunk = max(1, (self.max_batch or len(prompts) * G) // G)  # prompts per chunk
        results: list[dict[str, np.ndarray]] = []
        counters: dict[str, int] = {}
        for s in range(0, len(prompts), chunk):
            r0, r1 = s * G, min(s + chunk, len(prompts)) * G
            out, shape = self.engine.generate(params, prompts[s:s + chunk], budgets[r0:r1], sampling, seed,
                                              seeds[r0:r1], None if stop_ids is None else stop_ids[r0:r1], G, dparams)
            self.compiled_shapes.add(shape)
            results.append(out)
            bb, pb, nb = shape[-3:]
            counters = add_counters(counters, decode_counters(
                [len(p) for p in prompts[s:s + chunk] for _ in range(G)], out["lengths"], rows=bb, prompt_bucket=pb,
                new_bucket=nb))
        return {k: np.concatenate([r[k] for r in results]) for k in results[0]}, counters

    def decode_texts(self, tokens: Sequence[Sequence[int]], finish_reasons: Sequence[str]) -> list[str] | None:
        """Decoded replies, without the stop token of a row that ended on one (None: no tokenizer)."""
        if self.tokenizer is None:
            return None
        stops = set(self.eos_ids)
        return [self.tokenizer.decode([t for t in (tk[:-1] if (tk and tk[-1] in stops and fr == "stop") else tk)],
                                      skip_special_tokens=False)
                for tk, fr in zip(tokens, finish_reasons)]

    def answer(self, chats: Sequence[Conversation], sampling: SamplingConfig, *, seed: int | jax.Array = 0,
               row_seeds: Sequence[int] | None = None) -> tuple[GenerationResult, list[int]]:
        """The sampler protocol's answer method (a model behind an API has the same:
        `jaxrl_mt.remote.RemoteSampler.answer`): one reply per chat (its system message included by
        the caller), with the prompts' token counts."""
        if self.tokenizer is None:
            raise ChatError("Sampler.answer needs a tokenizer")
        prompts = [encode_prompt(self.tokenizer, c) for c in chats]
        return self.generate_ids(prompts, sampling, seed=seed, row_seeds=row_seeds), [len(p) for p in prompts]

    def generate(self, conversations: Sequence[Conversation], sampling: SamplingConfig, *,
                 seed: int | jax.Array = 0, system: str | None = None, **kw: Any) -> GenerationResult:
        """Generates the next assistant message of each conversation (chat template applied)."""
        if self.tokenizer is None:
            raise ChatError("Sampler.generate needs a tokenizer")
        prompts = [encode_prompt(self.tokenizer, c, system=system) for c in conversations]
        return self.generate_ids(prompts, sampling, seed=seed, **kw)
