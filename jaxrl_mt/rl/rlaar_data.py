r"""RLAAR as a training method (``method = "rlaar"``): abstention rewards with a shard-count curriculum.

Each problem (``data.add_source``) is asked as ``k`` user turns (``rl.rlaar.shard_turns``), solvable
(every shard) or unsolvable (its last shard dropped), for every ``k`` in ``[1, rlaar.max_shards]``
the problem has shards for; the model answers every turn but the last (its history, once per run,
cached as RLSTA's). A step draws ``rl.batch_size`` problems; the curriculum (``rl.rlaar.Curriculum``)
sets ``k``, and each problem is unsolvable with probability ``rlaar.unsolvable_fraction`` (seeded by
run seed, step and problem: a resumed run draws the same). The reward (``rewards.abstain``, name
``rlaar``): 1 for ``\boxed{abstain}`` on an unsolvable sample, the verifier on a solvable one. The
curriculum's state is saved in every checkpoint (``state_json`` / ``set_state``).
Held-out: the last ``data.heldout`` problems at their largest ``k``, solvable and unsolvable, answered
greedily (``eval/solvable_acc``, ``eval/unsolvable_abstain``, ``eval/abstain_rate``).
"""

from __future__ import annotations

import dataclasses
import time
import zlib
from typing import Any, Sequence

import numpy as np

from jaxrl_mt.chat import encode_prompt
from jaxrl_mt.data.records import Scenario
from jaxrl_mt.rewards.abstain import UNSOLVABLE, abstention_reward, is_abstain
from jaxrl_mt.rl.data import load_tasks
from jaxrl_mt.rl.histories import TrainItem
from jaxrl_mt.rl.multiturn import answered_histories
from jaxrl_mt.rl.recipe import METHODS, ConfigError, Recipe, RecipeEnv
from jaxrl_mt.rl.run_config import TrainConfig
from jaxrl_mt.rl.rlaar import Curriculum, CurriculumConfig, shard_turns
from jaxrl_mt.sampling import SamplingConfig

__all__ = ["RLAARData", "variant_scenarios"]

SOLVABLE = "sharded"


def _shards(task: Any) -> tuple[str, ...]:
    return (task.target, *task.conditions)


def variant_scenarios(task: Any, max_shards: int) -> list[Scenario]:
    """The problem as ``k`` turns for every ``k`` in ``[1, max_shards]`` it has shards for, solvable and
    (with two or more shards) unsolvable (``k`` and ``unsolvable`` in the metadata; the scenario kind is
    "sharded", the training item's kind "sharded" or "unsolvable")."""
    shards, out = _shards(task), []
    for unsolvable in (False, True):
        avail = len(shards) - unsolvable
        for k in range(1, min(max_shards, avail) + 1):
            turns = shard_turns(shards, k, unsolvable=unsolvable)
            out.append(Scenario(task.task_id, SOLVABLE, turns, task.full_prompt, task.answer,
                                metadata=(("k", k), ("unsolvable", unsolvable))))
    return out


def _key(it: TrainItem) -> tuple[str, int, bool]:
    _, k, kind = it.item_id.rsplit("|", 2)
    return it.task_id, int(k[1:]), kind == UNSOLVABLE


@METHODS.register("rlaar")
class RLAARData(Recipe):
    """The data recipe of ``method = "rlaar"`` (see the module doc)."""

    def __init__(self) -> None:
        self.curriculum: Curriculum | None = None
        self._variants: dict[tuple[str, int, bool], TrainItem] = {}

    def load(self, c: TrainConfig) -> tuple[list[Any], list[Any]]:
        """Training and held-out problems (the last ``data.heldout``)."""
        tasks = [t for t in load_tasks(c.data.add_source, c.data, max_turns=c.data.max_turns, require_each=True)]
        n_held = min(c.data.heldout, max(len(tasks) - 1, 0))
        train, held = tasks[: len(tasks) - n_held], tasks[len(tasks) - n_held:]
        if len(train) < c.rl.batch_size:
            raise ConfigError(f"empty dataset: {len(train)} RLAAR problems < rl.batch_size {c.rl.batch_size}")
        return train, held

    def _answered(self, env: RecipeEnv, name: str, tasks: Sequence[Any], seed: int) -> list[TrainItem]:
        c = env.config.rlaar
        scen = [s for t in tasks for s in variant_scenarios(t, c.max_shards)]
        items = answered_histories(env, name, scen, seed)
        out = []
        for it, s in zip(items, scen):
            meta = dict(s.metadata)
            kind = UNSOLVABLE if meta["unsolvable"] else SOLVABLE
            out.append(dataclasses.replace(it, item_id=f"{s.task_id}|k{meta['k']}|{kind}", kind=kind))
        return out

    def prepare(self, env: RecipeEnv, train: Sequence[Any], held: Sequence[Any]) -> tuple[list[TrainItem],
                                                                                      list[TrainItem]]:
        """One base item per training problem (what the data iterator draws) and the held-out variants.

        Several processes: the histories are answered per process and gathered (``answered_histories``);
        every process holds every variant, draws its own problems and follows the same curriculum (it
        observes the step's global mean reward)."""
        c, t0 = env.config, time.perf_counter()
        items = self._answered(env, "histories.jsonl", train, c.seed)
        self._variants = {_key(it): it for it in items}
        held_items = self._answered(env, "heldout.jsonl", held, c.seed + 1) if held else []
        top: dict[tuple[str, bool], TrainItem] = {}
        for it in held_items:  # each held problem at its largest k, solvable and unsolvable
            task, k, unsolvable = _key(it)
            if (task, unsolvable) not in top or _key(top[task, unsolvable])[1] < k:
                top[task, unsolvable] = it
        base = [it for it in items if _key(it)[1:] == (1, False)]
        if self.curriculum is None:
            self.curriculum = Curriculum(CurriculumConfig(max_shards=c.rlaar.max_shards, seed=c.seed))
        env.log(f"data: {len(base)} RLAAR problems ({len(items)} variants), {len(top)} held-out samples "
                f"({time.perf_counter() - t0:.1f}s)")
        return base, list(top.values())

    def step_items(self, env: RecipeEnv, items: Sequence[TrainItem], step: int) -> tuple[list[TrainItem],
                                                                                        dict[str, float]]:
        """The step's samples of the drawn problems: the curriculum's ``k`` (at most what a problem has),
        unsolvable with probability ``rlaar.unsolvable_fraction``."""
        c, k = env.config, self.curriculum.count()
        out = []
        for it in items:
            u = np.random.default_rng([c.seed, step, zlib.crc32(it.task_id.encode())]).random()
            unsolvable = bool(u < c.rlaar.unsolvable_fraction)
            ks = [kk for (t, kk, un) in self._variants if t == it.task_id and un == unsolvable]
            if not ks:  # a one-shard problem has no unsolvable variant
                unsolvable, ks = False, [kk for (t, kk, un) in self._variants if t == it.task_id and not un]
            out.append(self._variants[it.task_id, min(k, max(ks)), unsolvable])
        return out, {"curriculum/shards": float(k),
                     "curriculum/unsolvable_frac": float(np.mean([x.kind == UNSOLVABLE for x in out]))}

    def observe(self, metrics: dict[str, float]) -> None:
        """Advances the curriculum by the step's mean reward."""
        self.curriculum = self.curriculum.update(metrics["reward/total"])

    def state_json(self) -> dict[str, Any]:
        """The curriculum's state (saved in every checkpoint: a resumed run continues its schedule)."""
        return {"curriculum": self.curriculum.to_json()}

    def set_state(self, state: dict[str, Any]) -> None:
        """The curriculum of a checkpoint (``state_json``'s)."""
        self.curriculum = Curriculum.from_json(state["curriculum"])

    def evaluate(self, env: RecipeEnv, params: Any, held: Sequence[TrainItem]) -> dict[str, float]:
        """Greedy replies on the held-out samples: accuracy (solvable), abstention (unsolvable and all).

        Several processes: each answers every held-out sample (its rows of one collective call)."""
        if not held:
            return {}
        c, sampler = env.config, env.policy_sampler(params)
        prompts = [encode_prompt(sampler.tokenizer, it.messages, system=env.system) for it in held]
        texts = sampler.generate_ids(prompts, SamplingConfig(max_new_tokens=c.eval.max_new_tokens,
                                                             temperature=0.0)).texts
        solv = [abstention_reward(t, solvable=True, gold=it.answer, mode="strict")
                for it, t in zip(held, texts) if it.kind != UNSOLVABLE]
        unsolv = [abstention_reward(t, solvable=False, gold=it.answer) for it, t in zip(held, texts)
                  if it.kind == UNSOLVABLE]
        out = {"eval/abstain_rate": float(np.mean([is_abstain(t) for t in texts]))}
        if solv:
            out["eval/solvable_acc"] = float(np.mean(solv))
        if unsolv:
            out["eval/unsolvable_abstain"] = float(np.mean(unsolv))
        return out
