"""Where a decode step's time goes (embedded model, batch 8, one token, cache of 128 slots), idle host.

Times (median of 20 after a warm-up call, `benchmarks.engine.time_calls`) of jitted pieces: the whole forward
step (stacked and unstacked weights), the layer matmuls alone (x @ W for every layer's 4 matrices), the head
alone, and numpy's BLAS doing the same matmuls. Prints ms and the GB/s each reaches on the weights it reads.
Run from the repository root on an idle host: python docs/results/bench_decode/decode_parts.py
(decode_parts_session10.txt: its output, then the unstacked-weights A/B of `Sampler(unstack_layers=True)`)."""
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mt.benchmarks.engine import measure_bandwidth, time_calls
from jaxrl_mt.models.decoder import decode_params, forward, init_cache
from jaxrl_mt.models.registry import load_model

B, S = 8, 128
model = load_model("builtin:smollm2-135m-instruct", with_tokenizer=False)
cfg = model.cfg
dp = jax.jit(decode_params, static_argnames=("cfg", "unstack"))(model.params, cfg)
du = jax.jit(decode_params, static_argnames=("cfg", "unstack"))(model.params, cfg, unstack=True)
cache = init_cache(cfg, B, S)
cache = cache._replace(valid=jnp.ones((B, S), bool), index=jnp.int32(100))
tok = jnp.arange(B, dtype=jnp.int32)[:, None] + 100
pos = jnp.full((B, 1), 100, jnp.int32)
live = jnp.ones((B, 1), bool)

def timeit(f, *a, n=20):
    """Median ms of n calls after one warm-up (compile) call, with the project's bench timer."""
    return time_calls(lambda: jax.block_until_ready(f(*a)), n)[0].steady_s * 1e3

step = jax.jit(lambda p, c: forward(p, cfg, tok, pos, live, c, logits="last")[0])
mats = {k: v for k, v in dp["layers"].items() if v.ndim == 3}
wbytes = sum(v.size * 4 for v in mats.values())
hbytes = dp["lm_head"].size * 4
x = jnp.ones((B, cfg.hidden_size), jnp.float32) * 0.01

@jax.jit
def matmuls(m):
    out = 0.0
    for li in range(cfg.num_layers):
        for w in m.values():
            xin = x if w.shape[1] == cfg.hidden_size else jnp.ones((B, w.shape[1]), jnp.float32) * 0.01
            out = out + jnp.sum(xin @ w[li])
    return out

@jax.jit
def matmuls_scan(m):
    def body(c, ws):
        s = 0.0
        for w in ws.values():
            xin = x if w.shape[0] == cfg.hidden_size else jnp.ones((B, w.shape[0]), jnp.float32) * 0.01
            s = s + jnp.sum(xin @ w)
        return c + s, None
    return jax.lax.scan(body, 0.0, m)[0]

head = jax.jit(lambda h: x @ h)
bw = measure_bandwidth(512) / 1e9
print(f"bandwidth {bw:.1f} GB/s; layer matrices {wbytes/1e6:.0f} MB, head {hbytes/1e6:.0f} MB")
for name, f, a, nb in [("forward step, stacked", step, (dp, cache), wbytes + hbytes),
                       ("forward step, unstacked", step, (du, cache), wbytes + hbytes),
                       ("layer matmuls, unrolled static slices", matmuls, (mats,), wbytes),
                       ("layer matmuls, scan", matmuls_scan, (mats,), wbytes),
                       ("head matmul", head, (dp["lm_head"],), hbytes)]:
    ms = timeit(f, *a)
    print(f"{name:40s} {ms:7.2f} ms  {nb/ms/1e6:6.1f} GB/s")
mn = {k: np.asarray(v) for k, v in mats.items()}
xn = np.asarray(x)
def np_mm():
    for li in range(cfg.num_layers):
        for w in mn.values():
            xin = xn if w.shape[1] == cfg.hidden_size else np.full((B, w.shape[1]), 0.01, np.float32)
            xin @ w[li]
ms = time_calls(np_mm, 10)[0].steady_s * 1e3
print(f"{'layer matmuls, numpy BLAS':40s} {ms:7.2f} ms  {wbytes/ms/1e6:6.1f} GB/s")

# the attention's share: the same step with caches of 16, 128 and 512 slots (index at 3/4)
for s_len in (16, 128, 512):
    c = init_cache(cfg, B, s_len)
    c = c._replace(valid=jnp.ones((B, s_len), bool), index=jnp.int32(s_len * 3 // 4))
    p_ = jnp.full((B, 1), s_len * 3 // 4, jnp.int32)
    st = jax.jit(lambda p, c, p_=p_: forward(p, cfg, tok, p_, live, c, logits="last")[0])
    print(f"forward step, stacked, cache {s_len:4d} slots   {timeit(st, dp, c):7.2f} ms")
