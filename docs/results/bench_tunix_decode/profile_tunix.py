"""A jax.profiler (perfetto) trace of one greedy call of tunix's sampler: batch 8, 64 new tokens.

    .venv-tunix/bin/python profile_tunix.py TRACE_DIR HF_DIR   (from the repository root)

The model is loaded as `jaxrl_mt/benchmarks/tunix_side.py` loads it (RoPE theta patched).
"""

import importlib.util
import random
import sys

import jax
from tunix.generate import sampler as sampler_lib


def main() -> None:
    spec = importlib.util.spec_from_file_location("tside", "jaxrl_mt/benchmarks/tunix_side.py")
    side = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(side)
    model, cfg = side.load(sys.argv[2])
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 49152) for _ in range(64)] for _ in range(8)]
    width, n = 64, 64
    cache = sampler_lib.CacheConfig(cache_size=width + n, num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads,
                                    head_dim=cfg.head_dim)
    sampler = sampler_lib.Sampler(model, side.IdsTokenizer(2), cache)
    texts = [" ".join(map(str, p)) for p in prompts]

    def gen() -> None:
        sampler(texts, max_generation_steps=n, max_prompt_length=width, temperature=0.0, eos_tokens=[-1], echo=False)

    gen()  # compile
    with jax.profiler.trace(sys.argv[1], create_perfetto_trace=True):
        gen()


main()
