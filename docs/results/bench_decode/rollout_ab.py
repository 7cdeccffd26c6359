"""A GRPO rollout at the experiment's shapes, chunked kernel against slot engine, same run, alternating.

    python docs/results/bench_decode/rollout_ab.py [--prompts 4] [--group 6] [--new-tokens 128] [--rounds 3]

The embedded model answers the first `--prompts` questions of the shipped GSM8K sample (chat
template, exp2's system prompt) `--group` times each at temperature 1 with its EOS ids as stops,
so the rows end at the model's own lengths: the rollout of `rl.rollout` (`Sampler.generate_ids`
with `group_size`). Both engines get the same prompts, seeds and weights: the chunked kernel
(`Sampler.generate_chunked`, the old engine) and the slot engine (`Sampler.generate_ids`). Prints
each round's wall seconds, the medians and ratio, both engines' counters, and how many rows drew
different tokens (the prefill's batch differs: a near-tie may flip a draw).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    from configs.rlsta import EXP2_SYSTEM as SYSTEM
    from jaxrl_mt.benchmarks.grpo import load_prompts
    from jaxrl_mt.chat import encode_prompt
    from jaxrl_mt.models.registry import load_model
    from jaxrl_mt.sampling import Sampler, SamplingConfig
    from jaxrl_mt.sampling.counters import utilisation

    model = load_model("builtin:smollm2-135m-instruct")
    prompts = [encode_prompt(model.tokenizer, [{"role": "user", "content": p["question"]}], system=SYSTEM)
               for p in load_prompts(a.prompts)]
    s = Sampler.from_model(model)
    sampling = SamplingConfig(max_new_tokens=a.new_tokens, temperature=1.0)
    g, n = a.group, a.prompts * a.group
    budgets, seeds = np.full(n, a.new_tokens, np.int32), np.arange(n, dtype=np.uint32)

    def chunks():
        out, c = s.generate_chunked(s.params, prompts, budgets, sampling, a.seed, seeds, None, g, s.decode_weights())
        return [out["tokens"][i, :out["lengths"][i]].tolist() for i in range(n)], utilisation(c)

    def slots():
        r = s.generate_ids(prompts, sampling, seed=a.seed, group_size=g)
        return r.tokens, {k: v for k, v in r.stats.items() if k not in ("seconds", "new_tokens")}

    times: dict[str, list[float]] = {"chunks": [], "slots": []}
    out: dict[str, object] = {"prompt_tokens": [len(p) for p in prompts], "rows": n}
    for rnd in range(a.rounds + 1):  # round 0 compiles
        for name, fn in (("chunks", chunks), ("slots", slots)):
            t0 = time.perf_counter()
            toks, counters = fn()
            dt = time.perf_counter() - t0
            if rnd == 0:
                out[name] = {"first_s": dt, **counters, "lengths": [len(t) for t in toks]}
                out[name + "_tokens"] = toks
            else:
                times[name].append(dt)
    for name in times:
        out[name]["times_s"] = times[name]
        out[name]["median_s"] = statistics.median(times[name])
    out["speedup"] = out["chunks"]["median_s"] / out["slots"]["median_s"]
    out["rows_differ"] = sum(x != y for x, y in zip(out.pop("chunks_tokens"), out.pop("slots_tokens")))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
