"""Length-sorted, memory-bounded chunks of one generation call (`LengthSortedSampler`).

The batched multi-turn runner answers conversations of very different lengths in one call (a
7-turn AtR history next to a FULL prompt). This wrapper of a `Sampler` sorts the rows by prompt
length and bounds each chunk's prefill memory, with the chunk plan of `batching.plan_chunks`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxrl_mt.batching import bucket, plan_chunks
from jaxrl_mt.sampling.host import Sampler
from jaxrl_mt.sampling.results import GenerationResult
from jaxrl_mt.sampling.methods import SamplingConfig

DEFAULT_MAX_CHUNK_CELLS = 16 * 512 * 576  # rows x prompt bucket x (prompt + new-token bucket) per chunk


class LengthSortedSampler:
    """Wraps a Sampler: each ``generate_ids`` call is answered by length-sorted, memory-bounded chunks.

    Conversations of a batch differ in length (a 7-turn AtR history next to a FULL prompt), and
    the sampler pads a chunk to a power-of-two bucket of its longest prompt, with prefill
    attention memory growing as rows x bucket x (bucket + new tokens). Sorting rows by prompt
    length makes chunks homogeneous (less padding), and the longest prompts get chunks of fewer
    rows so that rows x P x (P + N) stays under ``max_cells``. Consecutive full-size chunks go to
    the wrapped sampler in one call (it splits them by ``max_batch`` itself); results come back
    in the caller's order. Other attributes (tokenizer, cfg, ...) are the wrapped sampler's.
    """

    def __init__(self, sampler: Sampler, max_cells: int = DEFAULT_MAX_CHUNK_CELLS):
        self.sampler = sampler
        self.max_cells = max_cells

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sampler, name)

    answer = Sampler.answer  # the protocol's answer method, through this wrapper's generate_ids

    def _cells(self, rows: int, longest: int, sampling: SamplingConfig) -> int:
        """rows x prompt bucket x (prompt bucket + new-token bucket), as the sampler pads them."""
        s = self.sampler
        ctx = s.cfg.max_position_embeddings
        pb = min(bucket(longest, s.min_prompt_bucket), ctx - sampling.max_new_tokens)
        nb = min(bucket(sampling.max_new_tokens, s.min_new_bucket), ctx - pb)
        return bucket(rows, 1) * pb * (pb + nb)

    def generate_ids(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, *, seed: int = 0,
                     max_new_tokens: Sequence[int] | None = None,
                     stop_ids: Sequence[Sequence[int]] | None = None, row_seeds: Sequence[int] | None = None,
                     params: Any = None) -> GenerationResult:
        """``Sampler.generate_ids`` with the same arguments and result layout (see the class doc).

        Every row keeps its row seed (default: its index in this call), so the outputs are those of
        the unsorted call whatever the chunks.
        """
        n = len(prompts)
        if n == 0:
            return self.sampler.generate_ids(prompts, sampling, seed=seed, params=params)
        seeds = list(range(n)) if row_seeds is None else list(row_seeds)
        full = self.sampler.max_batch or n
        groups: list[list[int]] = []
        merge = False
        for chunk in plan_chunks([len(p) for p in prompts], full,
                                 lambda rows, longest: self._cells(rows, longest, sampling), self.max_cells):
            if merge and len(chunk) == full:
                groups[-1] += chunk
            else:
                groups.append(chunk)
            merge = len(chunk) == full
        parts: list[tuple[list[int], GenerationResult]] = []
        for idx in groups:
            kw: dict[str, Any] = {"row_seeds": [seeds[k] for k in idx], "params": params}
            if max_new_tokens is not None:
                kw["max_new_tokens"] = [max_new_tokens[k] for k in idx]
            if stop_ids is not None:
                kw["stop_ids"] = [stop_ids[k] for k in idx]
            parts.append((idx, self.sampler.generate_ids([prompts[k] for k in idx], sampling, seed=seed, **kw)))
        return _merge_results(parts, n)


def _merge_results(parts: Sequence[tuple[list[int], GenerationResult]], n: int) -> GenerationResult:
    """Reassembles per-chunk results into one, rows in the original order."""
    tokens: list[Any] = [None] * n
    logprobs: list[Any] = [None] * n
    finish: list[Any] = [None] * n
    texts: list[Any] | None = [None] * n
    lengths = np.zeros(n, np.int64)
    for idx, res in parts:
        for pos, k in enumerate(idx):
            tokens[k], logprobs[k], finish[k] = res.tokens[pos], res.logprobs[pos], res.finish_reasons[pos]
            lengths[k] = res.lengths[pos]
            if res.texts is None:
                texts = None
            elif texts is not None:
                texts[k] = res.texts[pos]
    stats = {"seconds": sum(r.stats.get("seconds", 0.0) for _, r in parts),
             "new_tokens": float(lengths.sum()), "chunks": float(len(parts))}
    return GenerationResult(tokens, logprobs, lengths, finish, texts, stats)
