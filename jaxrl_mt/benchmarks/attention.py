"""``python -m jaxrl_mt.benchmarks attention``: scoring, prefill and the train step at long lengths,
per attention implementation.

    python -m jaxrl_mt.benchmarks attention [--model SPEC | --shape qwen2.5-1.5b] [--length 8192]
        [--batch 1] [--dtype bfloat16] [--programs score,prefill,train] [--impls einsum,blockwise,cudnn]
        [--remat] [--repeats 3] [--parity] [--json OUT]

Each implementation runs in its own process (its peak memory is its own). Programs, each jitted
once (compile timed) then called `--repeats` times (median reported):

* `score`: the scorer's forward (`scoring.token_logprobs`) over B rows of T tokens;
* `prefill`: the sampler's prefill, `forward(..., cache, fresh=True)` into an empty cache of
  T + 64 slots (`sampling.kernels.generate_tokens`' first call); `extend`: the same tokens through
  the general cached path (`fresh=False`: T queries over the cache's slots and themselves), what
  prefill was before `fresh`;
* `train`: the value and gradient of the mean token log-prob (the GRPO step's differentiated
  term) with `--remat` as the trainer's `rl.remat`.

Reported per (implementation, program): compile s, median s, tokens/s, model TFLOP/s and MFU (the
formulas and device peaks of `benchmarks.roofline`; forward FLOPs for score/prefill, 6N + 12LHKT
for train), the compiled program's temp bytes (`memory_analysis()`), and the process's peak memory
(device `peak_bytes_in_use` on an accelerator, peak RSS on the CPU). A program that runs out of
memory is a row saying so. `--shape` builds random weights of a published config (no download);
`--parity` first compares every kernel against the einsum on random GQA inputs (outputs and
gradients, relative to an fp32 einsum) on this backend. `--peak` times a bf16 matrix product to
print the measured ceiling beside the data sheet's.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

PROGRAMS = ("score", "prefill", "extend", "train")
PREFILL_NEW = 64  # decode slots after the prompt in the prefill's cache


def _shapes() -> dict:
    """`--shape` names -> configs: the accelerator benchmark's shapes and memory_table's Qwen2.5 ones."""
    from jaxrl_mt.benchmarks.accel import SHAPES
    from jaxrl_mt.memory_table import QWEN25

    return {**SHAPES, **{k.lower(): v for k, v in QWEN25.items()}}


def _config(a: argparse.Namespace):
    """(config, params) of `--shape` (random weights) or `--model`."""
    import jax

    if a.shape:
        from jaxrl_mt.models.decoder import init_params

        cfg = _shapes()[a.shape].replace(param_dtype=a.dtype, dtype=a.dtype, attention=a.child, attention_block=a.block)
        return cfg, init_params(cfg, jax.random.PRNGKey(0))
    from jaxrl_mt.models.registry import load_model

    m = load_model(a.model, with_tokenizer=False, attention=a.child, param_dtype=a.dtype, dtype=a.dtype)
    return m.cfg.replace(attention=a.child, attention_block=a.block), m.params


def _program(cfg, program: str, remat: bool, length: int, batch: int):
    """The function of `program` (params, tokens, mask) -> output."""
    import jax
    import jax.numpy as jnp

    from jaxrl_mt.models.decoder import forward, init_cache, positions_from_mask
    from jaxrl_mt.scoring import token_logprobs

    def score(p, t, k):
        return token_logprobs(p, cfg, t, k)[0]

    def loss(p, t, k):
        lp = token_logprobs(p, cfg, t, k, remat=remat)[0]
        return -jnp.sum(lp) / jnp.maximum(jnp.sum(k), 1)

    def prefill(p, t, k, fresh=True):
        cache = jax.lax.optimization_barrier(init_cache(cfg, batch, length + PREFILL_NEW))
        logits, _, cache = forward(p, cfg, t, positions_from_mask(k), k, cache, logits="last", fresh=fresh)
        return logits, cache

    return {"score": score, "train": jax.value_and_grad(loss), "prefill": prefill,
            "extend": lambda p, t, k: prefill(p, t, k, fresh=False)}[program]


def _peak_memory() -> tuple[int, str]:
    """(peak bytes, what was measured): device peak_bytes_in_use where reported, else peak RSS."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"]), "device"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "rss"  # Linux: KiB


def _one(cfg, params, a: argparse.Namespace, program: str, peak) -> dict:
    """Compiles and times one program; {"oom": message} when it does not fit."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxrl_mt.benchmarks import roofline as rf
    from jaxrl_mt.benchmarks.accel import is_oom

    tokens = jnp.asarray(np.random.default_rng(0).integers(3, cfg.vocab_size, size=(a.batch, a.length)), jnp.int32)
    mask = jnp.ones(tokens.shape, bool)
    try:
        t0 = time.perf_counter()
        fn = jax.jit(_program(cfg, program, a.remat, a.length, a.batch)).lower(params, tokens, mask).compile()
        compile_s = time.perf_counter() - t0
        ma = fn.memory_analysis()
        hlo = fn.as_text() or ""
        jax.block_until_ready(fn(params, tokens, mask))
        times = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(params, tokens, mask))
            times.append(time.perf_counter() - t0)
    except Exception as e:  # only out-of-memory becomes a row; the rest re-raises
        if not is_oom(e):
            raise
        return {"program": program, "oom": (str(e).strip().splitlines() or [type(e).__name__])[0][:200]}
    med = statistics.median(times)
    n = a.batch * a.length
    per_tok = (rf.train_flops_per_token if program == "train" else rf.forward_flops_per_token)(cfg, a.length)
    return {"program": program, "compile_s": compile_s, "times": times, "median_s": med, "tokens_per_s": n / med,
            "tflops": n * per_tok / med / 1e12, "mfu": rf.mfu(n, per_tok, med, peak),
            "temp_bytes": int(getattr(ma, "temp_size_in_bytes", 0) or 0), "cudnn_fmha_in_hlo": "cudnn$fmha" in hlo,
            "pallas_in_hlo": "tpu_custom_call" in hlo}


def _child(a: argparse.Namespace) -> dict:
    """Times every program of one implementation in this process (attention fallbacks logged)."""
    import logging

    import jax

    logger = logging.getLogger("jaxrl_mt")
    logger.setLevel(logging.INFO)
    logger.addHandler(logging.StreamHandler(sys.stderr))

    from jaxrl_mt.benchmarks import roofline as rf

    cfg, params = _config(a)
    dev = jax.devices()[0]
    peak = rf.lookup_peak(dev.device_kind)
    rows = [_one(cfg, params, a, p, peak) for p in a.programs.split(",")]
    mem, kind = _peak_memory()
    return {"impl": a.child, "rows": rows, "peak_bytes": mem, "peak_kind": kind, "backend": jax.default_backend(),
            "device_kind": dev.device_kind, "jax": jax.__version__}


def parity(seed: int = 0) -> list[dict]:
    """Every kernel implementation against the einsum on random GQA inputs on this backend.

    Inputs bf16 on accelerators (the kernels' dtype), fp32 on the CPU; the reference is the fp32
    einsum of the same (rounded) inputs. Cases: causal with left padding, right padding, none,
    and a row with a gap (`hole`). Returns one row per (impl, case): max abs error of the output,
    and the relative error
    ||g - g_ref|| / ||g_ref|| of the gradients of sum(out * w) wrt q, k, v.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxrl_mt.models.attention import attend, causal_spec

    backend = jax.default_backend()
    dt = jnp.float32 if backend == "cpu" else jnp.bfloat16
    impls = ["blockwise"] + {"gpu": ["cudnn"], "tpu": ["pallas"]}.get(backend, [])
    b, t, hq, hkv, kd = 2, 1024, 12, 2, 128
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = jax.random.normal(ks[0], (b, t, hq, kd)).astype(dt)
    k = jax.random.normal(ks[1], (b, hkv, t, kd)).astype(dt)
    v = jax.random.normal(ks[2], (b, hkv, t, kd)).astype(dt)
    w = jax.random.normal(ks[3], (b, t, hq, kd), jnp.float32)
    ar = np.arange(t)
    hole = np.ones((b, t), bool)
    hole[1, 500:520] = False  # not one run of real tokens: the cuDNN wrapper's blockwise branch
    cases = {"none": np.ones((b, t), bool), "left": ar[None] >= np.array([[0], [300]]),
             "right": ar[None] < np.array([[t], [700]]), "hole": hole}
    rows = []
    for case, m in cases.items():
        spec = causal_spec(jnp.asarray(m))
        real = jnp.asarray(m)[:, :, None, None]  # outputs of pad queries are not compared

        def run(impl, q, k, v, spec=spec, real=real):
            def f(q, k, v):
                out = attend(q, k, v, spec, impl=impl, self_attn=True).astype(jnp.float32)
                return jnp.sum(jnp.where(real, out * w, 0.0)), out
            (_, out), g = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))(q, k, v)
            return out, g

        with jax.default_matmul_precision("highest"):  # no TF32 in the reference on GPUs
            ref_out, ref_g = run("einsum", *(x.astype(jnp.float32) for x in (q, k, v)))
        for impl in impls:
            out, g = run(impl, q, k, v)
            err = float(jnp.max(jnp.where(real, jnp.abs(out - ref_out), 0.0)))
            rel = [float(jnp.linalg.norm(x.astype(jnp.float32) - y) / jnp.linalg.norm(y)) for x, y in zip(g, ref_g)]
            rows.append({"impl": impl, "case": case, "dtype": jnp.dtype(dt).name, "out_max_abs": err,
                         "grad_rel_q": rel[0], "grad_rel_k": rel[1], "grad_rel_v": rel[2]})
    return rows


def matmul_peak(n: int = 8192, repeats: int = 10) -> float:
    """Measured bf16 TFLOP/s of an n x n x n matrix product on the default device (random inputs)."""
    import jax
    import jax.numpy as jnp

    x, y = (jax.random.normal(jax.random.PRNGKey(i), (n, n), jnp.bfloat16) for i in (1, 2))
    f = jax.jit(lambda x, y: x @ y)
    for _ in range(3):
        jax.block_until_ready(f(x, y))
    t0 = time.perf_counter()
    for _ in range(repeats):
        out = f(x, y)
    jax.block_until_ready(out)
    return 2 * n ** 3 * repeats / (time.perf_counter() - t0) / 1e12


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m jaxrl_mt.benchmarks attention", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="builtin:smollm2-135m-instruct", help="model spec (load_model)")
    ap.add_argument("--shape", default="", help="random weights of a published config instead of --model "
                    "(benchmarks.accel.SHAPES and memory_table.QWEN25, lower-cased: qwen2.5-7b, ...)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="params and compute dtype")
    ap.add_argument("--length", type=int, default=4096, help="tokens per row")
    ap.add_argument("--batch", type=int, default=1, help="rows")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls (the median is reported)")
    ap.add_argument("--impls", default="einsum,blockwise", help="attention implementations, comma-separated")
    ap.add_argument("--block", type=int, default=512, help="keys per block of the blockwise implementation")
    ap.add_argument("--programs", "--program", default="score", help=f"comma-separated subset of {PROGRAMS}")
    ap.add_argument("--remat", action="store_true", help="train: rematerialise each layer")
    ap.add_argument("--parity", action="store_true", help="first check the kernels against the einsum")
    ap.add_argument("--peak", action="store_true", help="first time a bf16 matrix product (the measured ceiling)")
    ap.add_argument("--json", default="", help="also write the results here")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    return ap


def _check(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    from jaxrl_mt.models.attention import IMPLS

    bad = [p for p in a.programs.split(",") if p not in PROGRAMS]
    if bad:
        ap.error(f"--programs: unknown {bad}; choose from {', '.join(PROGRAMS)}")
    bad = [i for i in a.impls.split(",") if i not in IMPLS]
    if bad:
        ap.error(f"--impls: unknown {bad}; choose from {', '.join(IMPLS)}")
    shapes = sorted(_shapes())
    if a.shape and a.shape not in shapes:
        ap.error(f"--shape: unknown {a.shape!r}; choose from {', '.join(shapes)}")
    for name, v in (("--length", a.length), ("--batch", a.batch), ("--repeats", a.repeats), ("--block", a.block)):
        if v < 1:
            ap.error(f"{name} must be >= 1, got {v}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = _parser()
    a = ap.parse_args(argv)
    _check(ap, a)
    if a.child:
        print(json.dumps(_child(a)))
        return 0
    out: dict = {"args": vars(a)}
    if a.peak:
        out["matmul_tflops"] = matmul_peak()
        print(f"measured bf16 matmul 8192^3: {out['matmul_tflops']:.0f} TFLOP/s", flush=True)
    if a.parity:
        out["parity"] = parity()
        print(format_parity(out["parity"]), flush=True)
    out["impls"] = []
    for impl in [x.strip() for x in a.impls.split(",") if x.strip()]:
        cmd = [sys.executable, "-m", "jaxrl_mt.benchmarks", "attention", "--child", impl, "--model", a.model,
               "--shape", a.shape, "--dtype", a.dtype, "--length", str(a.length), "--batch", str(a.batch),
               "--repeats", str(a.repeats), "--block", str(a.block), "--programs", a.programs]
        r = subprocess.run(cmd + (["--remat"] if a.remat else []), capture_output=True, text=True)
        if r.returncode:
            tail = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else str(r.returncode)
            print(f"{impl}: failed ({tail})", file=sys.stderr)
            out["impls"].append({"impl": impl, "failed": tail})
            continue
        for line in r.stderr.splitlines():  # the attention module's log lines (fallbacks)
            if line.startswith("attention "):
                print(f"{impl}: {line}", file=sys.stderr)
        out["impls"].append(json.loads(r.stdout.strip().splitlines()[-1]))
        print(format_rows([out["impls"][-1]], a), flush=True)
    ok = [x for x in out["impls"] if "rows" in x]
    if ok:
        print(format_rows(ok, a))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return 0 if len(ok) == len(out["impls"]) else 1


def format_parity(rows: Sequence[dict]) -> str:
    """A markdown table of `parity`'s rows."""
    lines = ["| attention | case | dtype | out max abs | grad rel q | grad rel k | grad rel v |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['impl']} | {r['case']} | {r['dtype']} | {r['out_max_abs']:.2e} | {r['grad_rel_q']:.2e} | "
                     f"{r['grad_rel_k']:.2e} | {r['grad_rel_v']:.2e} |")
    return "\n".join(lines)


def format_rows(results: Sequence[dict], a: argparse.Namespace) -> str:
    """A markdown table: one row per (implementation, program); `vs first` = median / the first
    implementation's median for the same program."""
    r0 = results[0]
    what = a.shape or a.model
    lines = [f"{a.batch} x {a.length} tokens, {what}, {a.dtype}, remat {a.remat}, XLA:{r0['backend'].upper()} "
             f"({r0['device_kind']}, jax {r0['jax']}), median of {a.repeats}", "",
             "| attention | program | kernel | compile s | median s | tokens/s | TFLOP/s | MFU | temp GiB | peak GiB "
             "| vs first |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    base = {row["program"]: row["median_s"] for row in r0["rows"] if "median_s" in row}
    for r in results:
        for row in r["rows"]:
            if "oom" in row:
                lines.append(f"| {r['impl']} | {row['program']} | | out of memory: {row['oom'][:80]} | | | | | | | |")
                continue
            mfu = "n/a" if row["mfu"] is None else f"{row['mfu']:.3f}"
            vs = f"{row['median_s'] / base[row['program']]:.2f}" if row["program"] in base else "n/a"
            kernel = "cudnn" if row["cudnn_fmha_in_hlo"] else "pallas" if row["pallas_in_hlo"] else "-"
            lines.append(f"| {r['impl']} | {row['program']} | {kernel} | {row['compile_s']:.1f} | "
                         f"{row['median_s']:.3f} | "
                         f"{row['tokens_per_s']:.0f} | {row['tflops']:.1f} | {mfu} | {row['temp_bytes'] / 2**30:.2f} | "
                         f"{r['peak_bytes'] / 2**30:.2f} ({r['peak_kind']}) | {vs} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
