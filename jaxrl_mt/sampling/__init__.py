"""The JAX sampling loop, in pieces.

- ``methods``: ``SamplingConfig`` and the sampling methods (``Greedy``, ``Categorical`` with
  top-k / top-p filters) as small static objects; per-row values as a ``RowParams`` struct.
- ``engine``: ``DecodeEngine``, the frozen configuration, buckets, mesh and kernel-input assembly
  driven by ``Sampler`` (parameters passed per call; per-row keys).
- ``host``: ``Sampler``, the host side (tokenise, run the slot engine, decode texts);
  ``results``: ``GenerationResult``. The slot engine: ``slots`` (device programs),
  ``scheduler`` (its host loop for one call), ``turns`` (conversations that keep a slot across
  turns: ``Sampler.run_turns``), ``multiprocess`` (those loops on a mesh over several processes).
- ``kernels``: ``generate_tokens`` (prefill + decode of a chunk from an empty cache, one
  ``lax.while_loop`` over a ``DecodeState`` struct): only the reference of ``benchmarks
  workload`` (``Sampler.generate_chunked``); the per-row constants and keys the slot programs share.
- ``sorted``: ``LengthSortedSampler``, one call answered by length-sorted, memory-bounded chunks.

Shapes, chunk plans and per-chunk seeds come from ``jaxrl_mt.batching``.
"""

from jaxrl_mt.batching import bucket, plan_chunks
from jaxrl_mt.sampling.engine import DecodeEngine
from jaxrl_mt.sampling.host import Sampler
from jaxrl_mt.sampling.results import GenerationResult, stop_array
from jaxrl_mt.sampling.kernels import FINISH_LENGTH, FINISH_NAMES, FINISH_STOP, DecodeState, decode, generate_tokens
from jaxrl_mt.sampling.methods import Categorical, Greedy, RowParams, SamplingConfig, filter_logits
from jaxrl_mt.sampling.sorted import DEFAULT_MAX_CHUNK_CELLS, LengthSortedSampler

__all__ = [
    "DEFAULT_MAX_CHUNK_CELLS", "FINISH_LENGTH", "FINISH_NAMES", "FINISH_STOP", "Categorical", "DecodeEngine",
    "DecodeState", "GenerationResult", "Greedy", "LengthSortedSampler", "RowParams", "Sampler", "SamplingConfig",
    "bucket", "decode", "filter_logits", "generate_tokens", "plan_chunks", "stop_array",
]
