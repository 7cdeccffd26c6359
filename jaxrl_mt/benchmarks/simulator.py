"""Speed of the LiC simulator against plain batched generation of the same number of tokens.

    python -m jaxrl_mt.benchmarks.simulator [--model SPEC] [--n 64] [--turns 5] [--max_new_tokens 64]
                                      [--reuse-cache | --no-reuse-cache]

Simulates ``n`` SHARDED conversations of ``turns`` turns (synthetic problems with ``turns - 1``
conditions) with the ``final_turn`` protocol, so every conversation runs every turn, and the
rule-based judge and verifier on every reply. The baseline makes the same number of batched
``generate_ids`` calls (one per turn) on the same model with the same sampling settings, each
producing exactly the tokens the simulator produced at that turn (per-row budgets, no stop
token), from the first-turn prompts: plain generation without the growing history and without
the per-turn bookkeeping. Both are timed after warm-up calls that compile every program they use
(the simulator on half the conversations, then one short call per prompt bucket up to 512
tokens; plain: one short call); the ratio ``simulator / plain`` is printed.

``--reuse-cache`` (the default) runs the simulator with each conversation's KV cache kept across
turns (only new tokens are prefilled); its warm-up is a full simulator run on the same
conversations, since the cached programs' shapes (cache capacity per turn) depend on them.
``--no-reuse-cache`` re-prefills the whole history every turn.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from jaxrl_mt.chat import encode_prompt  # noqa: E402
from jaxrl_mt.data.synthetic import synthetic_tasks  # noqa: E402
from jaxrl_mt.eval.simulator import Judge, plan_runs, simulate  # noqa: E402
from jaxrl_mt.sampling import Sampler, SamplingConfig  # noqa: E402


def sharded_runs(n: int, turns: int, system: str | None):
    """``n`` SHARDED conversations of exactly ``turns`` user turns."""
    if turns < 2:
        raise ValueError(f"--turns must be >= 2, got {turns}")
    tasks = synthetic_tasks(n, steps=turns - 2)  # target + start + (turns - 2) operations
    runs, _ = plan_runs(tasks, ["sharded"], 1, system=system)
    assert all(len(r.user_turns) == turns for r in runs)
    return runs


def warm_up(sampler: Sampler, sampling: SamplingConfig, n_rows: int, max_bucket: int = 512) -> None:
    """Compiles the sampler programs for ``n_rows`` rows and every prompt bucket up to ``max_bucket``."""
    b = sampler.min_prompt_bucket
    while b <= max_bucket and b + sampling.max_new_tokens <= sampler.cfg.max_position_embeddings:
        prompts = [[sampler.pad_id + 1] * b] + [[sampler.pad_id + 1]] * (n_rows - 1)
        sampler.generate_ids(prompts, sampling, max_new_tokens=[1] * n_rows)
        b *= 2


def time_simulator(sampler: Sampler, n: int, turns: int, sampling: SamplingConfig, seed: int,
                   system: str | None, reuse_cache: bool = True) -> tuple[float, list[dict]]:
    runs = sharded_runs(n, turns, system)
    t0 = time.perf_counter()
    recs = simulate(sampler, runs, sampling, judge=Judge(), protocol="final_turn", verifier_mode="strict", seed=seed,
                    reuse_cache=reuse_cache)
    return time.perf_counter() - t0, recs


def prefill_tokens(recs: Sequence[dict], reuse_cache: bool) -> int:
    """Tokens prefilled over all turns: whole prompts, or (reuse) what was new since the last reply.

    With reuse, a turn's context is the previous context, the previous reply but its last token
    (never fed while decoding) and the new segment, so the segment is the difference.
    """
    total = 0
    for r in recs:
        cached = 0
        for t in r["turns"]:
            total += t["prompt_tokens"] - (cached if reuse_cache else 0)
            cached = t["prompt_tokens"] + max(t["new_tokens"] - 1, 0)
    return total


def time_plain(sampler: Sampler, recs: Sequence[dict], sampling: SamplingConfig, seed: int,
               system: str | None) -> tuple[float, int]:
    """Same number of calls and new tokens per row and call, from the first-turn prompts."""
    prompts = [encode_prompt(sampler.tokenizer, [{"role": "user", "content": r["turns"][0]["user"]}], system=system)
               for r in recs]
    n_turns = len(recs[0]["turns"])
    no_stop = [[] for _ in recs]
    total = 0
    t0 = time.perf_counter()
    for k in range(n_turns):
        budgets = [r["turns"][k]["new_tokens"] for r in recs]
        res = sampler.generate_ids(prompts, sampling, seed=seed + k, max_new_tokens=budgets, stop_ids=no_stop)
        total += int(res.lengths.sum())
    return time.perf_counter() - t0, total


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(prog="python -m jaxrl_mt.benchmarks.simulator", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:smollm2-135m-instruct", help="model spec")
    p.add_argument("--n", type=int, default=64, help="conversations")
    p.add_argument("--turns", type=int, default=5, help="user turns per conversation")
    p.add_argument("--max_new_tokens", type=int, default=64, help="reply budget per turn")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max_batch", type=int, default=32, help="rows per sampler chunk (both sides)")
    p.add_argument("--system", default="", help="system prompt ('' = template default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reuse-cache", dest="reuse_cache", action=argparse.BooleanOptionalAction, default=True,
                   help="keep each conversation's KV cache across turns (default: on)")
    args = p.parse_args(argv)
    from jaxrl_mt.models.registry import load_model

    model = load_model(args.model)
    sampler = Sampler.from_model(model, max_batch=args.max_batch)
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    system = args.system or None

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    rows = min(args.n, args.max_batch)
    reuse = args.reuse_cache
    t0 = time.perf_counter()
    if reuse:
        time_simulator(sampler, args.n, args.turns, sampling, args.seed, system, reuse)
        log(f"warm-up (compiles: the same simulation) {time.perf_counter() - t0:.1f}s")
    else:
        time_simulator(sampler, max(1, args.n // 2), args.turns, sampling, args.seed, system, reuse)
        warm_up(sampler, sampling, rows)
        log(f"warm-up (compiles, half the conversations, one call per prompt bucket) {time.perf_counter() - t0:.1f}s")
    cold = time.perf_counter() - t0
    compiled = set(sampler.compiled_shapes)
    t_sim, recs = time_simulator(sampler, args.n, args.turns, sampling, args.seed, system, reuse)
    log(f"simulator {t_sim:.1f}s")
    if sampler.compiled_shapes != compiled:
        log(f"warning: the timed simulator run compiled {sorted(sampler.compiled_shapes - compiled)}")
    sim_tokens = sum(t["new_tokens"] for r in recs for t in r["turns"])
    warm_up(sampler, sampling, rows, max_bucket=sampler.min_prompt_bucket * 2)
    compiled = set(sampler.compiled_shapes)
    t_plain, plain_tokens = time_plain(sampler, recs, sampling, args.seed, system)
    log(f"plain {t_plain:.1f}s")
    if sampler.compiled_shapes != compiled:
        log(f"warning: the timed plain run compiled {sorted(sampler.compiled_shapes - compiled)}")
    if plain_tokens != sim_tokens:
        raise RuntimeError(f"token mismatch: simulator {sim_tokens}, plain {plain_tokens}")
    prompt_tokens = sum(t["prompt_tokens"] for r in recs for t in r["turns"])
    prefilled = prefill_tokens(recs, reuse)
    out = {"simulator_s": t_sim, "plain_s": t_plain, "ratio": t_sim / t_plain, "new_tokens": sim_tokens,
           "simulator_prompt_tokens": prompt_tokens, "simulator_prefill_tokens": prefilled, "warm_up_s": cold,
           "reuse_cache": reuse}
    print(f"{args.n} SHARDED conversations x {args.turns} turns, {args.model}, max_new_tokens={args.max_new_tokens}, "
          f"temperature={args.temperature}, max_batch={args.max_batch}, "
          f"KV cache reuse {'on' if reuse else 'off'} ({'--reuse-cache' if reuse else '--no-reuse-cache'})")
    print(f"new tokens: {sim_tokens} (both); simulator context tokens (all turns): {prompt_tokens}; "
          f"prefilled: {prefilled}")
    print(f"simulator: {t_sim:.1f}s ({sim_tokens / t_sim:.0f} new tok/s)")
    print(f"plain {args.turns} batched generate_ids calls: {t_plain:.1f}s ({plain_tokens / t_plain:.0f} new tok/s)")
    print(f"ratio simulator / plain: {out['ratio']:.2f}")
    return out


if __name__ == "__main__":
    main()
