"""One decode step of the embedded model at 3 shapes (8 steps in a fori_loop carrying the cache, fused
weights, the decode kernels' compiler options), median of 3 calls.

Issue 51's A/B: run it alternately from two checkouts, ``PYTHONPATH=<checkout> python cache_attention_ab.py``
(output of session 28: cache_attention_ab_session28.txt).
"""

import json
import statistics
import time

import jax
import jax.numpy as jnp

from jaxrl_mt.models.decoder import decode_params, forward, init_cache
from jaxrl_mt.models.registry import load_model
from jaxrl_mt.sampling.kernels import _DECODE_OPTIONS

SHAPES = [(8, 192, 100), (64, 512, 200), (64, 512, 450)]  # rows, cache slots, write index


def time_step(params, cfg, b: int, s: int, idx: int) -> dict:
    """First call (compilation) and steady milliseconds per decode step."""
    cache = init_cache(cfg, b, s)
    cache = cache._replace(valid=jnp.ones((b, s), bool), index=jnp.int32(idx))
    live = jnp.ones((b, 1), bool)

    def steps(p, c, tok, pos):
        def body(i, carry):
            c, acc = carry
            lg, _, c2 = forward(p, cfg, tok, pos, live, c, logits="last")
            return c2._replace(index=c.index), acc + lg[0, 0, 0]  # the same slot each step

        return jax.lax.fori_loop(0, 8, body, (c, 0.0))[1]

    f = jax.jit(steps, compiler_options=_DECODE_OPTIONS)
    tok, pos = jnp.zeros((b, 1), jnp.int32), jnp.full((b, 1), idx, jnp.int32)
    t0 = time.perf_counter()
    f(params, cache, tok, pos).block_until_ready()
    first = time.perf_counter() - t0
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        f(params, cache, tok, pos).block_until_ready()
        times.append((time.perf_counter() - t0) / 8)
    return {"first_s": round(first, 2), "step_ms": round(1000 * statistics.median(times), 1)}


def main() -> None:
    model = load_model("builtin:smollm2-135m-instruct", with_tokenizer=False)
    params = decode_params(model.params, model.cfg)
    print(json.dumps({f"{b}x{s}@{i}": time_step(params, model.cfg, b, s, i) for b, s, i in SHAPES}))


if __name__ == "__main__":
    main()
