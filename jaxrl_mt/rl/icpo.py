"""ICPO's data recipe: complete and underspecified single-turn prompts, and their held-out metrics.

Training prompts are single-turn: complete problems mixed with underspecified ones, where 1-2
required conditions were removed. The reward is the registered ``"icpo"`` reward
(``jaxrl_mt.rewards.icpo``: the verifier on complete prompts, a non-answer on underspecified
ones); everything else (rollouts, advantages, the jitted GRPO step, checkpoints, logging) is the
training loop's. ICPO is this data plus that reward: ``method = "icpo"``, ``reward = "icpo"``.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl_mt.data.records import DataError
from jaxrl_mt.data.scenarios import build_scenario
from jaxrl_mt.rewards.icpo import COMPLETE, UNDERSPECIFIED, ResponseJudge, icpo_reward
from jaxrl_mt.rewards.judge import NON_ANSWER_TYPES, RESPONSE_TYPES
from jaxrl_mt.rewards.verifier import verify
from jaxrl_mt.rl.data import load_tasks
from jaxrl_mt.rl.histories import TrainItem, load_items, save_items
from jaxrl_mt.rl.recipe import METHODS, ConfigError, Recipe, RecipeEnv
from jaxrl_mt.rl.run_config import TrainConfig
from jaxrl_mt.sampling import SamplingConfig

__all__ = ["COMPLETE", "UNDERSPECIFIED", "ICPOData", "icpo_reward", "make_items"]


def make_items(tasks: Sequence[Any], *, ratio: float, seed: int) -> list[TrainItem]:
    """Complete and underspecified single-turn items; a seeded `ratio` of tasks is underspecified."""
    rng = np.random.default_rng(seed)
    items = []
    for t in tasks:
        under = rng.random() < ratio
        if under:
            try:
                s = build_scenario(t, "underspecified", seed=seed)
            except DataError:
                under = False
        if not under:
            s = build_scenario(t, "full", seed=seed)
        kind = UNDERSPECIFIED if under else COMPLETE
        items.append(TrainItem(item_id=f"{t.task_id}|{kind}", task_id=t.task_id, kind=kind, history=(),
                               last_user=s.turns[0], anchor_prompt=t.full_prompt, merged_user=s.turns[0],
                               answer=t.answer))
    return items


@METHODS.register("icpo")
class ICPOData(Recipe):
    """The data recipe of ``method = "icpo"`` (see the module doc)."""

    def __init__(self) -> None:
        self._judge: ResponseJudge | None = None

    def load(self, c: TrainConfig) -> tuple[list[TrainItem], list[TrainItem]]:
        """Shuffled ICPO items, split into training and held-out (twice `data.heldout`, at most half)."""
        tasks = load_tasks(c.data.add_source, c.data)
        if not tasks:
            raise ConfigError("empty dataset: no ICPO problems")
        items = make_items(tasks, ratio=c.icpo.underspecified_ratio, seed=c.seed)
        order = np.random.default_rng(c.seed).permutation(len(items))
        items = [items[i] for i in order]
        n_held = min(c.data.heldout * 2, len(items) // 2)
        held, train = items[len(items) - n_held:], items[: len(items) - n_held]
        if len(train) < c.rl.batch_size:
            raise ConfigError(f"empty dataset: {len(train)} training items < rl.batch_size {c.rl.batch_size}")
        return train, held

    def prepare(self, env: RecipeEnv, train: Sequence[TrainItem], held: Sequence[TrainItem]
                ) -> tuple[list[TrainItem], list[TrainItem]]:
        """The items as loaded, cached in the workdir (a resumed run reads the cache)."""
        path, held_path = env.workdir / "train_items.jsonl", env.workdir / "heldout.jsonl"
        if path.exists() and held_path.exists():
            return load_items(path), load_items(held_path)
        if env.is_main:
            kinds = collections.Counter(it.kind for it in train)
            save_items(path, train, {"n_items": len(train), **kinds})
            save_items(held_path, held, {"n_items": len(held)})
        env.log(f"data: {len(train)} ICPO items ({sum(it.kind == UNDERSPECIFIED for it in train)} underspecified), "
              f"{len(held)} held-out")
        return list(train), list(held)

    def evaluate(self, env: RecipeEnv, params: Any, held: Sequence[TrainItem]) -> dict[str, float]:
        """Greedy held-out replies: accuracy on complete prompts, non-answer rate on underspecified ones,
        and the fraction of each response type."""
        if not held:
            return {}
        if self._judge is None:
            self._judge = ResponseJudge(env.config.icpo.judge)
        sampler = env.policy_sampler(params)
        t0 = time.perf_counter()
        res = sampler.generate(
            [[{"role": "user", "content": it.last_user}] for it in held],
            SamplingConfig(max_new_tokens=env.config.eval.max_new_tokens, temperature=0.0), system=env.system)
        types = self._judge(res.texts, [it.last_user for it in held])
        out: dict[str, float] = {}
        comp = [(it, text) for it, text in zip(held, res.texts) if it.kind == COMPLETE]
        under = [ty for it, ty in zip(held, types) if it.kind == UNDERSPECIFIED]
        if comp:
            out["eval/complete_acc"] = float(np.mean([verify(text, it.answer, "strict") for it, text in comp]))
        if under:
            out["eval/underspecified_non_answer"] = float(np.mean([ty in NON_ANSWER_TYPES for ty in under]))
        for ty in RESPONSE_TYPES:
            out[f"eval/type_{ty}"] = float(np.mean([x == ty for x in types]))
        out["eval/seconds"] = time.perf_counter() - t0
        return out
