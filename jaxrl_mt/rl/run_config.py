"""The typed training config: the schema of configs/rlsta.py (and its variants) as frozen dataclasses.

A config file stays an ml_collections file (presets, command-line overrides, a locked key set);
the entry point turns it into a :class:`TrainConfig` once (:func:`typed_config`), which checks
every field's presence and type, and the loop reads only the typed, immutable result.

The file's ``rl`` keys stay one flat group (``--config.rl.lr``, ``--config.rl.group_size``); below
the entry point they are split into sections (:func:`rl_section`, the one place that maps them):
``rl.optim`` (every method), and ``rl.rollout``, ``rl.loss``, ``rl.reward``, each present when the
file has its keys (the rollout methods, GRPO's family; SFT's and DPO's config files have none, and
``rl.data.validate_config`` refuses a method without the sections it needs or with ones it never
reads). Method sections (``icpo``, ``sft``, ``dpo``, ``rlaar``, ``rlsta_conv``; ``rl.method_sections``) are present in
their method's config only. Every section checks its values itself (``check()``, run by :meth:`TrainConfig.check`).
``config.json`` is written in the file's layout (:meth:`TrainConfig.to_dict`) and loads back with
:func:`typed_config`, also one written before a field existed (the field's default).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping, Union

from ml_collections import ConfigDict

from jaxrl_mt.models.attention import IMPLS as ATTENTION_IMPLS
from jaxrl_mt.models.lora import TARGETS as LORA_TARGETS
from jaxrl_mt.rl.config_checks import ConfigError, field_checks
from jaxrl_mt.rl.config_checks import require as _require
from jaxrl_mt.rl.cov import LOSS_VARIANTS
from jaxrl_mt.rl.grpo import KL_ESTIMATORS, LOSS_TYPES
from jaxrl_mt.rl.method_sections import ConvSection, DPOSection, ICPOSection, RLAARSection, SFTSection
from jaxrl_mt.typed_config import build

__all__ = ["REMAT_CHOICES", "RL_GROUPS", "ROLLOUT_GROUPS", "ROLLOUT_KEYS", "ConfigError", "ConfigLike", "LossSection",
           "OptimSection", "RLSection", "RewardSection", "RolloutSection", "TrainConfig", "rl_section", "typed_config",
           "ConvSection", "DPOSection", "ICPOSection", "RLAARSection", "SFTSection"]

REMAT_CHOICES = (False, True, "dots", "auto")


@dataclasses.dataclass(frozen=True)
class DataSection:
    add_source: str  # MT-Add problems: comma-separated source specs ("" = none)
    refine_source: str  # MT-Refine problems
    limit: int  # training problems per source (0 = all)
    heldout: int  # problems per source held out for the before/after evaluation
    shuffle_shards: bool  # shuffle MT-Add condition order
    max_turns: int  # skip problems with more user turns (0 = no limit)

    def check(self) -> None:
        _require((self.add_source or self.refine_source, "no data: set data.add_source and/or data.refine_source"))


@dataclasses.dataclass(frozen=True)
class HistorySection:
    temperature: float
    max_new_tokens: int


@dataclasses.dataclass(frozen=True)
class FilterSection:
    enabled: bool
    k: int
    cap_per_problem: int
    temperature: float


@dataclasses.dataclass(frozen=True)
class OptimSection:
    """The optimizer of every method (``rl.optim.make_optimizer``): AdamW, a schedule, clipping."""

    lr: float  # peak learning rate
    schedule: str  # "constant" | "cosine" | "linear"
    warmup_steps: int
    weight_decay: float
    max_grad_norm: float  # 0: no clipping

    def check(self) -> None:
        _require((self.lr > 0, f"rl.lr must be > 0, got {self.lr}"))


@dataclasses.dataclass(frozen=True)
class RolloutSection:
    """The rollouts of GRPO's family: G completions per prompt, sampled."""

    group_size: int  # G
    temperature: float
    top_p: float

    def check(self) -> None:
        _require((self.group_size >= 2,
                  f"rl.group_size (G) must be >= 2 for group-relative advantages, got {self.group_size}"),
                 (self.temperature > 0, f"rl.temperature must be > 0 for GRPO rollouts, got {self.temperature}"))


@dataclasses.dataclass(frozen=True)
class LossSection:
    """GRPO's loss (``rl.grpo``): advantages, the clipped ratio, the KL term, the Cov variants (``rl.cov``)."""

    mu: int  # inner iterations per rollout batch
    beta: float  # KL coefficient
    kl_estimator: str
    epsilon_low: float
    epsilon_high: float
    loss_type: str
    scale_rewards: bool  # divide advantages by the group std
    loss_variant: str = "clip"  # "clip" | "clip_cov" | "kl_cov" (rl/cov.py)
    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 2e-3
    ppo_kl_coef: float = 1.0

    def check(self) -> None:
        _require((self.mu >= 1, f"rl.mu must be >= 1, got {self.mu}"),
                 (self.beta >= 0, f"rl.beta must be >= 0, got {self.beta}"),
                 (self.kl_estimator in KL_ESTIMATORS,
                  f"rl.kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}"),
                 (self.loss_type in LOSS_TYPES, f"rl.loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}"),
                 (self.loss_variant in LOSS_VARIANTS,
                  f"rl.loss_variant must be one of {LOSS_VARIANTS}, got {self.loss_variant!r}"),
                 (0 < self.clip_cov_ratio <= 1, f"rl.clip_cov_ratio must be in (0, 1], got {self.clip_cov_ratio}"),
                 (self.clip_cov_lb < self.clip_cov_ub,
                  f"rl.clip_cov_lb ({self.clip_cov_lb}) must be < rl.clip_cov_ub ({self.clip_cov_ub})"),
                 (0 < self.kl_cov_ratio <= 1, f"rl.kl_cov_ratio must be in (0, 1], got {self.kl_cov_ratio}"),
                 (self.ppo_kl_coef >= 0, f"rl.ppo_kl_coef must be >= 0, got {self.ppo_kl_coef}"))


@dataclasses.dataclass(frozen=True)
class RewardSection:
    """The reward's weights (``rewards.rlsta``): R = w R_v + alpha R_s."""

    alpha: float  # weight of the anchor reward R_s
    anchor_prompt: str  # "full" | "merged"
    zero_anchor_for_wrong: bool
    verifier_weight: float = 1.0  # w (0: the anchor alone)

    def check(self) -> None:
        w = self.verifier_weight
        _require((self.alpha >= 0, f"rl.alpha must be >= 0, got {self.alpha}"),
                 (w >= 0, f"rl.verifier_weight must be >= 0, got {w}"),
                 (w > 0 or not self.zero_anchor_for_wrong,
                  "rl.zero_anchor_for_wrong needs the verifier's verdicts: set it False with rl.verifier_weight = 0"),
                 (self.anchor_prompt in ("full", "merged"),
                  f"rl.anchor_prompt must be full|merged, got {self.anchor_prompt!r}"))


@dataclasses.dataclass(frozen=True)
class RLSection:
    """The training steps: what every method has, and the sections of the rollout methods."""

    steps: int  # optimizer steps
    batch_size: int  # prompts (rollouts) or rows (fixed targets) per step
    grad_accum: int  # micro-batches per step
    remat: Union[bool, str]
    max_batch: int  # the sampler's rows per call
    max_new_tokens: int  # the reply budget of the policy's samples (rollouts, filter, SFT/DPO targets)
    verifier_mode: str  # how answers are judged (rewards, filter, SFT/DPO targets): "strict" | "lenient"
    optim: OptimSection
    rollout: RolloutSection | None = None  # rollout methods only (not SFT, DPO)
    loss: LossSection | None = None
    reward: RewardSection | None = None

    @property
    def rows(self) -> int:
        """Rows of a step: ``batch_size`` x G with rollouts, ``batch_size`` with fixed targets."""
        return self.batch_size * (self.rollout.group_size if self.rollout is not None else 1)

    def check(self) -> None:
        what = "batch_size * group_size" if self.rollout is not None else "rl.batch_size"
        _require((self.batch_size >= 1, f"rl.batch_size must be >= 1, got {self.batch_size}"),
                 (self.steps >= 1, f"rl.steps must be >= 1, got {self.steps}"),
                 (self.grad_accum >= 1 and self.rows % self.grad_accum == 0,
                  f"rl.grad_accum ({self.grad_accum}) must divide {what} ({self.rows})"),
                 (self.verifier_mode in ("strict", "lenient"),
                  f"rl.verifier_mode must be strict|lenient, got {self.verifier_mode!r}"),
                 (self.max_new_tokens >= 1, f"rl.max_new_tokens must be >= 1, got {self.max_new_tokens}"),
                 (self.remat in REMAT_CHOICES, f"rl.remat must be one of {REMAT_CHOICES}, got {self.remat!r}"))
        for sec in (self.optim, self.rollout, self.loss, self.reward):
            if sec is not None:
                sec.check()


# the sections of ``rl`` the config file's flat keys go to (the keys of RLSection's own fields stay)
RL_GROUPS: dict[str, type] = {"optim": OptimSection, "rollout": RolloutSection, "loss": LossSection,
                              "reward": RewardSection}
ROLLOUT_GROUPS = ("rollout", "loss", "reward")  # the rollout methods' sections (none in SFT's and DPO's)
_GROUP_OF = {f.name: g for g, cls in RL_GROUPS.items() for f in dataclasses.fields(cls)}
# the config file's rl keys of the rollout sections: a method without rollouts (configs/sft.py, dpo.py) deletes them
ROLLOUT_KEYS = tuple(f.name for g in ROLLOUT_GROUPS for f in dataclasses.fields(RL_GROUPS[g]))


def rl_section(flat: Mapping[str, Any]) -> RLSection:
    """The typed ``rl`` of the config file's flat ``rl`` keys: each key to its section.

    ``optim`` is always built; ``rollout``, ``loss`` and ``reward`` when the file has any of their keys
    (then every key without a default is required).

    Raises:
      ConfigError: an unknown, missing or mistyped key, named ``rl.KEY`` as in the file.
    """
    own: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = {g: {} for g in RL_GROUPS}
    for k, v in flat.items():
        if k in RL_GROUPS:
            raise ConfigError(f"unknown config field(s) rl.{k}")
        if k in _GROUP_OF:
            groups[_GROUP_OF[k]][k] = v
        else:
            own[k] = v
    for g, cls in RL_GROUPS.items():
        if g == "optim" or groups[g]:
            own[g] = build(cls, groups[g], "rl.", ConfigError)
    return build(RLSection, own, "rl.", ConfigError)


@dataclasses.dataclass(frozen=True)
class EvalSection:
    max_new_tokens: int
    every: int
    probe_source: str
    probe_limit: int
    probe_kinds: str
    probe_every: int
    # the kept and exported checkpoint: "METRIC:min|max" over the held-out metrics and the probe's
    # (e.g. "probe/multi_turn_strict:max"); "" = the method's own (SFT / DPO: the lowest validation loss)
    select: str = ""

    def check(self) -> None:
        if not self.select:
            return
        metric, mode = self.selection()
        _require((bool(metric) and mode in ("min", "max"),
                  f"eval.select must be 'METRIC:min' or 'METRIC:max', got {self.select!r}"),
                 (not metric.startswith("probe/") or bool(self.probe_source),
                  f"eval.select {self.select!r} reads the probe, but eval.probe_source is empty"))

    def selection(self) -> tuple[str, str] | None:
        """``(metric, mode)`` of ``select``, or None for the method's own."""
        if not self.select:
            return None
        metric, _, mode = self.select.rpartition(":")
        return metric, mode


@dataclasses.dataclass(frozen=True)
class LogSection:
    every: int
    samples_every: int
    n_samples: int


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
    every: int
    keep: int


@dataclasses.dataclass(frozen=True)
class LoraSection:
    rank: int  # 0: full fine-tuning
    alpha: float  # scale alpha / rank
    targets: str  # regex over the layer keys q|k|v|o|gate|up|down
    forward: str = "unmerged"  # the loss's forward: "unmerged" x W + s (x A) B, or "merged" x (W + s A B)

    def check(self) -> None:
        try:
            pattern = re.compile(self.targets)
        except re.error as e:
            raise ConfigError(f"lora.targets {self.targets!r} is not a regular expression ({e})") from None
        _require((self.rank >= 0, f"lora.rank must be >= 0, got {self.rank}"),
                 (self.rank == 0 or self.alpha > 0, f"lora.alpha must be > 0, got {self.alpha}"),
                 (self.rank == 0 or any(pattern.fullmatch(k) for k in LORA_TARGETS),
                  f"lora.targets {self.targets!r} matches none of {', '.join(LORA_TARGETS)}"),
                 (self.forward in ("unmerged", "merged"),
                  f"lora.forward must be 'unmerged' or 'merged', got {self.forward!r}"))


@dataclasses.dataclass(frozen=True)
class ChatSection:
    enable_thinking: Union[bool, None]  # Qwen3-style templates: None = the template's default


METHOD_SECTIONS = ("icpo", "sft", "dpo", "rlaar", "rlsta_conv")  # a method's own section: in its config only


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """One training run (configs/rlsta.py documents every field)."""

    method: str
    reward: str  # the reward's name ("" = the method's own)
    model: str
    ref_model: str
    workdir: str
    seed: int
    param_dtype: str
    dtype: str
    system_prompt: str
    mesh_shape: str
    export: bool
    data: DataSection
    history: HistorySection
    filter: FilterSection
    rl: RLSection
    eval: EvalSection
    log: LogSection
    checkpoint: CheckpointSection
    allow_config_changes: str = ""
    icpo: ICPOSection | None = None
    attention: str = "auto"  # models.attention.IMPLS
    sft: SFTSection | None = None
    dpo: DPOSection | None = None
    rlaar: RLAARSection | None = None
    lora: LoraSection | None = None
    chat: ChatSection | None = None
    rlsta_conv: ConvSection | None = None

    @property
    def reward_name(self) -> str:
        """The reward it trains with: ``reward``, or the method's own when empty."""
        return self.reward or self.method

    def check(self) -> None:
        """Every section's own checks, the method's sections, finite floats and intervals (one line each).

        Raises:
          ConfigError: the first value that cannot work.
        """
        for name in METHOD_SECTIONS:
            has = getattr(self, name) is not None
            _require((has or self.method != name,
                      f"method {name!r} needs its config section {name!r} (configs/{name}.py)"),
                     (not has or self.method == name,
                      f"config section {name!r} is method {name!r}'s; method {self.method!r} has none"))
        _require(*field_checks(self.to_dict()),
                 (self.attention in ATTENTION_IMPLS,
                  f"attention must be one of {ATTENTION_IMPLS}, got {self.attention!r}"))
        for sec in (self.data, self.rl, self.eval, self.icpo, self.sft, self.dpo, self.rlaar, self.lora,
                    self.rlsta_conv):
            if sec is not None:
                sec.check()

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict in the config file's layout (``config.json``; absent sections left out,
        ``rl`` one flat group)."""
        d = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        rl = d["rl"]
        d["rl"] = {k: v for k, v in rl.items() if k not in RL_GROUPS}
        for g in RL_GROUPS:
            d["rl"].update(rl.get(g) or {})
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


# what a stored config.json records of its run beside the config (the attention in force, its environment
# variable: `models.attention.record`); not a field, dropped when the file is read back
RECORDED = "recorded"


def _typed(raw: Mapping[str, Any]) -> TrainConfig:
    raw = dict(raw)
    raw.pop(RECORDED, None)
    if isinstance(raw.get("rl"), Mapping):
        raw["rl"] = rl_section(raw["rl"])
    return build(TrainConfig, raw, "", ConfigError)


# what an entry point passes: the config file's ConfigDict, its dict, or the typed config
ConfigLike = Union[TrainConfig, ConfigDict, Mapping[str, Any]]


def typed_config(c: ConfigLike) -> TrainConfig:
    """The typed, frozen config of a config file's ConfigDict or its dict (a stored ``config.json``;
    a TrainConfig is returned as is). Not checked: :meth:`TrainConfig.check`.

    Raises:
      ConfigError: a missing field, an unknown field or a value of the wrong type, named by its
        dotted path in the file's layout (``rl.lr``).
    """
    if isinstance(c, TrainConfig):
        return c
    return _typed(json.loads(c.to_json()) if isinstance(c, ConfigDict) else c)
