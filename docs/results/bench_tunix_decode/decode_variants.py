"""Decode diagnostics: our sampler's decode loop, variants (scan unrolled), medians of 5."""
import functools, os, statistics, sys, time
import jax
variant = sys.argv[1]
if variant == "unroll":
    orig = jax.lax.scan
    jax.lax.scan = functools.partial(orig, unroll=True)
from jaxrl_mt.benchmarks.engine import random_prompts
from jaxrl_mt.models.registry import load_model
from jaxrl_mt.sampling import Sampler, SamplingConfig
model = load_model("builtin:smollm2-135m-instruct", with_tokenizer=False)
prompts = random_prompts(model.cfg.vocab_size, 8, 64, exclude=(0, 1, 2))
s = Sampler.from_model(model)
def gen(n):
    t = time.perf_counter(); r = s.generate_ids(prompts, SamplingConfig(max_new_tokens=n, temperature=0.0), seed=0, stop_ids=[[] for _ in prompts]); return time.perf_counter() - t
gen(128); gen(1)
full = statistics.median(gen(128) for _ in range(5)); one = statistics.median(gen(1) for _ in range(5))
print(f"{variant}: call {full:.3f} s, prefill {one:.3f} s, decode loop {(full-one)/127*1000:.1f} ms/step = {8*127/(full-one):.1f} tok/s")
