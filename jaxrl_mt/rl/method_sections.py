"""The method sections of the typed training config (``rl.run_config``): present in their method's config only.

``icpo``, ``sft``, ``dpo``, ``rlaar`` and ``rlsta_conv``; each checks its own values (``check()``).
"""

from __future__ import annotations

import dataclasses

from jaxrl_mt.rl.config_checks import require as _require

__all__ = ["ConvSection", "DPOSection", "ICPOSection", "RLAARSection", "SFTSection"]


@dataclasses.dataclass(frozen=True)
class ICPOSection:
    underspecified_ratio: float
    judge: str

    def check(self) -> None:
        r = self.underspecified_ratio
        _require((0.0 <= r <= 1.0, f"icpo.underspecified_ratio must be in [0, 1], got {r}"))


@dataclasses.dataclass(frozen=True)
class SFTSection:
    val_fraction: float  # problems held out for the validation loss (the kept checkpoint's criterion)
    # "history": the correct single-turn response after the multi-turn history (RLSTA's SFT baseline);
    # "solution": single-turn only, the full prompt and the task's worked solution (metadata "solution")
    targets: str = "history"

    def check(self) -> None:
        _require((0.0 <= self.val_fraction < 1.0, f"sft.val_fraction must be in [0, 1), got {self.val_fraction}"),
                 (self.targets in ("history", "solution"),
                  f"sft.targets must be 'history' or 'solution', got {self.targets!r}"))


@dataclasses.dataclass(frozen=True)
class DPOSection:
    beta: float  # DPO temperature (TRL's default 0.1)
    label_smoothing: float  # conservative DPO (TRL's default 0)
    val_fraction: float

    def check(self) -> None:
        _require((0.0 <= self.val_fraction < 1.0, f"dpo.val_fraction must be in [0, 1), got {self.val_fraction}"),
                 (self.beta > 0, f"dpo.beta must be > 0, got {self.beta}"),
                 (0.0 <= self.label_smoothing < 0.5,
                  f"dpo.label_smoothing must be in [0, 0.5), got {self.label_smoothing}"))


@dataclasses.dataclass(frozen=True)
class RLAARSection:
    max_shards: int  # the curriculum's last count before its random phase (RLAAR: 10)
    unsolvable_fraction: float  # share of a step's samples with their last shard dropped

    def check(self) -> None:
        _require((self.max_shards >= 1, f"rlaar.max_shards must be >= 1, got {self.max_shards}"),
                 (0.0 <= self.unsolvable_fraction <= 1.0,
                  f"rlaar.unsolvable_fraction must be in [0, 1], got {self.unsolvable_fraction}"))


@dataclasses.dataclass(frozen=True)
class ConvSection:
    """RL over whole conversations (``method = "rlsta_conv"``, ``rl.conv_recipe``; docs/training.md)."""

    credit: str  # "trajectory" (the conversation's return) | "turn" (reward-to-go per turn index)
    gamma: float  # discount of later turns' rewards
    wrong_penalty: float  # verifier term of a wrong answer attempt
    clarify_weight: float  # credit for a non-answer while shards are still unrevealed
    outcome_weight: float  # the last turn's verifier
    max_turns: int  # assistant turns per conversation at most (0: until the shards are exhausted)
    user: str  # "fixed" | a user-simulator backend spec (eval.user_sim.make_user)
    judge: str  # answer-attempt judge: "rule" | a backend spec
    probe_runs: int  # held-out LiC metrics: conversations per problem and scenario (P, A90, U90-10)
    probe_temperature: float

    def check(self) -> None:
        _require((self.credit in ("trajectory", "turn"),
                  f"rlsta_conv.credit must be 'trajectory' or 'turn', got {self.credit!r}"),
                 (0.0 <= self.gamma <= 1.0, f"rlsta_conv.gamma must be in [0, 1], got {self.gamma}"),
                 (self.max_turns >= 0, f"rlsta_conv.max_turns must be >= 0, got {self.max_turns}"),
                 (self.probe_runs >= 1, f"rlsta_conv.probe_runs must be >= 1, got {self.probe_runs}"))
