"""``python -m jaxrl_mt.benchmarks attention``: the scorer at long lengths, per attention implementation.

Each implementation runs in its own process (so its peak RSS is its own): the embedded model's
scorer (`scoring.token_logprobs`, jitted) on `--batch` random rows of `--length` tokens, once
to compile, then `--repeats` timed calls; `--program train` times the value-and-gradient of the
mean token log-prob instead. Prints one markdown row per implementation (compile s, median s,
tokens/s, peak RSS) and each implementation's median time relative to the first.
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


def _child(a: argparse.Namespace) -> dict:
    """Times one implementation in this process."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxrl_mt.models.registry import load_model
    from jaxrl_mt.scoring import token_logprobs

    m = load_model(a.model, with_tokenizer=False, attention=a.child)
    cfg = m.cfg.replace(attention_block=a.block)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, size=(a.batch, a.length)), jnp.int32)
    mask = jnp.ones(tokens.shape, bool)

    def score(p, t, k):
        return token_logprobs(p, cfg, t, k)[0]

    def loss(p, t, k):
        return -jnp.mean(token_logprobs(p, cfg, t, k)[0])

    fn = jax.jit(score if a.program == "score" else jax.value_and_grad(loss))
    t0 = time.perf_counter()
    jax.block_until_ready(fn(m.params, tokens, mask))
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(m.params, tokens, mask))
        times.append(time.perf_counter() - t0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"impl": a.child, "compile_s": compile_s, "times": times, "peak_rss": rss,
            "backend": jax.default_backend()}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m jaxrl_mt.benchmarks attention", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="builtin:smollm2-135m-instruct", help="model spec (load_model)")
    ap.add_argument("--length", type=int, default=4096, help="tokens per row")
    ap.add_argument("--batch", type=int, default=1, help="rows")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls (the median is reported)")
    ap.add_argument("--impls", default="einsum,blockwise", help="attention implementations, comma-separated")
    ap.add_argument("--block", type=int, default=512, help="keys per block of the blockwise implementation")
    ap.add_argument("--program", default="score", choices=("score", "train"), help="forward or value-and-grad")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if a.child:
        print(json.dumps(_child(a)))
        return 0
    rows = []
    for impl in [x.strip() for x in a.impls.split(",") if x.strip()]:
        cmd = [sys.executable, "-m", "jaxrl_mt.benchmarks", "attention", "--child", impl, "--model", a.model,
               "--length", str(a.length), "--batch", str(a.batch), "--repeats", str(a.repeats),
               "--block", str(a.block), "--program", a.program]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            print(f"{impl}: failed ({r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode})",
                  file=sys.stderr)
            return 1
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
    print(format_rows(rows, a))
    return 0


def format_rows(rows: Sequence[dict], a: argparse.Namespace) -> str:
    """A markdown table: one row per implementation; `vs first` = median / the first row's median."""
    lines = [f"{a.program} of {a.batch} x {a.length} tokens, {a.model}, XLA:{rows[0]['backend'].upper()}, "
             f"median of {a.repeats}", "",
             "| attention | compile s | median s | tokens/s | peak RSS GiB | vs first |", "|---|---|---|---|---|---|"]
    base = statistics.median(rows[0]["times"])
    for r in rows:
        med = statistics.median(r["times"])
        lines.append(f"| {r['impl']} | {r['compile_s']:.1f} | {med:.3f} | {a.batch * a.length / med:.0f} | "
                     f"{r['peak_rss'] / 2**30:.2f} | {med / base:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
