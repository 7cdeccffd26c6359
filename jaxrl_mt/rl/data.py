"""Training data and config checks of the loop: sources -> scenarios (RLSTA, GRPO) or items (ICPO).

Everything here runs before any model is loaded, so a bad config or an empty dataset fails at
start-up with one line (``ConfigError``, :mod:`jaxrl_mt.rl.run_config`'s). The recipe interface and
the method registry live in :mod:`jaxrl_mt.rl.recipe`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl_mt.checkpointing import check_writable
from jaxrl_mt.data.loaders import load_source
from jaxrl_mt.data.records import DataError, Scenario
from jaxrl_mt.data.scenarios import build_scenario
from jaxrl_mt.models.registry import attention_env_problem
from jaxrl_mt.rewards.registry import reward_names
from jaxrl_mt.rl.recipe import METHODS, ConfigError, is_supervised
from jaxrl_mt.rl.run_config import RL_GROUPS, ROLLOUT_GROUPS, ConfigLike, DataSection, TrainConfig, typed_config


# ----------------------------------------------------------------------------- config checks


def is_rollout_method(method: str) -> bool:
    """Whether a registered method samples rollouts (GRPO's family: ``rl.rollout``, ``rl.loss``, ``rl.reward``)."""
    return method in METHODS and not is_supervised(method)


def _raise_first(checks: list[tuple[object, str]]) -> None:
    for ok, msg in checks:
        if not ok:
            raise ConfigError(msg)


def validate_config(c: ConfigLike) -> TrainConfig:
    """The typed config (``run_config.typed_config``), failing fast on values that cannot work: the
    method's sections (SFT and DPO have no rollout keys, the rollout methods need them), every
    section's own checks (``TrainConfig.check``), then what depends on the registries and the host
    (the reward's name, the attention override, the workdir).

    Raises:
      ConfigError: one line naming the field.
    """
    c = typed_config(c)
    rollout = is_rollout_method(c.method)
    has = [g for g in ROLLOUT_GROUPS if getattr(c.rl, g) is not None]
    keys = ", ".join(f"rl.{f.name}" for g in has for f in dataclasses.fields(RL_GROUPS[g]))
    need = ", ".join(f"rl.{f.name}" for g in ROLLOUT_GROUPS if g not in has for f in dataclasses.fields(RL_GROUPS[g])
                     if f.default is dataclasses.MISSING)
    checks = [(c.method in METHODS, f"method must be one of {METHODS.names()}, got {c.method!r}"),
              (not rollout or not need, f"method {c.method!r} samples rollouts: its config needs {need} "
                                        "(configs/rlsta.py)"),
              (rollout or not has, f"method {c.method!r} trains on fixed targets: {keys} are settings of the "
                                   f"rollout methods, not of configs/{c.method}.py")]
    _raise_first(checks)
    c.check()
    checks = [(not rollout or c.reward_name in reward_names(),
               f"reward must be one of {reward_names()}, got {c.reward_name!r}"),
              (not attention_env_problem(), attention_env_problem())]
    _raise_first(checks)
    wd = Path(c.workdir)
    try:
        check_writable(wd)  # a uniquely named probe: every process of a multi-host run checks at once
    except OSError as e:
        cause = e.__cause__ or e
        why = getattr(cause, "strerror", None) or cause
        raise ConfigError(f"workdir {str(wd)!r} is not writable ({why})") from None
    return c


# ----------------------------------------------------------------------------- data


def load_tasks(specs: str, data: DataSection, *, max_turns: int = 0, require_each: bool = False) -> list[Any]:
    """Tasks with at least one condition from comma-separated source specs.

    Keeps at most `data.limit + data.heldout` per source (all when `data.limit` is 0) and, when
    `max_turns` is set, only problems of at most that many user turns (target + conditions).
    A bad source, or (with `require_each`) a source left empty, is a ConfigError.
    """
    tasks: list[Any] = []
    for spec in [s.strip() for s in specs.split(",") if s.strip()]:
        try:
            got = load_source(spec)
        except (DataError, OSError) as e:
            raise ConfigError(f"data source {spec!r}: {e}") from None
        got = [t for t in got if t.conditions and (not max_turns or len(t.conditions) + 1 <= max_turns)]
        if require_each and not got:
            raise ConfigError(f"empty dataset: source {spec!r} gave no usable problems")
        tasks += got[: data.limit + data.heldout] if data.limit else got
    return tasks


def load_scenarios(c: TrainConfig) -> tuple[list[Scenario], list[Scenario]]:
    """Training and held-out scenarios (MT-Add from add_source, MT-Refine from refine_source)."""
    train: list[Scenario] = []
    held: list[Scenario] = []
    for specs, kind in ((c.data.add_source, "sharded"), (c.data.refine_source, "mt_refine")):
        if not specs:
            continue
        tasks = load_tasks(specs, c.data, max_turns=c.data.max_turns, require_each=True)
        scen = []
        for t in tasks:
            try:
                scen.append(build_scenario(t, kind, seed=c.seed, shuffle=c.data.shuffle_shards))
            except DataError:
                continue  # e.g. an MT-Refine problem with no number to correct
        rng = np.random.default_rng(c.seed)
        scen = [scen[i] for i in rng.permutation(len(scen))]  # mix sources before the held-out split
        n_held = min(c.data.heldout, max(len(scen) - 1, 0))
        held += scen[len(scen) - n_held:]
        train += scen[: len(scen) - n_held]
    if not train:
        raise ConfigError("empty dataset: no training scenarios after the held-out split")
    return train, held
