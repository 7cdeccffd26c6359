r"""RLAAR: abstention-aware RL on sharded problems, with a competence-gated shard-count curriculum.

Pieces (pure functions and a pure state machine; the trainer wiring is apart):

* :func:`shard_turns`: a problem's shards (the target, then its conditions in reveal order) as
  ``k`` user turns (contiguous groups, the first ``len % k`` one shard longer), solvable;
  with ``unsolvable=True`` the last shard is dropped first, so the sample can never be solved and
  never contains that shard.
* :func:`drop_last_shard`: the same for a training item (a history answered by the model): the
  conversation up to the user turn before the last shard, of kind ``"unsolvable"``.
* :func:`jaxrl_mt.rewards.abstain.abstention_reward`: 1 for ``\boxed{abstain}`` on an unsolvable
  sample, the verifier on a solvable one (0 for abstaining there); re-exported here.
* :class:`Curriculum`: the number of shards per step, as RLAAR's probable public code (the
  ``verl_mt`` fork of verl) runs it: start at 1 shard; keep the last ``window`` (10) step mean
  rewards; the threshold is ``ratio`` (0.8) x the mean of the first full window, fixed from then;
  after a step whose window is full, whose mean exceeds the threshold, and with at least
  ``min_gap`` (10) steps since the last increase (the start counts as one), one more shard; once
  the count reaches ``max_shards`` (10), every later step draws a count uniformly in
  ``[1, max_shards]`` (seeded by ``(seed, step)``: the same on resume).

Reading of the description where it is open: "exceeds" is strict (>); the window is not cleared on
an increase (the gap of ``min_gap >= window`` steps means the next decision reads only rewards at
the new count); the random phase begins at the step after the one that reached ``max_shards``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from jaxrl_mt.rewards.abstain import UNSOLVABLE, abstention_reward, is_abstain
from jaxrl_mt.rl.histories import TrainItem

__all__ = ["Curriculum", "CurriculumConfig", "abstention_reward", "drop_last_shard", "is_abstain", "shard_turns"]


def shard_turns(shards: Sequence[str], k: int, *, unsolvable: bool = False, sep: str = "\n") -> tuple[str, ...]:
    """A problem's shards as ``min(k, available)`` user turns.

    Args:
      shards: ``[n]`` the target shard then the conditions, in reveal order (``n >= 1``; ``n >= 2``
        for an unsolvable sample).
      k: the curriculum's shard count (turns wanted, >= 1).
      unsolvable: drop the last shard first (RLAAR's unsolvable sample).
      sep: joins the shards that share a turn.

    Returns:
      The user turns, in order: every shard (all but the last when ``unsolvable``) exactly once.

    Raises:
      ValueError: ``k < 1``, no shards, or an unsolvable sample of a one-shard problem.
    """
    if k < 1:
        raise ValueError(f"shard_turns: k must be >= 1, got {k}")
    kept = list(shards[:-1] if unsolvable else shards)
    if not kept:
        raise ValueError(f"shard_turns: {len(shards)} shard(s) leave nothing to ask (unsolvable={unsolvable})")
    groups = np.array_split(np.arange(len(kept)), min(k, len(kept)))
    return tuple(sep.join(kept[i] for i in g) for g in groups)


def drop_last_shard(item: TrainItem) -> TrainItem:
    """The unsolvable version of a training item: its last user turn (the last shard) dropped.

    Args:
      item: a history ``(user, assistant)*`` and its last user turn (``histories.TrainItem``).

    Returns:
      An item of kind ``"unsolvable"`` (id ``<item_id>|unsolvable``): the history before the
      previous user turn, that turn as the last one; ``anchor_prompt`` and ``merged_user`` are the
      remaining user turns joined (the full problem, which holds the dropped shard, is not kept).

    Raises:
      ValueError: an item whose history holds no user turn (a one-shard problem).
    """
    users = [i for i, (role, _) in enumerate(item.history) if role == "user"]
    if not users:
        raise ValueError(f"drop_last_shard: item {item.item_id!r} has no user turn before its last one")
    cut = users[-1]
    history = tuple(item.history[:cut])
    last = item.history[cut][1]
    merged = "\n".join([c for r, c in history if r == "user"] + [last])
    return dataclasses.replace(item, item_id=f"{item.item_id}|{UNSOLVABLE}", kind=UNSOLVABLE, history=history,
                               last_user=last, anchor_prompt=merged, merged_user=merged)


@dataclasses.dataclass(frozen=True)
class CurriculumConfig:
    """The curriculum's constants (RLAAR's)."""

    window: int = 10  # steps whose mean reward is compared
    ratio: float = 0.8  # threshold = ratio x the first full window's mean
    min_gap: int = 10  # least steps between two increases
    max_shards: int = 10  # the last count before the random phase
    seed: int = 0  # the random phase's seed


@dataclasses.dataclass(frozen=True)
class Curriculum:
    """The curriculum's state after ``step`` updates (immutable; :meth:`update` returns the next one)."""

    config: CurriculumConfig = CurriculumConfig()
    shards: int = 1  # the current count (before the random phase)
    step: int = 0  # step rewards seen
    window: tuple[float, ...] = ()  # the last ``config.window`` step rewards
    threshold: float | None = None  # set once the first window is full
    last_increase: int = 0  # the step count at the last increase (0: the start)
    random_phase: bool = False

    def count(self) -> int:
        """The shard count of the next step (step index ``self.step``)."""
        if not self.random_phase:
            return self.shards
        rng = np.random.default_rng([self.config.seed, self.step])
        return int(rng.integers(1, self.config.max_shards + 1))

    def update(self, reward: float) -> "Curriculum":
        """The state after a step whose mean reward was ``reward`` (the step used :meth:`count`)."""
        cfg = self.config
        step = self.step + 1
        window = (self.window + (float(reward),))[-cfg.window:]
        threshold = self.threshold
        if threshold is None and len(window) == cfg.window:
            threshold = cfg.ratio * float(np.mean(window))
        shards, last, random_phase = self.shards, self.last_increase, self.random_phase
        if (not random_phase and threshold is not None and len(window) == cfg.window
                and float(np.mean(window)) > threshold and step - last >= cfg.min_gap):
            shards, last = shards + 1, step
            random_phase = shards >= cfg.max_shards
        return dataclasses.replace(self, shards=shards, step=step, window=window, threshold=threshold,
                                   last_increase=last, random_phase=random_phase)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (for the checkpoint: resuming continues the same schedule)."""
        d = dataclasses.asdict(self)
        d["window"] = list(self.window)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Curriculum":
        d = dict(d)
        return cls(**{**d, "config": CurriculumConfig(**d["config"]), "window": tuple(d["window"])})
