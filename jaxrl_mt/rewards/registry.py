"""Rewards as plug-ins: pure functions of (items, generations), registered by name and chosen by config.

A reward is built once per run from its :class:`RewardEnv` (the config and the frozen reference
scorer it may use) and then called every step::

    fn = make_reward("rlsta", env)
    out = fn(items, generations)  # RewardOutput(rewards [N], components {name: [N]}, columns {name: [N]})

``items`` are the step's prompts (each with ``answer``, ``anchor_prompt``, ``merged_user``,
``last_user`` and ``kind``, as ``jaxrl_mt.rl.histories.TrainItem``), ``generations`` the sampler's
``GenerationResult`` with G consecutive rows per item. ``components`` are logged as
``reward/<name>`` (their means), ``columns`` go to the sample table. Built-in rewards: ``rlsta``
and ``grpo`` (``jaxrl_mt.rewards.rlsta``), ``icpo`` (``jaxrl_mt.rewards.icpo``) and ``rlaar``
(``jaxrl_mt.rewards.abstain``), registered
imported on first use by the registry (``REWARDS``, a ``jaxrl_mt.registry.Registry``); a new one
registers with :func:`register_reward`. This module is the registry's leaf: it imports no reward.

A reward that scores the completions under the frozen reference model (the anchor) returns those
log-probs (``RewardOutput.ref_logprobs``), so the KL term reuses them when they are for the same
(prompt, completion) pairs instead of running the reference model a second time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from jaxrl_mt.registry import Registry

if TYPE_CHECKING:
    from jaxrl_mt.rl.run_config import TrainConfig

__all__ = ["REWARDS", "RefLogprobs", "RewardEnv", "RewardFn", "RewardOutput", "check_output", "group_rows",
           "make_reward", "register_reward", "reward_names"]


class RefLogprobs(NamedTuple):
    """Per-token log-probs [len(completion)] the reward computed under the reference model, per row."""

    contexts: Sequence[Sequence[int]]  # [N] the context each completion was scored under
    completions: Sequence[Sequence[int]]  # [N] the scored completions
    logprobs: Sequence[np.ndarray | None]  # [N] their log-probs (None: the row was not scored)


class RewardOutput(NamedTuple):
    """What a reward returns for N = len(items) * G generations."""

    rewards: np.ndarray  # [N] the scalar reward of each generation
    components: dict[str, np.ndarray]  # logged as reward/<name> (mean over the rows it holds)
    columns: dict[str, list[Any]]  # sample-table columns, [N] each
    ref_logprobs: RefLogprobs | None = None  # reference log-probs it computed (reused by the KL term)


@dataclasses.dataclass(frozen=True)
class RewardEnv:
    """What a reward may use besides the items and generations."""

    config: TrainConfig  # the training config (``rl.reward``, ``rl.verifier_mode``, a method's section: ``icpo``)
    group_size: int  # G: consecutive generations per item
    tokenizer: Any = None  # the policy's tokenizer
    system: str | None = None  # the system prompt of the run
    ref_scorer: Any = None  # the frozen reference model's Scorer (collective under a multi-process mesh)


RewardFn = Callable[[Sequence[Any], Any], RewardOutput]
RewardBuilder = Callable[[RewardEnv], RewardFn]
REWARDS: Registry[RewardBuilder] = Registry("reward", builtins=("jaxrl_mt.rewards.rlsta", "jaxrl_mt.rewards.icpo",
                                                                  "jaxrl_mt.rewards.abstain",
                                                                  "jaxrl_mt.rewards.conversation"))


def register_reward(name: str, *, replace: bool = False) -> Callable[[RewardBuilder], RewardBuilder]:
    """Decorator: registers ``builder(env) -> fn(items, generations) -> RewardOutput`` as ``name``."""
    return REWARDS.register(name, replace=replace)


def reward_names() -> tuple[str, ...]:
    """Names of the registered rewards, sorted (the built-ins included)."""
    return REWARDS.names()


def make_reward(name: str, env: RewardEnv) -> RewardFn:
    """The reward function ``name`` built for ``env``.

    Raises:
      KeyError: an unknown name; the message lists the registered ones.
    """
    return REWARDS.get(name)(env)


def check_output(out: RewardOutput, n: int, name: str = "reward") -> RewardOutput:
    """Checks the shapes of a reward's output for n generations (a plug-in's mistake named at once).

    Raises:
      ValueError: rewards, a component or a column of the wrong length, or a non-finite reward.
    """
    rewards = np.asarray(out.rewards, np.float64)
    if rewards.shape != (n,):
        raise ValueError(f"{name}: rewards have shape {rewards.shape}, expected ({n},)")
    if not np.all(np.isfinite(rewards)):
        raise ValueError(f"{name}: non-finite rewards {rewards[~np.isfinite(rewards)][:4].tolist()}")
    for k, v in out.columns.items():
        if len(v) != n:
            raise ValueError(f"{name}: column {k!r} has {len(v)} rows, expected {n}")
    ref = out.ref_logprobs
    if ref is not None and not len(ref.contexts) == len(ref.completions) == len(ref.logprobs) == n:
        raise ValueError(f"{name}: ref_logprobs have {len(ref.logprobs)} rows, expected {n}")
    return RewardOutput(rewards, {k: np.asarray(v, np.float64) for k, v in out.components.items()},
                        dict(out.columns), ref)


def group_rows(items: Sequence[Any], group_size: int) -> list[Any]:
    """Each item repeated G times: the item of every generation row."""
    return [it for it in items for _ in range(group_size)]
