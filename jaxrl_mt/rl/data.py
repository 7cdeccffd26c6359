"""Training data and config checks of the loop: sources -> scenarios (RLSTA, GRPO) or items (ICPO).

Everything here runs before any model is loaded, so a bad config or an empty dataset fails at
start-up with one line (``ConfigError``). The recipe interface, the method registry and
``ConfigError`` itself live in :mod:`jaxrl_mt.rl.recipe`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl_mt.checkpointing import check_writable
from jaxrl_mt.data.loaders import load_source
from jaxrl_mt.data.records import DataError, Scenario
from jaxrl_mt.data.scenarios import build_scenario
from jaxrl_mt.models.attention import IMPLS as ATTENTION_IMPLS
from jaxrl_mt.models.registry import attention_env_problem
from jaxrl_mt.models.lora import TARGETS as LORA_TARGETS
from jaxrl_mt.rewards.registry import reward_names
from jaxrl_mt.rewards.rlsta import verifier_weight
from jaxrl_mt.rl.config_checks import run_field_checks
from jaxrl_mt.rl.cov import cov_checks
from jaxrl_mt.rl.grpo import KL_ESTIMATORS, LOSS_TYPES
from jaxrl_mt.rl.recipe import METHODS, ConfigError, is_supervised


def reward_name(c: Any) -> str:
    """The reward a config trains with: its ``reward`` field, or the method's own when empty or absent."""
    name = c.get("reward", "") if hasattr(c, "get") else getattr(c, "reward", "")
    return name or c.method


REMAT_CHOICES = (False, True, "dots", "auto")


# ----------------------------------------------------------------------------- config checks


def _targets_check(lo: Any) -> tuple[bool, str]:
    """``lora.targets`` is a regular expression, matching a projection when LoRA is on (rank > 0)."""
    try:
        pattern = re.compile(lo.targets)
    except (re.error, TypeError) as e:
        return False, f"lora.targets {lo.targets!r} is not a regular expression ({e})"
    return (lo.rank == 0 or any(pattern.fullmatch(k) for k in LORA_TARGETS),
            f"lora.targets {lo.targets!r} matches none of {', '.join(LORA_TARGETS)}")


def validate_config(c: Any) -> None:
    """Fails fast on values that cannot work (keys are checked by the locked ConfigDict)."""
    rl = c.rl
    checks = [*run_field_checks(c), *cov_checks(rl),
        (rl.alpha >= 0, f"rl.alpha must be >= 0, got {rl.alpha}"),
        (rl.group_size >= 2, f"rl.group_size (G) must be >= 2 for group-relative advantages, got {rl.group_size}"),
        (rl.batch_size >= 1, f"rl.batch_size must be >= 1, got {rl.batch_size}"),
        (rl.steps >= 1, f"rl.steps must be >= 1, got {rl.steps}"),
        (rl.mu >= 1, f"rl.mu must be >= 1, got {rl.mu}"),
        (rl.grad_accum >= 1 and (rl.batch_size * rl.group_size) % rl.grad_accum == 0,
         f"rl.grad_accum ({rl.grad_accum}) must divide batch_size * group_size ({rl.batch_size * rl.group_size})"),
        (rl.lr > 0, f"rl.lr must be > 0, got {rl.lr}"),
        (rl.beta >= 0, f"rl.beta must be >= 0, got {rl.beta}"),
        (rl.kl_estimator in KL_ESTIMATORS, f"rl.kl_estimator must be one of {KL_ESTIMATORS}, got {rl.kl_estimator!r}"),
        (rl.loss_type in LOSS_TYPES, f"rl.loss_type must be one of {LOSS_TYPES}, got {rl.loss_type!r}"),
        (rl.verifier_mode in ("strict", "lenient"),
         f"rl.verifier_mode must be strict|lenient, got {rl.verifier_mode!r}"),
        (verifier_weight(rl) >= 0, f"rl.verifier_weight must be >= 0, got {verifier_weight(rl)}"),
        (verifier_weight(rl) > 0 or not rl.zero_anchor_for_wrong,
         "rl.zero_anchor_for_wrong needs the verifier's verdicts: set it False with rl.verifier_weight = 0"),
        (rl.anchor_prompt in ("full", "merged"), f"rl.anchor_prompt must be full|merged, got {rl.anchor_prompt!r}"),
        (rl.temperature > 0, f"rl.temperature must be > 0 for GRPO rollouts, got {rl.temperature}"),
        (rl.max_new_tokens >= 1, f"rl.max_new_tokens must be >= 1, got {rl.max_new_tokens}"),
        (rl.remat in REMAT_CHOICES,
         f"rl.remat must be one of {REMAT_CHOICES}, got {rl.remat!r}"),
        (c.data.add_source or c.data.refine_source, "no data: set data.add_source and/or data.refine_source"),
        (c.method in METHODS, f"method must be one of {METHODS.names()}, got {c.method!r}"),
        (is_supervised(c.method) or reward_name(c) in reward_names(),
         f"reward must be one of {reward_names()}, got {reward_name(c)!r}"),
    ]
    if c.method == "icpo":
        r = c.icpo.underspecified_ratio
        checks.append((0.0 <= r <= 1.0, f"icpo.underspecified_ratio must be in [0, 1], got {r}"))
    checks.append((getattr(c, "attention", "auto") in ATTENTION_IMPLS,
                   f"attention must be one of {ATTENTION_IMPLS}, got {getattr(c, 'attention', None)!r}"))
    checks.append((not attention_env_problem(), attention_env_problem()))
    lo = getattr(c, "lora", None)
    if lo is not None:
        checks.append((lo.rank >= 0, f"lora.rank must be >= 0, got {lo.rank}"))
        checks.append((lo.rank == 0 or lo.alpha > 0, f"lora.alpha must be > 0, got {lo.alpha}"))
        checks.append(_targets_check(lo))
        checks.append((getattr(lo, "forward", "unmerged") in ("unmerged", "merged"),
                       f"lora.forward must be 'unmerged' or 'merged', got {getattr(lo, 'forward', None)!r}"))
    if is_supervised(c.method):
        sec = getattr(c, c.method, None)
        checks.append((sec is not None, f"method {c.method!r} needs its config section {c.method!r} "
                                        f"(configs/{c.method}.py)"))
        if sec is not None:
            checks.append((0.0 <= sec.val_fraction < 1.0,
                           f"{c.method}.val_fraction must be in [0, 1), got {sec.val_fraction}"))
        checks.append((rl.batch_size % rl.grad_accum == 0,
                       f"rl.grad_accum ({rl.grad_accum}) must divide rl.batch_size ({rl.batch_size})"))
    if c.method == "rlaar":
        r = getattr(c, "rlaar", None)
        checks.append((r is not None, "method 'rlaar' needs its config section 'rlaar' (configs/rlaar.py)"))
        if r is not None:
            checks.append((r.max_shards >= 1, f"rlaar.max_shards must be >= 1, got {r.max_shards}"))
            checks.append((0.0 <= r.unsolvable_fraction <= 1.0,
                           f"rlaar.unsolvable_fraction must be in [0, 1], got {r.unsolvable_fraction}"))
    if c.method == "dpo" and getattr(c, "dpo", None) is not None:
        checks.append((c.dpo.beta > 0, f"dpo.beta must be > 0, got {c.dpo.beta}"))
        checks.append((0.0 <= c.dpo.label_smoothing < 0.5,
                       f"dpo.label_smoothing must be in [0, 0.5), got {c.dpo.label_smoothing}"))
    for ok, msg in checks:
        if not ok:
            raise ConfigError(msg)
    wd = Path(c.workdir)
    try:
        check_writable(wd)  # a uniquely named probe: every process of a multi-host run checks at once
    except OSError as e:
        cause = e.__cause__ or e
        why = getattr(cause, "strerror", None) or cause
        raise ConfigError(f"workdir {str(wd)!r} is not writable ({why})") from None


def config_to_dict(c: Any) -> dict[str, Any]:
    return json.loads(c.to_json()) if hasattr(c, "to_json") else dict(c)


# ----------------------------------------------------------------------------- data


def load_tasks(specs: str, data: Any, *, max_turns: int = 0, require_each: bool = False) -> list[Any]:
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


def load_scenarios(c: Any) -> tuple[list[Scenario], list[Scenario]]:
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
