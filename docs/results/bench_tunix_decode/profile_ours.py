"""A jax.profiler (perfetto) trace of one greedy call of our sampler: batch 8, 64 new tokens.

    python profile_ours.py TRACE_DIR
"""

import sys

import jax

from jaxrl_mt.benchmarks.engine import random_prompts
from jaxrl_mt.models.registry import load_model
from jaxrl_mt.sampling import Sampler, SamplingConfig


def main() -> None:
    model = load_model("builtin:smollm2-135m-instruct", with_tokenizer=False)
    prompts = random_prompts(model.cfg.vocab_size, 8, 64, exclude=(0, 1, 2))
    sampler = Sampler.from_model(model)

    def gen(n: int) -> None:
        sampler.generate_ids(prompts, SamplingConfig(max_new_tokens=n, temperature=0.0), seed=0,
                             stop_ids=[[] for _ in prompts])

    gen(64)  # compile
    with jax.profiler.trace(sys.argv[1], create_perfetto_trace=True):
        gen(64)


main()
