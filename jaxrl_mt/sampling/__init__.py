"""The JAX sampling loop, in pieces.

- ``methods``: ``SamplingConfig`` and the sampling methods (``Greedy``, ``Categorical`` with
  top-k / top-p filters) as small static objects; per-row values as a ``RowParams`` struct.
- ``kernels``: the jitted functions, ``generate_tokens`` (prefill + decode from an empty cache)
  and ``continue_tokens`` (append a segment to kept caches, then decode), one ``lax.while_loop``
  over a ``DecodeState`` struct; ``resize_cache`` repacks kept caches.
- ``engine``: ``DecodeEngine``, the frozen configuration, buckets, mesh and kernel-input assembly
  shared by ``Sampler`` and ``DecodeSession`` (parameters passed per call; per-row keys).
- ``host``: ``Sampler``, the host side (tokenise, run the slot engine, decode texts);
  ``results``: ``GenerationResult``. The slot engine: ``slots`` (device programs),
  ``scheduler`` (its host loop), ``multiprocess`` (the loop on a mesh over several processes).
- ``session``: ``DecodeSession``, rows whose KV caches persist across calls (multi-turn decoding
  without re-prefill).
- ``sorted``: ``LengthSortedSampler``, one call answered by length-sorted, memory-bounded chunks.

Shapes, chunk plans and per-chunk seeds come from ``jaxrl_mt.batching``.
"""

from jaxrl_mt.batching import bucket, cache_bucket, plan_chunks
from jaxrl_mt.sampling.engine import DecodeEngine
from jaxrl_mt.sampling.host import Sampler
from jaxrl_mt.sampling.results import GenerationResult, stop_array
from jaxrl_mt.sampling.kernels import (FINISH_LENGTH, FINISH_NAMES, FINISH_STOP, DecodeState, continue_tokens, decode,
                                       generate_tokens, resize_cache)
from jaxrl_mt.sampling.methods import Categorical, Greedy, RowParams, SamplingConfig, filter_logits
from jaxrl_mt.sampling.session import DecodeSession
from jaxrl_mt.sampling.sorted import DEFAULT_MAX_CHUNK_CELLS, LengthSortedSampler

__all__ = [
    "DEFAULT_MAX_CHUNK_CELLS", "FINISH_LENGTH", "FINISH_NAMES", "FINISH_STOP", "Categorical", "DecodeEngine",
    "DecodeSession",
    "DecodeState", "GenerationResult", "Greedy", "LengthSortedSampler", "RowParams", "Sampler", "SamplingConfig",
    "bucket", "cache_bucket", "continue_tokens", "decode", "filter_logits", "generate_tokens", "plan_chunks",
    "resize_cache", "stop_array",
]
