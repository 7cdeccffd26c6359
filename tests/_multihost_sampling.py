"""The sampling part of tests/_parallel_worker.py's multihost mode (not collected by pytest).

`Sampler.generate_ids` on a global mesh over two processes, each process passing its own rows
(process 0: 3 prompts, process 1: 2; per-row budgets, explicit row seeds), greedy, sampled and
grouped (G = 2), under meshes (4,1,1) (2 slots per process at most: rows wait for free slots) and
(2,2,1); the reference process answers the global rows in one call on one device. The caller
(tests/test_multihost.py) compares each process's rows with the reference's.

`Sampler.run_turns` on the same meshes (`turn_calls`): every process runs the same five
conversations of up to three turns (replicated: the same feeds and the same `advance` hook on
every process, as a multi-process evaluation runs every conversation everywhere), each keeping
its KV cache in its slot across turns, greedy and sampled; the reference runs them on one device.
Different feeds on the two processes are refused on both.
"""

from __future__ import annotations

from typing import Any

import jax

from jaxrl_mt import parallel
from jaxrl_mt.sampling import Sampler, SamplingConfig

PROMPTS = ((5, 11, 3), (7, 20))  # the prompt lengths of process 0, process 1
BUDGETS = ((3, 8, 5), (6, 2))  # each prompt's rows' new-token budgets
MAX_NEW = 8
CALLS = {"greedy": (0.0, 1), "sampled": (1.0, 1), "grouped": (1.0, 2)}  # name -> (temperature, group size)
MESHES = {"4,1,1": 2, "2,2,1": None}  # mesh shape -> the sampler's max_batch (per process)


def process_prompts(pid: int) -> list[list[int]]:
    """Process `pid`'s prompts (fixed; the reference process makes both processes' prompts)."""
    import numpy as np

    rng = np.random.default_rng(40 + pid)
    return [rng.integers(2, 64, n).tolist() for n in PROMPTS[pid]]


def call_args(pids: list[int], temperature: float, group: int) -> tuple[list[list[int]], dict[str, Any]]:
    """The prompts and keyword arguments of the processes `pids`' rows (consecutive, in order)."""
    prompts = [p for q in pids for p in process_prompts(q)]
    budgets = [b for q in pids for b in BUDGETS[q] for _ in range(group)]
    first = sum(len(PROMPTS[q]) for q in range(pids[0])) * group  # the global index of the first row
    seeds = [1000 + 7 * (first + i) for i in range(len(budgets))]
    return prompts, {"max_new_tokens": budgets, "row_seeds": seeds, "group_size": group,
                     "sampling": SamplingConfig(max_new_tokens=MAX_NEW, temperature=temperature)}


def run_calls(sampler: Sampler, pids: list[int]) -> dict[str, Any]:
    """Every call of `CALLS` on the rows of `pids`: tokens, log-probs, stats; the kinds of programs run."""
    out: dict[str, Any] = {}
    for name, (temperature, group) in CALLS.items():
        prompts, kw = call_args(pids, temperature, group)
        res = sampler.generate_ids(prompts, kw.pop("sampling"), seed=3, **kw)
        out[name] = {"tokens": res.tokens, "logprobs": [lp.tolist() for lp in res.logprobs],
                     "finish": res.finish_reasons, "stats": {k: v for k, v in res.stats.items() if k != "seconds"}}
    out["shapes"] = sorted({s[0] if isinstance(s[0], str) else "chunked" for s in sampler.compiled_shapes})
    return out


TURN_CALLS = {"greedy": 0.0, "sampled": 1.0}  # name -> temperature
TURNS = (3, 3, 1, 2, 3)  # each conversation's turns (conversation i starts with prompt i of both processes')


def turn_calls(sampler: Sampler) -> dict[str, Any]:
    """The conversations of `TURNS` through `Sampler.run_turns`, every later turn fed the reply's last
    token and a few ids with its own budget: {name: [[conv, turn, tokens, logprobs, finish, context]],
    name + "_counters": the engine's counters}; "refused": the error of a call whose feeds differ
    between processes (on a multi-process mesh)."""
    from jaxrl_mt.sampling.turns import Feed

    prompts = process_prompts(0) + process_prompts(1)
    out: dict[str, Any] = {}
    for name, temperature in TURN_CALLS.items():
        got: list[list[Any]] = []
        done = [0] * len(prompts)

        def advance(replies, got=got, done=done):
            feeds = []
            for r in replies:
                got.append([r.conv, done[r.conv], r.tokens, [float(x) for x in r.logprobs], r.finish, r.context])
                done[r.conv] += 1
                if done[r.conv] < TURNS[r.conv]:
                    seg = [r.tokens[-1]] + [(5 * r.conv + 3 * done[r.conv] + k) % 60 + 2 for k in range(3 + r.conv)]
                    feeds.append(Feed(r.conv, seg, seed=100 * r.conv + done[r.conv], budget=MAX_NEW - r.conv))
            return feeds

        first = [Feed(i, p, seed=100 * i, fresh=True, budget=BUDGETS[i // 3][i % 3]) for i, p in enumerate(prompts)]
        counters = sampler.run_turns(first, SamplingConfig(max_new_tokens=MAX_NEW, temperature=temperature), advance,
                                     seed=5)
        out[name] = sorted(got)
        out[name + "_counters"] = counters
    if sampler.engine.multi:
        try:
            mine = [Feed(0, process_prompts(jax.process_index())[0], seed=0, fresh=True)]
            sampler.run_turns(mine, SamplingConfig(max_new_tokens=MAX_NEW), lambda replies: [], seed=5)
            out["refused"] = None
        except ValueError as e:
            out["refused"] = str(e)
    return out


def sampling_part(cfg: Any, params0: Any, reference: bool) -> dict[str, Any]:
    """{mesh shape: `run_calls` of this process's rows} (reference: {"reference": the global rows})."""
    if reference:
        one = jax.device_put(params0, jax.devices()[0])
        sampler = Sampler(one, cfg, eos_ids=(1,), pad_id=0)
        return {"reference": {**run_calls(sampler, [0, 1]), "turns": turn_calls(sampler)}}
    out = {}
    for shape, max_batch in MESHES.items():
        mesh = parallel.make_mesh(tuple(int(x) for x in shape.split(",")))
        sampler = Sampler(parallel.shard_params(params0, mesh), cfg, eos_ids=(1,), pad_id=0, mesh=mesh,
                          max_batch=max_batch)
        out[shape] = {**run_calls(sampler, [jax.process_index()]), "turns": turn_calls(sampler)}
    return out
