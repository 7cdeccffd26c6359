"""Greedy decode, ours against tunix (the JAX peer), same model, prompts and host, one process at a time.

    python -m jaxrl_mt.benchmarks tunix [--steps 3] [--batch 8] [--new-tokens 128] [--prompt-len 64]
                                        [--venv .venv-tunix] [--grpo [--lora-rank R]] [--json OUT]

tunix (`google-tunix` 0.1.7) lives in its own venv, made by ``jaxrl_mt/benchmarks/tunix_env.sh``
(its pins are not ours). Each of ``--steps`` rounds runs our side (this module, ``--side ours``, in
this interpreter) and then tunix's side (``tunix_side.py`` in that venv) as fresh subprocesses, one
at a time; each side loads the model from the same HF folder, computes the logits at the prompts'
last positions, and times a greedy decode of exactly N new tokens and a 1-token call (first calls
apart: they compile). Reported: the medians over rounds of tokens/s and of the decode loop alone
(N-token minus 1-token call), their ratio, both against the weight-read roofline and the two-roof
limit of `benchmarks sampling` (`engine.two_roofs`), the greedy agreement (first divergence per row)
and the max logit difference. ``--grpo`` adds GRPO steps of both sides (`tunix_grpo`); with
``--lora-rank R`` both train LoRA adapters of rank R (alpha 2R, all seven projections, the base as
the reference) instead of every weight.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[2]
ENV_SCRIPT = "jaxrl_mt/benchmarks/tunix_env.sh"
SIDE_SCRIPT = Path(__file__).with_name("tunix_side.py")


class TunixMissing(RuntimeError):
    """tunix's venv has no python: the benchmark cannot run its side."""


def tunix_python(venv: str | os.PathLike) -> Path:
    """The venv's interpreter; raises `TunixMissing` (naming the script that makes it) when absent."""
    p = Path(venv)
    py = (p if p.is_absolute() else ROOT / p) / "bin" / "python"
    if not py.exists():
        raise TunixMissing(f"tunix venv not found ({py} missing): create it with {ENV_SCRIPT} [VENV_DIR]")
    return py


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The CLI's arguments (all counts checked > 0)."""
    ap = argparse.ArgumentParser(prog="python -m jaxrl_mt.benchmarks tunix", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:smollm2-135m-instruct", help="model spec (an HF Llama folder)")
    ap.add_argument("--steps", type=int, default=3, help="alternating rounds ours/tunix; medians over them")
    ap.add_argument("--repeats", type=int, default=1, help="timed calls per process after the first (default 1)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=64, help="longest prompt = padded prompt width")
    ap.add_argument("--venv", default=".venv-tunix", help="tunix's venv (relative: to the repo root)")
    ap.add_argument("--json", metavar="OUT", default=None, help="also write the numbers to this file")
    ap.add_argument("--grpo", action="store_true", help="also one GRPO step per side (4 x G 4, beta 1e-4, AdamW)")
    ap.add_argument("--grpo-steps", type=int, default=3, help="GRPO steps per process; steady = steps 2.. (3)")
    ap.add_argument("--lora-rank", type=int, default=0,
                    help="with --grpo: both sides train LoRA adapters of this rank (alpha 2R) on q, k, v, o, gate, "
                         "up, down, the base weights as the reference (tunix: qwix); 0, the default: full fine-tuning")
    ap.add_argument("--side", choices=("ours",), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--job", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    for name in ("steps", "repeats", "batch", "new_tokens", "prompt_len", "grpo_steps"):
        if getattr(a, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(a, name)}")
    if a.lora_rank < 0:
        ap.error(f"--lora-rank must be >= 0, got {a.lora_rank}")
    if a.lora_rank and not a.grpo:
        ap.error("--lora-rank applies to the GRPO step: add --grpo")
    return a


def run_ours(job: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """Our side of one round (in a subprocess): logits [B, V] and timed greedy decodes with our `Sampler`."""
    import jax.numpy as jnp
    import numpy as np

    from jaxrl_mt.benchmarks.engine import param_stats, time_calls
    from jaxrl_mt.chat import left_pad
    from jaxrl_mt.models.decoder import forward
    from jaxrl_mt.models.registry import load_model
    from jaxrl_mt.sampling import Sampler, SamplingConfig

    t0 = time.perf_counter()
    model = load_model(job["model"], with_tokenizer=False)
    load_s = time.perf_counter() - t0
    prompts, n = job["prompts"], job["new_tokens"]
    tokens, mask = (np.asarray(x) for x in left_pad(prompts, job["pad_id"]))
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    logits, _, _ = forward(model.params, model.cfg, jnp.asarray(tokens), jnp.asarray(positions),
                           jnp.asarray(mask, bool), logits="last")
    sampler = Sampler.from_model(model)
    no_stop = [[] for _ in prompts]

    def generate(steps: int) -> Any:
        return sampler.generate_ids(prompts, SamplingConfig(max_new_tokens=steps, temperature=0.0), seed=0,
                                    stop_ids=no_stop)

    full, res = time_calls(lambda: generate(n), job["repeats"])
    one, _ = time_calls(lambda: generate(1), job["repeats"])
    n_params, n_bytes = param_stats(model.params)
    out = {"side": "ours", "load_s": load_s, "params": n_params, "param_bytes": n_bytes,
           "tokens": [list(map(int, r[:k])) for r, k in zip(res.tokens, res.lengths)],
           "full": {"first_s": full.first_s, "steady_s": full.steady_s, "best_s": full.best_s},
           "one": {"first_s": one.first_s, "steady_s": one.steady_s, "best_s": one.best_s}}
    return out, np.asarray(logits[:, -1, :], np.float32)


def run_side(cmd: list[str], job: dict[str, Any], tmp: Path, tag: str, *, logits: bool = True
             ) -> tuple[dict[str, Any], Any]:
    """Runs one side's subprocess on `job`; returns its result and its logits [B, V] (None: `logits` False)."""
    import numpy as np

    job_f, out_f = tmp / f"{tag}.job.json", tmp / f"{tag}.out.json"
    job_f.write_text(json.dumps(job))
    env = {**os.environ, "PYTHONPATH": str(ROOT)} if cmd[1:3] == ["-m", "jaxrl_mt.benchmarks.tunix"] else None
    proc = subprocess.run([*cmd, "--job", str(job_f), "--out", str(out_f)], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{tag} side failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(out_f.read_text()), np.load(str(out_f) + ".logits.npy") if logits else None


def first_divergence(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> list[int | None]:
    """Per row, the first position where the two token lists differ (None: identical)."""
    out: list[int | None] = []
    for x, y in zip(a, b):
        i = next((k for k, (s, t) in enumerate(zip(x, y)) if s != t), None)
        out.append(i if i is not None or len(x) == len(y) else min(len(x), len(y)))
    return out


def side_rates(runs: list[dict[str, Any]], batch: int, n: int) -> dict[str, Any]:
    """Medians over rounds: call time, tokens/s, and the decode loop alone (N-token minus 1-token call)."""
    full = statistics.median(r["full"]["steady_s"] for r in runs)
    one = statistics.median(r["one"]["steady_s"] for r in runs)
    decode_s = max(full - one, 1e-9)
    return {"steady_s": full, "prefill_s": one, "decode_s": decode_s, "tokens_per_s": batch * n / full,
            "decode_tokens_per_s": batch * (n - 1) / decode_s, "decode_steps_per_s": (n - 1) / decode_s,
            "first_s": [r["full"]["first_s"] for r in runs], "rounds_steady_s": [r["full"]["steady_s"] for r in runs]}


def make_job(spec: str, *, batch: int, new_tokens: int, prompt_len: int, repeats: int) -> tuple[dict[str, Any], Any]:
    """The job both sides run (HF folder, random-token prompts as `benchmarks sampling` draws them) and
    our config; prompts exclude the pad and EOS ids (tunix masks every prompt token equal to the pad id)."""
    from jaxrl_mt.benchmarks.engine import random_prompts
    from jaxrl_mt.models.hf_io import read_config
    from jaxrl_mt.models.registry import resolve

    hf_dir = resolve(spec)
    cfg = read_config(hf_dir)
    pad = int(cfg.pad_token_id if cfg.pad_token_id is not None else (cfg.eos_token_id or (0,))[0])
    prompts = random_prompts(cfg.vocab_size, batch, prompt_len, exclude=(*cfg.eos_token_id, pad))
    return {"model": spec, "hf_dir": str(hf_dir), "prompts": prompts, "new_tokens": new_tokens,
            "prompt_len": prompt_len, "repeats": repeats, "pad_id": pad}, cfg


def run(a: argparse.Namespace) -> dict[str, Any]:
    """Alternating rounds of both sides, then medians, roofs, ratios and agreement (see the module doc)."""
    import numpy as np

    from jaxrl_mt.benchmarks.engine import measure_bandwidth, measure_matmul_flops, two_roofs

    py = tunix_python(a.venv)
    job, cfg = make_job(a.model, batch=a.batch, new_tokens=a.new_tokens, prompt_len=a.prompt_len,
                        repeats=a.repeats)
    sides = {"ours": [sys.executable, "-m", "jaxrl_mt.benchmarks.tunix", "--side", "ours"],
             "tunix": [str(py), str(SIDE_SCRIPT)]}
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "tunix": []}
    logits: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        for i in range(a.steps):
            for side, cmd in sides.items():
                r, lg = run_side(cmd, job, Path(d), f"{side}{i}")
                runs[side].append(r)
                logits.setdefault(side, lg)
    n, b = a.new_tokens, a.batch
    out: dict[str, Any] = {"model": a.model, "batch": b, "new_tokens": n, "prompt_len": a.prompt_len,
                           "steps": a.steps, "repeats": a.repeats, "cpus": os.cpu_count(),
                           "load_average": list(os.getloadavg()),
                           "prompt_lens": [len(p) for p in job["prompts"]]}
    for side in runs:
        out[side] = side_rates(runs[side], b, n)
        out[side]["lengths"] = [len(t) for t in runs[side][0]["tokens"]]
    bw, n_bytes = measure_bandwidth(), runs["ours"][0]["param_bytes"]
    roof = bw / n_bytes
    out.update(bandwidth_gb_s=bw / 1e9, param_bytes=n_bytes, roofline_steps_per_s=roof,
               **two_roofs(cfg, batch=b, prompt_len=a.prompt_len, new_tokens=n, memory_roof=roof,
                           flops=measure_matmul_flops()))
    for side in runs:
        s = out[side]
        s["decode_roofline_fraction"] = s["decode_steps_per_s"] / roof
        s["decode_two_roof_fraction"] = s["decode_steps_per_s"] / out["two_roof_steps_per_s"]
    out["ratio_tokens_per_s"] = out["ours"]["tokens_per_s"] / out["tunix"]["tokens_per_s"]
    out["ratio_decode_tokens_per_s"] = out["ours"]["decode_tokens_per_s"] / out["tunix"]["decode_tokens_per_s"]
    div = first_divergence(runs["ours"][0]["tokens"], runs["tunix"][0]["tokens"])
    out["first_divergence"] = div
    out["agree_rows"] = sum(x is None for x in div)
    out["max_abs_logit_diff"] = float(np.max(np.abs(logits["ours"] - logits["tunix"])))
    if a.grpo:
        from jaxrl_mt.benchmarks.tunix_grpo import run_grpo

        out["grpo"] = run_grpo(py, run_side, model=a.model, rounds=a.steps, steps=max(a.grpo_steps, 2), new_tokens=n,
                               lora_rank=a.lora_rank)
    return out


def format_report(r: dict[str, Any]) -> str:
    """The human-readable summary of `run`'s numbers."""
    lines = [f"tunix vs ours: greedy decode, batch {r['batch']}, {r['new_tokens']} new tokens, prompts <= "
             f"{r['prompt_len']} tokens, medians of {r['steps']} alternating rounds ({r['cpus']} CPUs, "
             f"load {r['load_average'][0]:.2f})",
             f"host: read bandwidth {r['bandwidth_gb_s']:.1f} GB/s -> weight-read roofline "
             f"{r['roofline_steps_per_s']:.1f} steps/s; matmul {r['matmul_gflop_s']:.0f} GFLOP/s -> compute roof "
             f"{r['compute_roof_steps_per_s']:.1f} steps/s; two-roof limit {r['two_roof_steps_per_s']:.1f} steps/s "
             f"({r['bound']}-bound)"]
    for side in ("ours", "tunix"):
        s = r[side]
        lines.append(f"{side:<6} {s['steady_s']:.3f} s per call -> {s['tokens_per_s']:.1f} tok/s; decode loop "
                     f"{s['decode_tokens_per_s']:.1f} tok/s = {s['decode_roofline_fraction']:.2f} of roofline, "
                     f"{s['decode_two_roof_fraction']:.2f} of the two-roof limit (first calls "
                     f"{', '.join(f'{x:.1f}' for x in s['first_s'])} s)")
    lines.append(f"ratio ours / tunix: {r['ratio_tokens_per_s']:.2f}x tokens/s, "
                 f"{r['ratio_decode_tokens_per_s']:.2f}x in the decode loop alone")
    div = [f"row {i}: {k}" for i, k in enumerate(r["first_divergence"]) if k is not None]
    lines.append(f"greedy agreement: {r['agree_rows']}/{r['batch']} rows identical"
                 + (f" (first divergence {', '.join(div)})" if div else ""))
    lines.append(f"max |logit ours - tunix| at the prompts' last positions: {r['max_abs_logit_diff']:.2e}")
    if "grpo" in r:
        from jaxrl_mt.benchmarks.tunix_grpo import format_grpo

        lines.append(format_grpo(r["grpo"]))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI (or, with the hidden ``--side ours``, our side of one round); returns the exit status."""
    a = parse_args(argv)
    if a.side == "ours":
        import numpy as np

        r, lg = run_ours(json.loads(Path(a.job).read_text()))
        np.save(a.out + ".logits.npy", lg)
        Path(a.out).write_text(json.dumps(r))
        return 0
    try:
        r = run(a)
    except TunixMissing as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_report(r))
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
