"""One decode step of the embedded model at batch 1-32 (cache of 128 slots), idle host: how the step's time
and its weight-read rate grow with the batch. Median of 20 calls after a warm-up (`benchmarks.engine.time_calls`);
GB/s = the step's weight bytes (layers + head, not the embedding table) / time; roof = that / the host's
measured read bandwidth. Run from the repository root: python docs/results/bench_decode/decode_batch.py
(decode_batch_session11.txt: its output)."""
import jax
import jax.numpy as jnp

from jaxrl_mt.benchmarks.engine import measure_bandwidth, time_calls
from jaxrl_mt.models.decoder import decode_params, forward, init_cache
from jaxrl_mt.models.registry import load_model

S = 128
model = load_model("builtin:smollm2-135m-instruct", with_tokenizer=False)
cfg = model.cfg
dp = jax.jit(decode_params, static_argnames=("cfg", "unstack"))(model.params, cfg)
# what a step reads: every layer's weights and the head (the embedding table only at B of its rows)
wbytes = sum(v.size * v.dtype.itemsize for v in jax.tree_util.tree_leaves((dp["layers"], dp["lm_head"])))
bw = measure_bandwidth(512)
print(f"bandwidth {bw / 1e9:.1f} GB/s; decode weights {wbytes / 1e6:.0f} MB")
for b in (1, 4, 8, 16, 32):
    cache = init_cache(cfg, b, S)
    cache = cache._replace(valid=jnp.ones((b, S), bool), index=jnp.int32(100))
    tok = jnp.arange(b, dtype=jnp.int32)[:, None] + 100
    pos = jnp.full((b, 1), 100, jnp.int32)
    live = jnp.ones((b, 1), bool)
    step = jax.jit(lambda p, c, tok=tok, pos=pos, live=live: forward(p, cfg, tok, pos, live, c, logits="last")[0])
    t = time_calls(lambda step=step, cache=cache: jax.block_until_ready(step(dp, cache)), 20)[0].steady_s
    print(f"batch {b:3d}: {t * 1e3:7.1f} ms/step  {b / t:7.1f} tok/s  {wbytes / t / 1e9:5.1f} GB/s  "
          f"roof {wbytes / t / bw:.2f}")
