"""One decode step of the embedded model (8 steps in a fori_loop carrying the cache, fused weights, the decode
kernels' compiler options), at 3 shapes. Issue 51's A/B: run it alternately from two checkouts,
`PYTHONPATH=<checkout> python cache_attention_ab.py` (output of session 28: cache_attention_ab_session28.txt)."""
import sys, time, statistics, json
import jax, jax.numpy as jnp, numpy as np
from jaxrl_mt.models.registry import load_model
from jaxrl_mt.models.decoder import forward, init_cache, decode_params
from jaxrl_mt.sampling.kernels import _DECODE_OPTIONS
model = load_model("builtin:smollm2-135m-instruct", with_tokenizer=False)
cfg = model.cfg
params = decode_params(model.params, cfg)
out = {}
for b, s, idx in [(8, 192, 100), (64, 512, 200), (64, 512, 450)]:
    cache = init_cache(cfg, b, s)
    cache = cache._replace(valid=jnp.ones((b, s), bool), index=jnp.int32(idx))
    def step(p, c, tok, pos):
        def body(i, carry):
            c, acc = carry
            lg, _, c2 = forward(p, cfg, tok, pos, jnp.ones((b, 1), bool), c, logits="last")
            return (c2._replace(index=c.index), acc + lg[0, 0, 0])
        return jax.lax.fori_loop(0, 8, body, (c, 0.0))[1]
    f = jax.jit(step, compiler_options=_DECODE_OPTIONS)
    tok = jnp.zeros((b, 1), jnp.int32); pos = jnp.full((b, 1), idx, jnp.int32)
    t0 = time.perf_counter(); f(params, cache, tok, pos).block_until_ready(); comp = time.perf_counter() - t0
    ts = []
    for _ in range(3):
        t0 = time.perf_counter(); f(params, cache, tok, pos).block_until_ready(); ts.append((time.perf_counter() - t0) / 8)
    out[f"{b}x{s}@{idx}"] = {"first_s": round(comp, 2), "step_ms": round(1000 * statistics.median(ts), 1)}
print(json.dumps(out))
