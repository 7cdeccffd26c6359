"""ICPO: illocution-calibrated GRPO.

Training prompts are single-turn: complete problems (reward = the verifier) mixed with
underspecified ones, where 1-2 required conditions were removed (reward = 1 when the reply does
not commit to an answer: clarification, interrogation, discussion, hedging or refusal, as judged
by the response-type judge; else 0). Everything else (rollouts, advantages, the jitted GRPO step,
checkpoints, logging) is the RLSTA Trainer's: only the data and the reward differ.
"""

from __future__ import annotations

import collections
import time
from typing import Any, Sequence

import numpy as np

from jaxrl_mt.data.records import DataError
from jaxrl_mt.data.scenarios import build_scenario
from jaxrl_mt.rewards.judge import NON_ANSWER_TYPES, RESPONSE_TYPES, classify_llm, classify_rule_based
from jaxrl_mt.rewards.verifier import verify
from jaxrl_mt.rl.histories import TrainItem, load_items, save_items
from jaxrl_mt.rl.loop import ConfigError, Trainer, load_tasks
from jaxrl_mt.sampling import SamplingConfig

COMPLETE, UNDERSPECIFIED = "complete", "underspecified"


def icpo_reward(kind: str, text: str, gold: str, response_type: str, *, mode: str = "strict") -> float:
    """The ICPO reward of one reply.

    Args:
      kind: "complete" or "underspecified".
      text: the reply; gold: the gold answer of the (complete) problem.
      response_type: the judge's verdict (one of RESPONSE_TYPES).
      mode: verifier mode for complete prompts.
    """
    if kind == COMPLETE:
        return float(verify(text, gold, mode))
    if kind == UNDERSPECIFIED:
        if response_type not in RESPONSE_TYPES:
            raise ValueError(f"unknown response type {response_type!r}")
        return 1.0 if response_type in NON_ANSWER_TYPES else 0.0
    raise ValueError(f"unknown ICPO prompt kind {kind!r}; expected {COMPLETE!r} or {UNDERSPECIFIED!r}")


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


class ICPOTrainer(Trainer):
    """The Trainer with ICPO's data (complete + underspecified prompts) and reward."""

    def __init__(self, c: Any, **kw: Any):
        if not 0.0 <= c.icpo.underspecified_ratio <= 1.0:
            raise ConfigError(f"icpo.underspecified_ratio must be in [0, 1], got {c.icpo.underspecified_ratio}")
        super().__init__(c, **kw)
        self.judge_backend = None
        if c.icpo.judge != "rule":
            from jaxrl_mt.backends import make_backend

            self.judge_backend = make_backend(c.icpo.judge)

    def load_data(self) -> tuple[list[TrainItem], list[TrainItem]]:
        c = self.c
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

    def prepare(self) -> tuple[list[TrainItem], list[TrainItem]]:
        path, held_path = self.wd / "train_items.jsonl", self.wd / "heldout.jsonl"
        if path.exists() and held_path.exists():
            return load_items(path), load_items(held_path)
        train, held = self.train_scen, self.held_scen
        if self.is_main:
            kinds = collections.Counter(it.kind for it in train)
            save_items(path, train, {"n_items": len(train), **kinds})
            save_items(held_path, held, {"n_items": len(held)})
        self.log(f"data: {len(train)} ICPO items ({sum(it.kind == UNDERSPECIFIED for it in train)} underspecified), "
                 f"{len(held)} held-out")
        return train, held

    def judge(self, texts: Sequence[str], questions: Sequence[str]) -> list[str]:
        if self.judge_backend is None:
            return [classify_rule_based(t, question=q, user=q) for t, q in zip(texts, questions)]
        return classify_llm(self.judge_backend, list(texts), list(questions))

    def rewards(self, items: Sequence[TrainItem], res: Any) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, list]]:
        G = self.c.rl.group_size
        rows = [it for it in items for _ in range(G)]
        types = self.judge(res.texts, [it.last_user for it in rows])
        mode = self.c.rl.verifier_mode
        reward = np.array([icpo_reward(it.kind, t, it.answer, ty, mode=mode)
                           for it, t, ty in zip(rows, res.texts, types)])
        complete = np.array([it.kind == COMPLETE for it in rows])
        comps: dict[str, np.ndarray] = {f"type_{t}": np.array([ty == t for ty in types], float) for t in RESPONSE_TYPES}
        if complete.any():
            comps["complete_acc"] = reward[complete]
        if (~complete).any():
            comps["underspecified_non_answer"] = reward[~complete]
        cols = {"kind": [it.kind for it in rows], "type": types, "gold": [it.answer for it in rows]}
        return reward, comps, cols

    def evaluate(self, params: Any, held: Sequence[TrainItem]) -> dict[str, float]:
        if not held:
            return {}
        self.sampler.params = params
        t0 = time.perf_counter()
        res = self.sampler.generate(
            [[{"role": "user", "content": it.last_user}] for it in held],
            SamplingConfig(max_new_tokens=self.c.eval.max_new_tokens, temperature=0.0), system=self.system)
        types = self.judge(res.texts, [it.last_user for it in held])
        out: dict[str, float] = {}
        comp = [(it, t) for it, t in zip(held, res.texts) if it.kind == COMPLETE]
        under = [ty for it, ty in zip(held, types) if it.kind == UNDERSPECIFIED]
        if comp:
            out["eval/complete_acc"] = float(np.mean([verify(t, it.answer, "strict") for it, t in comp]))
        if under:
            out["eval/underspecified_non_answer"] = float(np.mean([ty in NON_ANSWER_TYPES for ty in under]))
        for t in RESPONSE_TYPES:
            out[f"eval/type_{t}"] = float(np.mean([ty == t for ty in types]))
        out["eval/seconds"] = time.perf_counter() - t0
        return out
