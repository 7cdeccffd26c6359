"""Throughput of the sampler and the scorer, against transformers on the same weights and inputs.

    python -m jaxrl_mt.benchmarks.engine sampling [--batch 8] [--new-tokens 128] [--prompt-len 64]
    python -m jaxrl_mt.benchmarks.engine scoring  [--batch 8] [--prompt-len 256]

`sampling` times greedy generation with every row forced to produce exactly N tokens (no stop
ids on our side, `min_new_tokens = max_new_tokens = N` on transformers' side) from left-padded
random-token prompts of different lengths, and a 1-token call of each side: the difference is
the decode loop alone (prefill is compute-bound, decode is bound by reading the weights).
`scoring` times teacher-forced log-probabilities of B x L tokens (our chunked scorer vs a
forward pass + log_softmax + gather). The first call is reported apart (it includes
compilation); steady state is the median of the repeats.

Decode is bound by reading the weights once per step, so the bench measures the memory read
bandwidth itself (a numpy sum over a large array, best of a few) and reports achieved decode
steps/s as a fraction of bandwidth / parameter bytes (the weight-read roofline). `sampling` also
measures the host's matrix-product rate (a jitted fp32 N x N x N product, best of a few) and
reports the decode loop against both roofs, min(bandwidth / bytes, FLOP/s / FLOPs per step): on a
host with narrow vector units (AVX2) the FLOP roof of a batch-8 step can lie below the read roof,
and only the two-roof fraction compares hosts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import jax
import numpy as np

DEFAULTS = {"sampling": {"batch": 8, "new_tokens": 128, "prompt_len": 64},
            "scoring": {"batch": 8, "new_tokens": 0, "prompt_len": 256}}


@dataclasses.dataclass(frozen=True)
class Timing:
    """Wall times of repeated calls of one function."""

    first_s: float  # the first call (compilation / warm-up included)
    steady_s: float  # median of the repeats after the first call
    best_s: float  # fastest repeat
    repeats: int  # number of timed repeats


def time_calls(fn: Callable[[], Any], repeats: int) -> tuple[Timing, Any]:
    """Calls `fn` (which must block until its result is ready) 1 + repeats times."""
    t0 = time.perf_counter()
    out = fn()
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return Timing(first, statistics.median(times), min(times), repeats), out


def measure_bandwidth(mb: int = 512, repeats: int = 5, threads: int | None = None) -> float:
    """Memory read bandwidth in bytes/s: best time of a threaded numpy sum over an `mb` MB array."""
    threads = threads or os.cpu_count() or 1
    a = np.ones(mb * 2**20 // 8, np.float64)  # written once, so every page is resident
    parts = np.array_split(a, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as ex:
        for _ in range(repeats):
            t0 = time.perf_counter()
            list(ex.map(np.sum, parts))
            best = min(best, time.perf_counter() - t0)
    return a.nbytes / best


def measure_matmul_flops(n: int = 1024, repeats: int = 5) -> float:
    """Matrix-product rate in FLOP/s of the JAX backend: best time of a jitted fp32 [n, n] x [n, n]."""
    import jax.numpy as jnp

    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()  # compile
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def two_roofs(cfg: Any, *, batch: int, prompt_len: int, new_tokens: int, memory_roof: float,
              flops: float) -> dict[str, Any]:
    """The decode step's roofs in steps/s: `memory_roof` (weight reads: bandwidth / parameter bytes, the
    run's ``roofline``) and arithmetic (FLOP/s / the step's model FLOPs, ``roofline.forward_flops_per_token``
    x rows at the mean context); the limit is the lower."""
    from jaxrl_mt.benchmarks.roofline import forward_flops_per_token, mean_decode_context

    per_step = batch * forward_flops_per_token(cfg, round(mean_decode_context(prompt_len, new_tokens)))
    memory, compute = memory_roof, flops / per_step
    return {"matmul_gflop_s": flops / 1e9, "decode_flops_per_step": per_step, "compute_roof_steps_per_s": compute,
            "two_roof_steps_per_s": min(memory, compute), "bound": "memory" if memory <= compute else "compute"}


def param_stats(params: Any) -> tuple[int, int]:
    """(number of parameters, bytes of parameters) of a pytree."""
    leaves = jax.tree_util.tree_leaves(params)
    return sum(int(x.size) for x in leaves), sum(int(x.size) * x.dtype.itemsize for x in leaves)


def random_prompts(vocab: int, batch: int, prompt_len: int, *, seed: int = 0, exclude: Sequence[int] = (),
                   ragged: bool = True) -> list[list[int]]:
    """Random-token prompts; with `ragged`, lengths spread from prompt_len // 2 to prompt_len."""
    rng = np.random.default_rng(seed)
    allowed = np.setdiff1d(np.arange(min(vocab, 3), vocab), np.asarray(exclude, np.int64))
    lens = ([max(1, prompt_len - (i * prompt_len) // (2 * batch)) for i in range(batch)] if ragged
            else [prompt_len] * batch)
    return [rng.choice(allowed, n).tolist() for n in lens]


def _left_pad_torch(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[Any, Any]:
    import torch

    from jaxrl_mt.chat import left_pad

    tokens, mask = left_pad(prompts, pad_id)
    return torch.tensor(tokens, dtype=torch.long), torch.tensor(mask, dtype=torch.long)


def _load_reference(model: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(os.cpu_count() or 1)
    return AutoModelForCausalLM.from_pretrained(str(model.path), dtype=torch.float32).eval()


def bench_sampling(model: Any, *, batch: int, new_tokens: int, prompt_len: int, repeats: int,
                   reference: bool) -> dict[str, Any]:
    """Greedy generation of exactly `new_tokens` per row: ours and (optionally) transformers'."""
    from jaxrl_mt.sampling import Sampler, SamplingConfig

    prompts = random_prompts(model.cfg.vocab_size, batch, prompt_len, exclude=model.eos_ids)
    sampler = Sampler.from_model(model)
    no_stop = [[] for _ in prompts]  # every row generates exactly n tokens

    def ours(n: int):
        return sampler.generate_ids(prompts, SamplingConfig(max_new_tokens=n, temperature=0.0), seed=0,
                                    stop_ids=no_stop)

    t_ours, res = time_calls(lambda: ours(new_tokens), repeats)
    if not np.all(res.lengths == new_tokens):
        raise RuntimeError(f"expected {new_tokens} tokens per row, got {res.lengths.tolist()}")
    t_pre, _ = time_calls(lambda: ours(1), repeats)
    out: dict[str, Any] = {"prompt_lens": [len(p) for p in prompts],
                           "ours": _rates(t_ours, batch * new_tokens, new_tokens, t_pre, batch)}
    if reference:
        import torch

        hf = _load_reference(model)
        ids, mask = _left_pad_torch(prompts, model.pad_id)

        def theirs(n: int):
            with torch.inference_mode():
                return hf.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                   max_new_tokens=n, min_new_tokens=n,
                                   pad_token_id=model.pad_id, eos_token_id=list(model.eos_ids),
                                   temperature=None, top_p=None, top_k=None)

        t_ref, seqs = time_calls(lambda: theirs(new_tokens), repeats)
        gen = seqs[:, ids.shape[1]:].numpy()
        if gen.shape[1] != new_tokens:
            raise RuntimeError(f"transformers generated {gen.shape[1]} tokens, expected {new_tokens}")
        t_ref_pre, _ = time_calls(lambda: theirs(1), repeats)
        out["transformers"] = _rates(t_ref, batch * new_tokens, new_tokens, t_ref_pre, batch)
        out["torch_threads"] = torch.get_num_threads()
        out["agree_rows"] = sum(_agree_until_eos(r, g, model.eos_ids) for r, g in zip(res.tokens, gen))
    return out


def _agree_until_eos(ours: Sequence[int], theirs: Sequence[int], eos: Sequence[int]) -> bool:
    """Rows agree up to and including our first EOS (transformers suppresses EOS under min_new_tokens)."""
    n = next((i for i, t in enumerate(ours) if t in eos), len(ours))
    return list(ours[:n]) == list(theirs[:n])


def bench_scoring(model: Any, *, batch: int, length: int, repeats: int, reference: bool) -> dict[str, Any]:
    """Teacher-forced log-probs of batch x length tokens: ours and (optionally) transformers'."""
    from jaxrl_mt.scoring import Scorer

    rows = random_prompts(model.cfg.vocab_size, batch, length, exclude=model.eos_ids, ragged=False)
    scorer = Scorer(model.params, model.cfg, pad_id=model.pad_id, batch_size=batch)

    def ours():
        return scorer.score([r[:1] for r in rows], [r[1:] for r in rows])

    t_ours, res = time_calls(ours, repeats)
    out: dict[str, Any] = {"ours": _rates(t_ours, batch * length, 1)}
    if reference:
        import torch

        hf = _load_reference(model)
        ids = torch.tensor(rows, dtype=torch.long)

        def theirs():
            with torch.inference_mode():
                logits = hf(input_ids=ids).logits[:, :-1].float()
                return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]

        t_ref, lp = time_calls(theirs, repeats)
        out["transformers"] = _rates(t_ref, batch * length, 1)
        out["torch_threads"] = torch.get_num_threads()
        out["max_abs_logprob_diff"] = float(np.max(np.abs(np.stack(res.logprobs) - lp.numpy())))
    return out


def _rates(t: Timing, tokens: int, steps: int, prefill: Timing | None = None, batch: int = 0) -> dict[str, float]:
    """Throughputs of a timing; with `prefill` (a 1-new-token call), also those of the decode loop alone."""
    r = {"first_s": t.first_s, "steady_s": t.steady_s, "best_s": t.best_s, "repeats": t.repeats,
         "compile_s": max(0.0, t.first_s - t.steady_s), "tokens_per_s": tokens / t.steady_s,
         "steps_per_s": steps / t.steady_s}
    if prefill is not None:  # the first token comes with the prefill; the other steps - 1 are decode steps
        decode_s = max(t.steady_s - prefill.steady_s, 1e-9)
        r.update(prefill_s=prefill.steady_s, decode_s=decode_s,
                 decode_tokens_per_s=batch * (steps - 1) / decode_s, decode_steps_per_s=(steps - 1) / decode_s)
    return r


def run(mode: str, model_spec: str, *, batch: int, new_tokens: int, prompt_len: int, repeats: int,
        reference: bool, bandwidth_mb: int = 512) -> dict[str, Any]:
    """Runs one benchmark and returns its numbers (see `format_report`)."""
    from jaxrl_mt.models.registry import load_model

    model = load_model(model_spec, with_tokenizer=False)  # prompts are random ids: no tokenizer needed
    n_params, n_bytes = param_stats(model.params)
    bw = measure_bandwidth(bandwidth_mb)
    if reference:
        try:
            import torch  # noqa: F401
        except ImportError:
            reference = False
    if mode == "sampling":
        r = bench_sampling(model, batch=batch, new_tokens=new_tokens, prompt_len=prompt_len,
                           repeats=repeats, reference=reference)
    else:
        r = bench_scoring(model, batch=batch, length=prompt_len, repeats=repeats, reference=reference)
    roofline = bw / n_bytes  # weight-read-bound forward passes (decode steps) per second
    for side in ("ours", "transformers"):
        if side in r:
            r[side]["roofline_fraction"] = r[side]["steps_per_s"] / roofline
            r[side]["gflops"] = 2 * n_params * r[side]["tokens_per_s"] / 1e9
    if "transformers" in r:
        r["ratio_tokens_per_s"] = r["ours"]["tokens_per_s"] / r["transformers"]["tokens_per_s"]
        if "decode_tokens_per_s" in r["ours"]:
            r["ratio_decode_tokens_per_s"] = (r["ours"]["decode_tokens_per_s"]
                                              / r["transformers"]["decode_tokens_per_s"])
    if mode == "sampling":
        r.update(two_roofs(model.cfg, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens,
                           memory_roof=roofline, flops=measure_matmul_flops()))
    for side in ("ours", "transformers"):
        if "decode_steps_per_s" in r.get(side, {}):
            r[side]["decode_roofline_fraction"] = r[side]["decode_steps_per_s"] / roofline
            r[side]["decode_two_roof_fraction"] = r[side]["decode_steps_per_s"] / r["two_roof_steps_per_s"]
    return {"mode": mode, "model": model_spec, "batch": batch, "new_tokens": new_tokens,
            "prompt_len": prompt_len, "repeats": repeats, "cpus": os.cpu_count(),
            "load_average": list(os.getloadavg()), "backend": jax.default_backend(),
            "params": n_params, "param_bytes": n_bytes, "bandwidth_gb_s": bw / 1e9,
            "bandwidth_mb": bandwidth_mb, "roofline_steps_per_s": roofline, **r}


def format_report(r: dict[str, Any]) -> str:
    """Human-readable lines of a `run` result."""
    sampling = r["mode"] == "sampling"
    shape = (f"batch {r['batch']} x {r['new_tokens']} new tokens, prompts of "
             f"{min(r['prompt_lens'])}..{max(r['prompt_lens'])} tokens (left-padded), greedy"
             if sampling else f"batch {r['batch']} x {r['prompt_len']} tokens, teacher-forced log-probs")
    lines = [f"bench {r['mode']}: {r['model']} ({r['params'] / 1e6:.1f}M params, {r['param_bytes'] / 1e6:.0f} MB), "
             f"{shape}, {r['repeats']} repeats",
             f"host: {r['cpus']} CPUs, jax backend {r['backend']}, load average "
             + " ".join(f"{x:.2f}" for x in r["load_average"])
             + (f"; torch threads = {r['torch_threads']} (= CPU count)" if "torch_threads" in r else ""),
             f"memory read bandwidth {r['bandwidth_gb_s']:.1f} GB/s (numpy sum over {r['bandwidth_mb']} MB, "
             f"best of 5) -> weight-read roofline {r['roofline_steps_per_s']:.1f} forward steps/s"]
    if "two_roof_steps_per_s" in r:
        lines.append(f"matrix products {r['matmul_gflop_s']:.1f} GFLOP/s (jitted fp32 1024^3, best of 5) -> compute "
                     f"roof {r['compute_roof_steps_per_s']:.1f} decode steps/s "
                     f"({r['decode_flops_per_step'] / 1e9:.2f} GFLOP per step); the decode step is "
                     f"{r['bound']}-bound on this host: two-roof limit {r['two_roof_steps_per_s']:.1f} steps/s")
    unit = "decode steps/s" if sampling else "forward passes/s"
    for side, name in (("ours", "ours (JAX)"), ("transformers", "transformers")):
        if side not in r:
            continue
        s = r[side]
        lines.append(f"{name:<13} first call {s['first_s']:.2f} s (compile/warm-up ~{s['compile_s']:.2f} s), "
                     f"steady {s['steady_s']:.3f} s (median; best {s['best_s']:.3f} s) -> "
                     f"{s['tokens_per_s']:.1f} tok/s, {s['steps_per_s']:.2f} {unit} = "
                     f"{s['roofline_fraction']:.2f} of roofline, ~{s['gflops']:.1f} GFLOP/s")
        if "decode_s" in s:
            lines.append(f"{'':<13} of which prefill + first token {s['prefill_s']:.3f} s (a 1-token call); "
                         f"decode loop alone {s['decode_tokens_per_s']:.1f} tok/s, "
                         f"{s['decode_steps_per_s']:.2f} steps/s = {s['decode_roofline_fraction']:.2f} of roofline, "
                         f"{s['decode_two_roof_fraction']:.2f} of the two-roof limit")
    if "ratio_tokens_per_s" in r:
        lines.append(f"ratio ours / transformers: {r['ratio_tokens_per_s']:.2f}x tokens/s"
                     + (f" ({r['ratio_decode_tokens_per_s']:.2f}x in the decode loop alone)"
                        if "ratio_decode_tokens_per_s" in r else ""))
    if "agree_rows" in r:
        lines.append(f"greedy agreement: {r['agree_rows']}/{r['batch']} rows identical up to our first EOS")
    if "max_abs_logprob_diff" in r:
        lines.append(f"max |logprob ours - transformers|: {r['max_abs_logprob_diff']:.2e}")
    if not sampling:
        lines.append("(scoring is compute-bound: the roofline fraction is low by nature)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m jaxrl_mt.benchmarks.engine", description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("sampling", "scoring"))
    ap.add_argument("--model", default="builtin:smollm2-135m-instruct", help="model spec")
    ap.add_argument("--batch", type=int, default=None, help="rows (default 8)")
    ap.add_argument("--new-tokens", type=int, default=None, help="sampling: new tokens per row (default 128)")
    ap.add_argument("--prompt-len", type=int, default=None,
                    help="sampling: longest prompt (default 64); scoring: tokens per row (default 256)")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls after the first (default 3)")
    ap.add_argument("--no-reference", action="store_true", help="skip transformers")
    ap.add_argument("--bandwidth-mb", type=int, default=512, help="array size of the bandwidth probe")
    ap.add_argument("--json", metavar="OUT", default=None, help="also write the numbers to this file")
    args = ap.parse_args(argv)
    d = DEFAULTS[args.mode]
    batch = d["batch"] if args.batch is None else args.batch
    new_tokens = d["new_tokens"] if args.new_tokens is None else args.new_tokens
    prompt_len = d["prompt_len"] if args.prompt_len is None else args.prompt_len
    for name, v in (("--batch", batch), ("--prompt-len", prompt_len), ("--repeats", args.repeats),
                    ("--bandwidth-mb", args.bandwidth_mb)) + ((("--new-tokens", new_tokens),)
                                                              if args.mode == "sampling" else ()):
        if v <= 0:
            ap.error(f"{name} must be > 0, got {v}")
    from jaxrl_mt.models.config import ModelError

    try:
        r = run(args.mode, args.model, batch=batch, new_tokens=new_tokens, prompt_len=prompt_len,
                repeats=args.repeats, reference=not args.no_reference, bandwidth_mb=args.bandwidth_mb)
    except ModelError as e:
        print(f"error: --model: {e}", file=sys.stderr)
        return 2
    print(format_report(r))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(r, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
