import sys, importlib.util, random
spec = importlib.util.spec_from_file_location("tside", "/work/main/jaxrl_mt/benchmarks/tunix_side.py")
ts = importlib.util.module_from_spec(spec); spec.loader.exec_module(ts)
import jax, numpy as np
from tunix.generate import sampler as sampler_lib
import glob
hf = sys.argv[2]
model, cfg = ts.load(hf)
rng = random.Random(0)
prompts = [[rng.randrange(3, 49152) for _ in range(64)] for _ in range(8)]
width, n = 64, 64
cache = sampler_lib.CacheConfig(cache_size=width + n, num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim)
s = sampler_lib.Sampler(model, ts.IdsTokenizer(2), cache)
texts = [" ".join(map(str, p)) for p in prompts]
gen = lambda: s(texts, max_generation_steps=n, max_prompt_length=width, temperature=0.0, eos_tokens=[-1], echo=False)
gen()
with jax.profiler.trace(sys.argv[1], create_perfetto_trace=True):
    gen()
