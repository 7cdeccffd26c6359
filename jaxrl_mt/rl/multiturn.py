"""The multi-turn data recipe of RLSTA and GRPO: histories, latent-capability filtering, held-out accuracy.

A data recipe tells the training loop where its items come from (it sees the run as a frozen ``RecipeEnv``)
and how held-out items are scored; the reward is a separate plug-in
(``jaxrl_mt.rewards.registry``). This one:

- ``load``: MT-Add / MT-Refine scenarios from the config's sources (before any model loads);
- ``prepare``: generates each scenario's history with the policy (``build_histories``), keeps
  the items it is better at single-turn than multi-turn (``filter_items``), caches both in the
  workdir (``histories.jsonl``, ``train_items.jsonl``, ``heldout.jsonl``);
- ``evaluate``: greedy single-turn (full prompt) and multi-turn (history + last turn) accuracy.

History building is a function, ``answered_histories`` (cached in the workdir), which SFT, DPO and
RLAAR call too (``rl.supervised``, ``rl.rlaar_data``); no method's recipe inherits this one.

Multi-process runs split histories and filtering over the processes, each on a process-local
copy of the policy, and gather the results so that every process holds the same items; process
0 writes the caches and a resumed run reads process 0's copy. The held-out evaluation is split
over the processes and reported as the item-weighted global mean.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl_mt.parallel import (agree_max, allgather_json, broadcast_json, local_copy, local_mesh,
                               mean_over_processes, process_block)
from jaxrl_mt.rl.data import load_scenarios
from jaxrl_mt.rl.recipe import METHODS, ConfigError, Recipe, RecipeEnv
from jaxrl_mt.rl.run_config import TrainConfig
from jaxrl_mt.rl.probe import filter_breakdown
from jaxrl_mt.rl.histories import TrainItem, accuracy_single_and_multi, build_histories, filter_items, load_items, \
    save_items
from jaxrl_mt.sampling import Sampler, SamplingConfig


def cached_items(env: RecipeEnv, path: Path) -> list[TrainItem] | None:
    """The items cached at `path`, or None: process 0's file, sent to every process (one process: read)."""
    got = broadcast_json([it.to_json() for it in load_items(path)] if env.is_main and path.exists() else None)
    return None if got is None else [TrainItem.from_json(d) for d in got]


def per_process(env: RecipeEnv, fn: Callable[[Sequence[Any]], list[Any]], seq: Sequence[Any]) -> list[Any]:
    """fn(seq): each process maps its contiguous block and the JSON-able results are gathered in order
    (the same list on every process; one process: fn(seq))."""
    del env  # the processes of the run: jax's
    lo, hi = process_block(len(seq))
    mine = fn(seq[lo:hi]) if hi > lo else []
    return [x for part in allgather_json(mine) for x in part]


def local_sampler(env: RecipeEnv) -> Sampler:
    """The policy's sampler, or (multi-process) a new one on a process-local copy of the policy, so that
    each process prepares its block alone."""
    if not env.multi:
        return env.sampler
    s = env.sampler
    return Sampler(local_copy(s.params, env.mesh), s.cfg, s.tokenizer, eos_ids=s.eos_ids, pad_id=s.pad_id,
                   max_batch=s.max_batch, mesh=local_mesh(env.mesh))


def answered_histories(env: RecipeEnv, name: str, scenarios: Sequence[Any], seed: int, *,
                       sampler: Callable[[], Sampler] | None = None) -> list[TrainItem]:
    """The scenarios' histories answered by the policy (``build_histories``), cached in ``<workdir>/<name>``.

    Multi-process: split over the processes (``per_process``) and gathered; process 0 writes the cache.

    Args:
      env: the run (``env.config.history``: the answering budget and temperature).
      name: the cache's file name in the workdir (``histories.jsonl``, ``heldout.jsonl``).
      scenarios: what to answer (every user turn but the last of each).
      seed: the sampling seed.
      sampler: builds the sampler to answer with, called only when the cache is missing
        (default: ``local_sampler(env)``).

    Returns:
      One item per scenario, in order (the cached ones when the cache exists).
    """
    path = env.workdir / name
    cached = cached_items(env, path)
    if cached is not None:
        return cached
    h = env.config.history
    sampling = SamplingConfig(max_new_tokens=h.max_new_tokens, temperature=h.temperature)
    answering = local_sampler(env) if sampler is None else sampler()
    items = per_process(
        env, lambda sc: [it.to_json() for it in build_histories(answering, sc, sampling, seed=seed,
                                                                system=env.system)], scenarios)
    items = [TrainItem.from_json(d) for d in items]
    if env.is_main:
        save_items(path, items, {"n_items": len(items)})
    return items


@METHODS.register("grpo")
@METHODS.register("rlsta")
class MultiTurnData(Recipe):
    """The data recipe of ``method = "rlsta"`` and ``"grpo"`` (see the module doc)."""

    def __init__(self) -> None:
        self._local: Sampler | None = None  # multi-process: a sampler on a process-local copy of the policy

    def load(self, c: TrainConfig) -> tuple[list[Any], list[Any]]:
        """Training and held-out scenarios."""
        return load_scenarios(c)

    def _sampler(self, env: RecipeEnv) -> Sampler:
        """The policy's sampler, or (multi-process) one on a process-local copy of the policy, so that
        each process prepares its block alone."""
        if not env.multi:
            return env.sampler
        if self._local is None:
            self._local = local_sampler(env)
        return self._local

    def _histories(self, env: RecipeEnv, name: str, scenarios: Sequence[Any], seed: int) -> list[TrainItem]:
        return answered_histories(env, name, scenarios, seed, sampler=lambda: self._sampler(env))

    def _filtered(self, env: RecipeEnv, hist: list[TrainItem]) -> tuple[list[TrainItem], dict[str, Any]]:
        """Latent-capability filtering: the items the policy solves more often single-turn than multi-turn."""
        c = env.config
        if not c.filter.enabled:
            return hist, {"n_items": len(hist), "n_kept": len(hist), "filter": "disabled"}
        sampler = self._sampler(env)
        sampling = SamplingConfig(max_new_tokens=c.rl.max_new_tokens, temperature=c.filter.temperature)
        first = process_block(len(hist))[0]  # this process's block draws what one call over all of them does

        def acc(block: Sequence[TrainItem]) -> list[list[float]]:  # [n, 2] (st, mt) per item
            st, mt = accuracy_single_and_multi(sampler, block, sampling, k=c.filter.k, seed=c.seed + 2,
                                               system=env.system, modes=(c.rl.verifier_mode,), first=first,
                                               total=len(hist))[c.rl.verifier_mode]
            return [[float(a), float(b)] for a, b in zip(st, mt)]

        both = np.asarray(per_process(env, acc, hist), np.float64).reshape(-1, 2)  # [n, 2]
        st, mt = both[:, 0], both[:, 1]
        items, stats = filter_items(hist, st, mt, cap=c.filter.cap_per_problem, seed=c.seed)
        kept_ids = {it.item_id for it in items}
        stats.update(filter_breakdown([h.kind for h in hist], st, mt, [h.item_id in kept_ids for h in hist]))
        env.log("filtering breakdown: " + ", ".join(f"{k}={v}" for k, v in stats.items()
                                                 if k.startswith(("kept", "dropped"))))
        env.log(f"filtering: kept {stats['n_kept']}/{stats['n_items']} histories "
              f"(single-turn acc {stats['st_acc_mean']:.3f}, multi-turn acc {stats['mt_acc_mean']:.3f})")
        if not items:
            raise ConfigError("latent-capability filtering kept no history (the policy is never better "
                              "single-turn than multi-turn here); disable filter.enabled or use more data")
        return items, stats

    def prepare(self, env: RecipeEnv, train: Sequence[Any], held: Sequence[Any]) -> tuple[list[TrainItem],
                                                                                      list[TrainItem]]:
        """Histories for training and held-out scenarios, filtered training items (cached)."""
        c = env.config
        t0 = time.perf_counter()
        held_items = self._histories(env, "heldout.jsonl", held, c.seed + 1) if held else []
        items_path = env.workdir / "train_items.jsonl"
        items = cached_items(env, items_path)
        if items is None:
            items, stats = self._filtered(env, self._histories(env, "histories.jsonl", train, c.seed))
            if env.is_main:
                save_items(items_path, items, stats)
        self._local = None  # frees the process-local copy of the policy
        if len(items) < c.rl.batch_size:
            raise ConfigError(f"empty dataset: {len(items)} training items < rl.batch_size {c.rl.batch_size}")
        env.log(f"data: {len(items)} training items, {len(held_items)} held-out ({time.perf_counter() - t0:.1f}s)")
        return items, held_items

    def evaluate(self, env: RecipeEnv, params: Any, held: Sequence[TrainItem]) -> dict[str, float]:
        """Greedy single-turn (full prompt) and multi-turn (history + last turn) accuracy.

        Multi-process: each process evaluates its contiguous block of `held` (padded with repeats
        to the largest block, since the sampler call is collective) and the result is the
        item-weighted mean over processes: the accuracy over all held-out items.
        """
        if not held:
            return {}
        sampler = env.policy_sampler(params)
        lo, hi = process_block(len(held))  # one process: all of them
        mine, n_mine = list(held[lo:hi]), hi - lo
        size = agree_max(len(mine))
        mine = (mine + [mine[-1] if mine else held[0]] * size)[:size]
        acc = accuracy_single_and_multi(
            sampler, mine, SamplingConfig(max_new_tokens=env.config.eval.max_new_tokens, temperature=0.0),
            k=1, seed=0, system=env.system, modes=("strict", "lenient"))
        out = {}
        for mode, (st, mt) in acc.items():
            st, mt = st[:n_mine], mt[:n_mine]
            out[f"eval/single_turn_acc_{mode}"] = float(np.mean(st)) if len(st) else 0.0
            out[f"eval/multi_turn_acc_{mode}"] = float(np.mean(mt)) if len(mt) else 0.0
        return mean_over_processes(out, weight=n_mine)
