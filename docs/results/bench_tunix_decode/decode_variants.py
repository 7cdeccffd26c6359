"""Our sampler's decode loop at batch 8, 128 new tokens, medians of 5 calls (session 17's variants).

    python decode_variants.py scan|unroll

``unroll`` runs the layer scans with ``unroll=True``; the per-layer-weights and einsum variants were
edits of ``models/decoder.py`` timed with ``scan`` (reverted; docs/performance.md "Against tunix").
"""

import functools
import statistics
import sys
import time

import jax

VARIANT = sys.argv[1]
if VARIANT == "unroll":
    jax.lax.scan = functools.partial(jax.lax.scan, unroll=True)

from jaxrl_mt.benchmarks.engine import random_prompts  # noqa: E402  (after the patch above)
from jaxrl_mt.models.registry import load_model  # noqa: E402
from jaxrl_mt.sampling import Sampler, SamplingConfig  # noqa: E402


def main() -> None:
    model = load_model("builtin:smollm2-135m-instruct", with_tokenizer=False)
    prompts = random_prompts(model.cfg.vocab_size, 8, 64, exclude=(0, 1, 2))
    sampler = Sampler.from_model(model)

    def gen(n: int) -> float:
        t = time.perf_counter()
        sampler.generate_ids(prompts, SamplingConfig(max_new_tokens=n, temperature=0.0), seed=0,
                             stop_ids=[[] for _ in prompts])
        return time.perf_counter() - t

    gen(128), gen(1)
    full = statistics.median(gen(128) for _ in range(5))
    one = statistics.median(gen(1) for _ in range(5))
    print(f"{VARIANT}: call {full:.3f} s, prefill {one:.3f} s, decode loop {(full - one) / 127 * 1000:.1f} ms/step"
          f" = {8 * 127 / (full - one):.1f} tok/s")


main()
