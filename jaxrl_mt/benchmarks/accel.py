"""Accelerator benchmark: decode, scoring and a GRPO train step at Qwen2.5 shapes, random weights.

    python -m jaxrl_mt.benchmarks accel [--shape qwen2.5-0.5b,qwen2.5-1.5b] [--batch 1,2,4,...,256]
        [--dtype bfloat16] [--prompt-len 128] [--new-tokens 128] [--repeats 3] [--remat]
        [--json OUT] [--markdown OUT]          # OUT may hold {device}: the device kind, as a file name

Nothing is downloaded: the weights are random (`models.decoder.init_params`) in the shape of the
published config.json of each model (`SHAPES`), on the first JAX device. For each batch size B:

* decode: our sampler (`Sampler.generate_ids`, greedy, no stop ids) from B prompts of P random
  tokens, N new tokens and 1 new token; the difference is the decode loop alone (engine bench's
  method). Reported: decode tokens/s, the bytes/s it reads and their fraction of the device's
  HBM bandwidth (`roofline.decode_bytes_per_step`: weights + the KV cache at that length).
* score: our scorer (`Scorer.score`) over B x (P + N) tokens; tokens/s, TFLOP/s, MFU (2N + attention).
* train: one step of `rl.step.make_train_step` (GRPO loss, forward + backward + AdamW) on B rows
  of P prompt + N completion tokens; tokens/s, TFLOP/s, MFU (6N + attention).

The formulas are in `jaxrl_mt.benchmarks.roofline`; the peaks per device kind in its `PEAKS`. A
device kind not in the table (the CPU included) prints "peak unknown for KIND" and n/a fractions,
and still the raw rates. A phase that does not fit in memory (XLA RESOURCE_EXHAUSTED) is skipped
with a note, and so are its larger batches. `tpu/bench_accel.sh` runs the whole set.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mt.benchmarks import roofline as rf
from jaxrl_mt.benchmarks.accel_report import format_markdown
from jaxrl_mt.benchmarks.engine import param_stats, random_prompts, time_calls
from jaxrl_mt.models.config import ModelConfig

# Hugging Face Qwen/Qwen2.5-0.5B-Instruct and Qwen/Qwen2.5-1.5B-Instruct, config.json: Qwen2ForCausalLM,
# hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
# vocab_size 151936, tie_word_embeddings true, rope_theta 1e6, rms_norm_eps 1e-6,
# max_position_embeddings 32768, bos 151643, eos 151645 (head_dim = hidden_size / heads).
_QWEN25 = dict(vocab_size=151936, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
               attention_bias=True, max_position_embeddings=32768, architecture="qwen2", bos_token_id=151643,
               eos_token_id=(151645,))
SHAPES: dict[str, ModelConfig] = {
    "qwen2.5-0.5b": ModelConfig(hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                                num_kv_heads=2, head_dim=64, **_QWEN25),
    "qwen2.5-1.5b": ModelConfig(hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12,
                                num_kv_heads=2, head_dim=128, **_QWEN25),
    # a toy in the same layout, for CPU smoke runs and tests
    "tiny": ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=16, attention_bias=True, tie_word_embeddings=True,
                        architecture="qwen2", max_position_embeddings=2048),
}
DEFAULT_SHAPES = ("qwen2.5-0.5b", "qwen2.5-1.5b")
DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PHASES = ("decode", "score", "train")
OOM_MARKERS = ("resource_exhausted", "out of memory")

Hook = Callable[[str, int], None]  # called as hook(phase, batch) before each measurement


def is_oom(exc: BaseException) -> bool:
    """True for an out-of-memory failure: MemoryError, or an XLA error saying RESOURCE_EXHAUSTED / out of memory."""
    if isinstance(exc, MemoryError):
        return True
    msg = str(exc).lower()
    return any(m in msg for m in OOM_MARKERS)


def device_slug(kind: str) -> str:
    """A device kind as a file-name part: "NVIDIA H100 80GB HBM3" -> "nvidia_h100_80gb_hbm3"."""
    return re.sub(r"[^a-z0-9]+", "_", kind.lower()).strip("_") or "device"


class ShapeBench:
    """One model shape with random weights on the default device, measured at several batch sizes."""

    def __init__(self, cfg: ModelConfig, *, dtype: str, prompt_len: int, new_tokens: int, repeats: int,
                 remat: bool, peak: rf.DevicePeak | None, seed: int = 0):
        from jaxrl_mt.models.decoder import init_params
        from jaxrl_mt.sampling import Sampler

        self.cfg = cfg.replace(param_dtype=dtype, dtype=dtype)
        self.params = init_params(self.cfg, jax.random.PRNGKey(seed))
        self.n_params, self.param_bytes = param_stats(self.params)
        self.itemsize = jnp.dtype(dtype).itemsize
        self.prompt_len, self.new_tokens, self.repeats, self.remat, self.peak = (prompt_len, new_tokens, repeats,
                                                                                remat, peak)
        self.sampler = Sampler(self.params, self.cfg, None, eos_ids=(), pad_id=0)

    def decode(self, batch: int) -> dict[str, Any]:
        """Decode-loop tokens/s of the sampler and its fraction of the HBM roofline."""
        from jaxrl_mt.sampling import SamplingConfig

        p, n = self.prompt_len, self.new_tokens
        prompts = random_prompts(self.cfg.vocab_size, batch, p, seed=batch, ragged=False)
        no_stop = [[] for _ in prompts]

        def gen(k: int) -> Any:
            return self.sampler.generate_ids(prompts, SamplingConfig(max_new_tokens=k, temperature=0.0), seed=0,
                                             stop_ids=no_stop)

        t_full, res = time_calls(lambda: gen(n), self.repeats)
        if not np.all(res.lengths == n):
            raise RuntimeError(f"expected {n} tokens per row, got {res.lengths.tolist()}")
        t_one, _ = time_calls(lambda: gen(1), self.repeats)
        decode_s = max(t_full.steady_s - t_one.steady_s, 1e-9)
        steps_per_s = (n - 1) / decode_s
        nbytes = rf.decode_bytes_per_step(self.cfg, batch=batch, prompt_len=p, new_tokens=n,
                                          param_bytes=self.param_bytes, itemsize=self.itemsize)
        return {"seconds": t_full.steady_s, "prefill_s": t_one.steady_s, "decode_s": decode_s,
                "compile_s": max(0.0, t_full.first_s - t_full.steady_s), "steps_per_s": steps_per_s,
                "tokens_per_s": batch * steps_per_s, "bytes_per_step": nbytes,
                "gb_per_s": nbytes * steps_per_s / 1e9, "roofline_fraction": rf.hbm_fraction(nbytes, steps_per_s,
                                                                                             self.peak)}

    def score(self, batch: int) -> dict[str, Any]:
        """Teacher-forced scoring of batch x (P + N) tokens: tokens/s, TFLOP/s, MFU."""
        from jaxrl_mt.scoring import Scorer

        t = self.prompt_len + self.new_tokens
        rows = random_prompts(self.cfg.vocab_size, batch, t, seed=batch, ragged=False)
        scorer = Scorer(self.params, self.cfg, pad_id=0, batch_size=batch)
        timing, _ = time_calls(lambda: scorer.score([r[:1] for r in rows], [r[1:] for r in rows]), self.repeats)
        return self._compute_rates(timing, batch * t, rf.forward_flops_per_token(self.cfg, t))

    def train(self, batch: int) -> dict[str, Any]:
        """One GRPO train step (forward + backward + AdamW) on batch x (P + N) tokens: tokens/s, TFLOP/s, MFU."""
        from jaxrl_mt.rl.example import TrainExample
        from jaxrl_mt.rl.optim import make_optimizer
        from jaxrl_mt.rl.step import LossConfig, make_train_step

        p, c = self.prompt_len, self.new_tokens
        optimizer = make_optimizer(1e-6)
        step = make_train_step(self.cfg, optimizer, LossConfig(max_completion_length=c, remat=self.remat), donate=True)
        rng = np.random.default_rng(batch)
        data = TrainExample(  # one prompt per row (group 1): the trainer's layout when no prompt is shared
            prompt_tokens=jnp.asarray(rng.integers(3, self.cfg.vocab_size, (batch, p)), jnp.int32),
            prompt_mask=jnp.ones((batch, p), bool),
            completion_tokens=jnp.asarray(rng.integers(3, self.cfg.vocab_size, (batch, c)), jnp.int32),
            completion_mask=jnp.ones((batch, c), bool), advantages=jnp.asarray(rng.standard_normal(batch), jnp.float32))
        params = jax.tree_util.tree_map(jnp.copy, self.params)  # donated to the step, which returns the next
        state = [params, optimizer.init(params)]
        del params

        def one() -> Any:
            new_params, new_opt, metrics = step(state[0], state[1], data)
            state[:] = [new_params, new_opt]
            return jax.block_until_ready((new_params, metrics))[1]

        timing, metrics = time_calls(one, self.repeats)
        out = self._compute_rates(timing, batch * (p + c), rf.train_flops_per_token(self.cfg, p + c))
        out["finite"] = bool(float(metrics["finite"]) == 1.0)  # False: noted in the report, the timing kept
        return out

    def _compute_rates(self, timing: Any, tokens: int, flops_per_token: int) -> dict[str, Any]:
        s = timing.steady_s
        return {"seconds": s, "compile_s": max(0.0, timing.first_s - s), "tokens_per_s": tokens / s,
                "tflops": tokens * flops_per_token / s / 1e12, "flops_per_token": flops_per_token,
                "mfu": rf.mfu(tokens, flops_per_token, s, self.peak)}


def run_shape(bench: ShapeBench, batches: Sequence[int], *, phases: Sequence[str] = PHASES,
              hook: Hook | None = None, log: Callable[[str], None] = lambda s: None) -> list[dict[str, Any]]:
    """One row per batch size: {"batch": B, phase: its numbers or {"skipped": why}} for each phase.

    A phase that runs out of memory at batch B is skipped there and at every larger batch (they
    would not fit either); any other error propagates.
    """
    too_big: dict[str, int] = {}
    rows = []
    for batch in sorted(batches):
        row: dict[str, Any] = {"batch": batch}
        for phase in phases:
            if phase in too_big:
                row[phase] = {"skipped": f"not run: batch {too_big[phase]} did not fit"}
                continue
            try:
                if hook is not None:
                    hook(phase, batch)
                row[phase] = getattr(bench, phase)(batch)
            except Exception as e:  # only out-of-memory is skipped; the rest re-raises
                if not is_oom(e):
                    raise
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                row[phase] = {"skipped": f"out of memory: {first[:200]}"}
                too_big[phase] = batch
            if phase in too_big:
                gc.collect()  # out of the except block: the failed call's frames (and arrays) are gone
            log(f"batch {batch} {phase}: " + ("skipped (" + row[phase]["skipped"] + ")" if "skipped" in row[phase]
                                              else f"{row[phase]['tokens_per_s']:.1f} tok/s"))
        rows.append(row)
    return rows


def run(shapes: Sequence[str], batches: Sequence[int], *, dtype: str = "bfloat16", prompt_len: int = 128,
        new_tokens: int = 128, repeats: int = 3, remat: bool = False, phases: Sequence[str] = PHASES,
        hook: Hook | None = None, log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Runs every shape at every batch size on the first JAX device; returns the numbers (see `format_markdown`)."""
    dev = jax.devices()[0]
    peak = rf.lookup_peak(dev.device_kind)
    out: dict[str, Any] = {
        "device_kind": dev.device_kind, "platform": dev.platform, "device_count": jax.device_count(),
        "jax_version": jax.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "peak": None if peak is None else {"name": peak.name, "bf16_tflops": peak.bf16_tflops,
                                           "hbm_gb_s": peak.hbm_gb_s},
        "dtype": dtype, "prompt_len": prompt_len, "new_tokens": new_tokens, "repeats": repeats, "remat": remat,
        "phases": list(phases), "shapes": []}
    for name in shapes:
        log(f"{name}: random weights ({dtype}) on {dev.device_kind}")
        bench = ShapeBench(SHAPES[name], dtype=dtype, prompt_len=prompt_len, new_tokens=new_tokens, repeats=repeats,
                           remat=remat, peak=peak)
        cfg = bench.cfg
        rows = run_shape(bench, batches, phases=phases, hook=hook, log=lambda s, n=name: log(f"{n} {s}"))
        out["shapes"].append({"name": name, "params": bench.n_params, "param_bytes": bench.param_bytes,
                              "matmul_params": rf.matmul_params(cfg), "config": json.loads(cfg.to_json()),
                              "rows": rows})
        del bench
        gc.collect()
    return out


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def _name_list(choices: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in names if x not in choices]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"unknown {bad or text!r}; choose from {', '.join(choices)}")
        return names
    return parse


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m jaxrl_mt.benchmarks accel", description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=_name_list(tuple(SHAPES)), default=list(DEFAULT_SHAPES),
                    help=f"comma-separated model shapes ({', '.join(SHAPES)}; default: the two Qwen2.5 ones)")
    ap.add_argument("--batch", type=_int_list, default=list(DEFAULT_BATCHES), help="batch sizes (default 1,2,...,256)")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="params and compute dtype")
    ap.add_argument("--prompt-len", type=int, default=128, help="prompt tokens per row (default 128)")
    ap.add_argument("--new-tokens", type=int, default=128, help="decoded / completion tokens per row (default 128)")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls after the first (default 3)")
    ap.add_argument("--remat", action="store_true", help="train step: rematerialise layers (less memory)")
    ap.add_argument("--phases", type=_name_list(PHASES), default=list(PHASES), help="subset of decode,score,train")
    ap.add_argument("--json", metavar="OUT", default=None, help="write the numbers to this file ({device} allowed)")
    ap.add_argument("--markdown", metavar="OUT", default=None, help="write the table to this file ({device} allowed)")
    args = ap.parse_args(argv)
    for name, v, low in (("--prompt-len", args.prompt_len, 1), ("--new-tokens", args.new_tokens, 2),
                         ("--repeats", args.repeats, 1)):
        if v < low:
            ap.error(f"{name} must be >= {low}, got {v}")
    r = run(args.shape, args.batch, dtype=args.dtype, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
            repeats=args.repeats, remat=args.remat, phases=args.phases,
            log=lambda s: print(s, file=sys.stderr, flush=True))
    text = format_markdown(r, command="python -m jaxrl_mt.benchmarks accel " + " ".join(
        sys.argv[1:] if argv is None else argv))
    print(text)
    slug = device_slug(r["device_kind"])
    for path, body in ((args.markdown, text + "\n"), (args.json, json.dumps(r, indent=2) + "\n")):
        if path:
            out = Path(path.replace("{device}", slug))
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(body, encoding="utf-8")
            print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
