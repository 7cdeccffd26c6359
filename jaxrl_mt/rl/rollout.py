"""The rollout of a GRPO step as a free function: items -> generations -> rewards -> a TrainExample.

``rollout(engine, params, items, step)`` is what the trainer, ``benchmarks/grpo.py`` and
``benchmarks/accel.py`` call: the benchmarks time the trainer's own rollout and reward, not a
copy. :class:`RolloutEngine` is frozen: what a rollout uses besides the policy parameters (the
sampler, the reward, the reference model, the buckets' settings, the mesh).

A row's draws depend on its index in the global batch (every process's rows in process order), not
on how many processes hold the rows. Under a mesh (one or several processes) the example has the
same layout as without one: each prompt once for its G completions (``TrainExample``), unless a
micro-batch would split a group or, across processes, a micro-batch's prompts are not a multiple
of the process's share of the rows; then each row carries its own prompt (``group = 1``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.parallel import agree_max_many, allgather_ints, fetch_rows, rows_multiple
from jaxrl_mt.rewards.answer_stats import answer_stats
from jaxrl_mt.rewards.registry import RewardFn, check_output
from jaxrl_mt.rl.batch import place
from jaxrl_mt.rl.example import TrainExample, assemble_example
from jaxrl_mt.rl.grpo import frac_zero_std, group_advantages
from jaxrl_mt.rl.step import LossConfig, completion_logprobs, dapo_num_items, reused_logprobs
from jaxrl_mt.sampling import SamplingConfig, bucket

__all__ = ["Rollout", "RolloutEngine", "grouped_layout", "rollout", "example_logprobs"]


@dataclasses.dataclass(frozen=True)
class RolloutEngine:
    """What a rollout uses besides the policy parameters (built once per run)."""

    sampler: Any  # the policy's Sampler (the rollout passes its params per call)
    reward_fn: RewardFn  # the registered reward built for the run
    reward_name: str
    ref_params: Any  # the frozen reference model (KL term)
    ref_cfg: Any
    policy_cfg: Any  # the policy's ModelConfig (old log-probs, rl.mu > 1)
    tokenizer: Any
    pad_id: int
    lc: LossConfig
    group_size: int  # G
    max_new_tokens: int
    temperature: float
    top_p: float = 1.0
    scale_rewards: bool = True
    grad_accum: int = 1
    mu: int = 1
    seed: int = 0
    system: str | None = None
    mesh: Any = None
    grouped: bool = True  # each prompt once for its G completions (`grouped_layout`)
    run_to_budget: bool = False  # no stop tokens: every row runs to max_new_tokens (the benchmark)


class Rollout(NamedTuple):
    """A rollout's example and what it reports."""

    example: TrainExample  # host arrays, this process's rows
    metrics: dict[str, float]
    samples: list[dict]  # the first row of each group, for the sample table
    rewards: np.ndarray  # [N]


def grouped_layout(batch_size: int, group_size: int, grad_accum: int, mesh: Any = None) -> bool:
    """Whether micro-batches hold whole groups of prompts that can be fed as rows (see the module doc;
    ``rows_multiple`` is 1 without a mesh or on one process)."""
    micro = batch_size * group_size // grad_accum
    if micro % group_size:
        return False
    return (micro // group_size) % rows_multiple(mesh) == 0


def example_logprobs(engine: RolloutEngine, params: Any, cfg: Any, ex: TrainExample) -> np.ndarray:
    """Log-probs [N, C] of this process's completions under (params, cfg), on the engine's mesh."""
    out = completion_logprobs(params, cfg, place(engine.mesh, ex), temperature=engine.lc.temperature)
    return np.asarray(fetch_rows(out))[: ex.rows]


def rollout(engine: RolloutEngine, params: Any, items: Sequence[Any], step: int) -> Rollout:
    """Samples G completions per item, rewards them and assembles the step's example.

    ``params`` are the policy's: passed to the sampler per call (the sampler is not changed) and
    used for the old log-probs of ``mu > 1``.
    """
    e, G = engine, engine.group_size
    prompts = [encode_prompt(e.tokenizer, it.messages, system=e.system) for it in items]
    rows = [p for p in prompts for _ in range(G)]
    # row r of process p draws with row seed p * rows + r, its index in the global batch: the draws of
    # a step on several processes are those of one process holding every row (one process: r)
    row_seeds = np.arange(len(rows)) + jax.process_index() * len(rows)
    t0, c0 = time.perf_counter(), time.process_time()
    res = e.sampler.generate_ids(prompts, SamplingConfig(max_new_tokens=e.max_new_tokens, temperature=e.temperature,
                                                         top_p=e.top_p),
                                 seed=jax.random.fold_in(jax.random.PRNGKey(e.seed), step), group_size=G,
                                 stop_ids=[[] for _ in rows] if e.run_to_budget else None, row_seeds=row_seeds,
                                 params=params)
    e.sampler.release_decode_weights()  # the next step's params differ: no copy through the update
    gen_s, gen_cpu = time.perf_counter() - t0, time.process_time() - c0
    t1, c1 = time.perf_counter(), time.process_time()
    out = check_output(e.reward_fn(items, res), len(rows), f"reward {e.reward_name!r}")
    reward = out.rewards
    adv = np.asarray(group_advantages(jnp.asarray(reward, jnp.float32), G, scale_rewards=e.scale_rewards))
    P = bucket(max(len(p) for p in rows), 32)
    C = min(bucket(max(max(res.lengths), 1), 16), bucket(e.max_new_tokens, 16))
    P, C = agree_max_many([P, C])  # one train-step program: every process uses the largest buckets
    ex = (assemble_example(prompts, res.tokens, e.pad_id, P, C, group=G, advantages=adv) if e.grouped
          else assemble_example(rows, res.tokens, e.pad_id, P, C, group=1, advantages=adv))
    if e.lc.loss_type == "dapo":  # TRL's num_items_in_batch: every row carries the step's normaliser
        tokens = int(ex.completion_mask.sum())
        ex = ex.replace(num_items=dapo_num_items(ex.completion_mask, e.grad_accum,
                                                 int(allgather_ints([tokens]).sum())))
    if e.lc.beta > 0:  # the reward's reference pass when it scored these pairs, else the reference model
        ref = reused_logprobs(out.ref_logprobs, rows, res.tokens, C, temperature=e.lc.temperature)
        ref = ref if int(allgather_ints([ref is None]).sum()) == 0 else None  # every process: the same branch
        ex = ex.replace(ref_logp=ref if ref is not None else example_logprobs(e, e.ref_params, e.ref_cfg, ex))
    if e.mu > 1:
        ex = ex.replace(old_logp=example_logprobs(e, params, e.policy_cfg, ex))
    score_s, score_cpu = time.perf_counter() - t1, time.process_time() - c1
    m = _metrics(reward, out.components, res, items, G, gen_s, score_s)
    m.update({"perf/rollout_cpu_s": gen_cpu, "perf/score_cpu_s": score_cpu})
    samples = [{"item": items[i // G].item_id, "last_user": items[i // G].last_user, "completion": res.texts[i],
                **{k: v[i] for k, v in out.columns.items()}, "R": f"{reward[i]:.3f}", "A": f"{adv[i]:+.2f}"}
               for i in range(0, len(rows), G)]
    return Rollout(ex, m, samples, reward)


def _metrics(reward: np.ndarray, comps: dict[str, np.ndarray], res: Any, items: Sequence[Any], G: int,
             gen_s: float, score_s: float) -> dict[str, float]:
    lens = res.lengths.astype(np.float64)
    m = {"reward/total": float(reward.mean()), "reward/group_std": float(reward.reshape(-1, G).std(1).mean()),
         "reward/frac_zero_std": float(frac_zero_std(reward, G))}
    if "verifier" in comps:  # groups the verifier cannot rank: any other term alone sets their advantages
        m["reward/verifier_frac_zero_std"] = float(frac_zero_std(np.asarray(comps["verifier"]), G))
    m.update({f"reward/{k}": float(np.mean(v)) for k, v in comps.items()})
    m.update(answer_stats(res.texts, [it.answer for it in items for _ in range(G)]))
    m.update({
        "completion/mean_length": float(lens.mean()), "completion/max_length": float(lens.max()),
        "completion/clipped_frac": float(np.mean([f == "length" for f in res.finish_reasons])),
        "perf/rollout_tokens_per_s": float(lens.sum() / max(gen_s, 1e-9)), "perf/rollout_s": gen_s,
        "perf/score_s": score_s,
    })
    return m
