"""Sampling over a committed length distribution: the decode engine's utilisation and speed on real shapes.

    python -m jaxrl_mt.benchmarks workload [--transcripts FILE] [--rows 64] [--max-batch 64] [--seed 0]

The fixed-length bench (`benchmarks sampling`) makes every row generate the same number of tokens,
which hides what costs the most in an evaluation: rows of different lengths sharing a call. This
one draws `--rows` (prompt length, reply length) pairs from a committed evaluation's transcripts
(default: the base model's greedy evaluation of `docs/results/exp2`, every turn of every
conversation), makes random-token prompts of those lengths and generates with each row's
budget set to its recorded reply length and no stop ids, so every row ends exactly where the
model's reply ended. Two engines serve the same rows with the same weights and buckets,
alternating: the chunked kernel (chunks of `--max-batch` rows, each run to its longest row) and
the slot engine (`Sampler.generate_ids`: `--max-batch` slots refilled as rows finish). It prints
wall seconds (median of `--repeats` rounds after a warm-up round), tokens/s and each engine's
counters (`sampling.counters`): the share of executed row-steps that fed a live row and of the
cache slots read that held live context.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TRANSCRIPTS = ROOT / "docs/results/exp2/report/models/base/greedy/transcripts.jsonl.gz"


def committed_lengths(path: Path) -> list[tuple[int, int]]:
    """(prompt tokens, new tokens) of every assistant turn of a transcripts file (.jsonl or .jsonl.gz).

    Raises:
      ValueError: (or its `DataError`) a missing file, a line that is not a JSON object, a turn without
        the counts, each naming file, line and field.
    """
    from jaxrl_mt.data.fields import read_jsonl

    out = []
    for where, _, rec in read_jsonl(path):
        for i, turn in enumerate(rec.get("turns") or []):
            for key in ("prompt_tokens", "new_tokens"):
                if not isinstance(turn.get(key), int) or turn[key] < 0:
                    raise ValueError(f"{where}: turns[{i}].{key} is not a count: {turn.get(key)!r}")
            if turn["new_tokens"] > 0:
                out.append((turn["prompt_tokens"], turn["new_tokens"]))
    if not out:
        raise ValueError(f"{path}: no assistant turn with token counts")
    return out


def draw(pairs: Sequence[tuple[int, int]], rows: int, seed: int) -> list[tuple[int, int]]:
    """`rows` pairs drawn with replacement (seeded)."""
    idx = np.random.default_rng(seed).integers(0, len(pairs), rows)
    return [pairs[i] for i in idx]


def bench_workload(model: Any, pairs: Sequence[tuple[int, int]], *, max_batch: int, repeats: int,
                   seed: int = 0, engines: Sequence[str] = ("chunks",), steps: int = 16) -> dict[str, Any]:
    """Times greedy generation of the drawn rows, each forced to its recorded reply length, by each engine:
    "chunks" (`Sampler.generate_chunked`: chunks of `max_batch` rows, each run to its longest row) and
    "slots" (`Sampler.generate_ids`, the slot engine: `max_batch` slots refilled every `steps` decode
    steps or sooner, narrowed at the tail)."""
    from jaxrl_mt.benchmarks.engine import random_prompts
    from jaxrl_mt.sampling import Sampler, SamplingConfig

    rng = np.random.default_rng(seed)
    longest = max(p for p, _ in pairs)
    pool = random_prompts(model.cfg.vocab_size, 1, longest, seed=seed, exclude=model.eos_ids, ragged=False)[0]
    prompts = [[pool[(j + int(rng.integers(longest))) % longest] for j in range(p)] for p, _ in pairs]
    budgets = [n for _, n in pairs]
    sampler = Sampler.from_model(model, max_batch=max_batch)
    sampler.engine = dataclasses.replace(sampler.engine, segment_steps=steps)
    sampling = SamplingConfig(max_new_tokens=max(budgets), temperature=0.0)
    calls = {"chunks": lambda: _chunks(sampler, prompts, budgets, sampling),
             "slots": lambda: _slots(sampler, prompts, budgets, sampling)}
    out: dict[str, Any] = {"rows": len(pairs), "max_batch": max_batch, "new_tokens": sum(budgets)}
    times: dict[str, list[float]] = {e: [] for e in engines}
    for rep in range(repeats + 1):  # the engines alternate; the first round compiles (reported apart)
        for e in engines:
            t0 = time.perf_counter()
            lengths, counters = calls[e]()
            dt = time.perf_counter() - t0
            if lengths != budgets:
                raise RuntimeError(f"{e}: a row did not generate its recorded length")
            if rep == 0:
                out[e] = {"first_s": dt, **counters}
            else:
                times[e].append(dt)
    for e in engines:
        steady = statistics.median(times[e])
        out[e].update(steady_s=steady, times_s=times[e], tokens_per_s=sum(budgets) / steady)
    if len(engines) == 2:
        out["speedup_slots"] = out["chunks"]["steady_s"] / out["slots"]["steady_s"]
    return out


def _chunks(sampler: Any, prompts: list[list[int]], budgets: list[int], sampling: Any) -> tuple[list[int], dict]:
    """The chunked kernel (`Sampler.generate_chunked`): (lengths, its counters)."""
    from jaxrl_mt.sampling.counters import utilisation

    params = sampler.params
    out, c = sampler.generate_chunked(params, prompts, np.asarray(budgets, np.int32), sampling, 0,
                                      np.arange(len(prompts), dtype=np.uint32), [[] for _ in prompts], 1,
                                      sampler.decode_weights(params))
    return out["lengths"].tolist(), utilisation(c)


def _slots(sampler: Any, prompts: list[list[int]], budgets: list[int], sampling: Any) -> tuple[list[int], dict]:
    """The slot engine (`Sampler.generate_ids`) on the same rows, weights and buckets: (lengths, counters)."""
    res = sampler.generate_ids(prompts, sampling, seed=0, max_new_tokens=budgets, stop_ids=[[] for _ in prompts])
    return res.lengths.tolist(), {k: v for k, v in res.stats.items() if k not in ("seconds", "new_tokens")}


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m jaxrl_mt.benchmarks workload", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:smollm2-135m-instruct", help="model spec")
    ap.add_argument("--transcripts", type=Path, default=DEFAULT_TRANSCRIPTS, help="transcripts.jsonl[.gz]")
    ap.add_argument("--rows", type=int, default=64, help="rows drawn (default 64)")
    ap.add_argument("--max-batch", type=int, default=64, help="the sampler's rows per call (default 64)")
    ap.add_argument("--repeats", type=int, default=2, help="timed calls after the first (default 2)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the draw and the prompts")
    ap.add_argument("--engine", choices=("chunks", "slots", "both"), default="both",
                    help="the chunked Sampler, the slot engine, or both alternating (default)")
    ap.add_argument("--steps", type=int, default=16, help="slots: decode steps per segment (default 16)")
    ap.add_argument("--json", metavar="OUT", default=None, help="also write the numbers to this file")
    args = ap.parse_args(argv)
    for name, v in (("--rows", args.rows), ("--max-batch", args.max_batch), ("--repeats", args.repeats),
                    ("--steps", args.steps)):
        if v <= 0:
            ap.error(f"{name} must be > 0, got {v}")
    from jaxrl_mt.models.config import ModelError
    from jaxrl_mt.models.registry import load_model

    try:
        pairs = draw(committed_lengths(args.transcripts), args.rows, args.seed)
        model = load_model(args.model, with_tokenizer=False)
    except (OSError, ValueError, ModelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    engines = ("chunks", "slots") if args.engine == "both" else (args.engine,)
    r = bench_workload(model, pairs, max_batch=args.max_batch, repeats=args.repeats, seed=args.seed,
                       engines=engines, steps=args.steps)
    r.update(model=args.model, transcripts=str(args.transcripts), seed=args.seed)
    print(f"workload: {r['rows']} rows from {args.transcripts.name} (seed {args.seed}), {r['new_tokens']} new tokens, "
          f"max_batch {r['max_batch']}")
    for e in engines:
        x = r[e]
        print(f"  {e:<6} steady {x['steady_s']:.2f} s (median of {args.repeats}; first {x['first_s']:.2f} s) -> "
              f"{x['tokens_per_s']:.1f} tok/s; row utilisation {x['row_utilisation']:.3f}"
              + (f", slot utilisation {x['slot_utilisation']:.3f}" if "slot_utilisation" in x else ""))
    if "speedup_slots" in r:
        print(f"  slots / chunks: {r['speedup_slots']:.2f}x (steady wall time, same rows, alternating)")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
