"""The typed training config: the schema of configs/rlsta.py (and its variants) as frozen dataclasses.

A config file stays an ml_collections file (presets, command-line overrides, a locked key set);
the entry point turns it into a :class:`TrainConfig` once (:func:`typed_config`), which checks
every field's presence and type, and the loop reads only the typed, immutable result. Method
sections (``icpo``, ``sft``, ``dpo``, ``rlaar``) are optional: present in their method's config.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Union

from jaxrl_mt.rl.recipe import ConfigError
from jaxrl_mt.typed_config import build

__all__ = ["TrainConfig", "typed_config"]


@dataclasses.dataclass(frozen=True)
class DataSection:
    add_source: str  # MT-Add problems: comma-separated source specs ("" = none)
    refine_source: str  # MT-Refine problems
    limit: int  # training problems per source (0 = all)
    heldout: int  # problems per source held out for the before/after evaluation
    shuffle_shards: bool  # shuffle MT-Add condition order
    max_turns: int  # skip problems with more user turns (0 = no limit)


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
class RLSection:
    steps: int
    batch_size: int
    group_size: int
    lr: float
    schedule: str
    warmup_steps: int
    weight_decay: float
    max_grad_norm: float
    grad_accum: int
    mu: int
    beta: float
    kl_estimator: str
    epsilon_low: float
    epsilon_high: float
    loss_type: str
    scale_rewards: bool
    temperature: float
    top_p: float
    max_new_tokens: int
    alpha: float
    anchor_prompt: str
    zero_anchor_for_wrong: bool
    verifier_mode: str
    remat: Union[bool, str]
    max_batch: int
    verifier_weight: float = 1.0  # w of R = w R_v + alpha R_s (0: the anchor alone)
    loss_variant: str = "clip"  # "clip" | "clip_cov" | "kl_cov" (rl/cov.py)
    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 2e-3
    ppo_kl_coef: float = 1.0


@dataclasses.dataclass(frozen=True)
class EvalSection:
    max_new_tokens: int
    every: int
    probe_source: str
    probe_limit: int
    probe_kinds: str
    probe_every: int


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
class ICPOSection:
    underspecified_ratio: float
    judge: str


@dataclasses.dataclass(frozen=True)
class SFTSection:
    val_fraction: float  # problems held out for the validation loss (the kept checkpoint's criterion)


@dataclasses.dataclass(frozen=True)
class DPOSection:
    beta: float  # DPO temperature (TRL's default 0.1)
    label_smoothing: float  # conservative DPO (TRL's default 0)
    val_fraction: float


@dataclasses.dataclass(frozen=True)
class RLAARSection:
    max_shards: int  # the curriculum's last count before its random phase (RLAAR: 10)
    unsolvable_fraction: float  # share of a step's samples with their last shard dropped


@dataclasses.dataclass(frozen=True)
class LoraSection:
    rank: int  # 0: full fine-tuning
    alpha: float  # scale alpha / rank
    targets: str  # regex over the layer keys q|k|v|o|gate|up|down
    forward: str = "unmerged"  # the loss's forward: "unmerged" x W + s (x A) B, or "merged" x (W + s A B)


@dataclasses.dataclass(frozen=True)
class ChatSection:
    enable_thinking: Union[bool, None]  # Qwen3-style templates: None = the template's default


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """One training run (configs/rlsta.py documents every field)."""

    method: str
    reward: str
    model: str
    ref_model: str
    workdir: str
    seed: int
    param_dtype: str
    dtype: str
    system_prompt: str
    mesh_shape: str
    allow_config_changes: str
    export: bool
    data: DataSection
    history: HistorySection
    filter: FilterSection
    rl: RLSection
    eval: EvalSection
    log: LogSection
    checkpoint: CheckpointSection
    icpo: ICPOSection | None = None
    attention: str = "auto"  # models.attention.IMPLS
    sft: SFTSection | None = None
    dpo: DPOSection | None = None
    rlaar: RLAARSection | None = None
    lora: LoraSection | None = None
    chat: ChatSection | None = None

    def get(self, name: str, default: Any = None) -> Any:
        """A field by name, ``default`` when absent (the ConfigDict reading some code shares)."""
        return getattr(self, name, default)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (``config.json``; absent method sections left out)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


def typed_config(c: Any) -> TrainConfig:
    """The typed, frozen config of a ConfigDict, a dict or a TrainConfig (returned as is).

    Raises:
      ConfigError: a missing field, an unknown field or a value of the wrong type, named by its
        dotted path.
    """
    if isinstance(c, TrainConfig):
        return c
    raw = json.loads(c.to_json()) if hasattr(c, "to_json") else dict(c)
    return build(TrainConfig, raw, "", ConfigError)
