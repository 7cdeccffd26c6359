"""What the trained parameters are: the whole policy (full fine-tuning) or LoRA adapters on frozen base weights.

With ``lora.rank > 0`` the train state holds only the adapters (and their optimizer state); the
policy is ``merge(base, adapters)``, rebuilt after each optimizer step for sampling and scoring;
the loss differentiates the adapters through the unmerged forward x W + s (x A) B (``attach``;
``lora.forward = "merged"``: through the merge, which holds a full-size weight gradient); the
frozen reference model of the anchor reward, the KL term and DPO is the base itself (no second
copy of the weights).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax

from jaxrl_mt.models.lora import LoraConfig, attach, init_adapters, merge
from jaxrl_mt.rl.run_config import TrainConfig
from jaxrl_mt.rl.step import LossConfig

__all__ = ["Trainable", "lora_config", "lora_forward"]

_merge = jax.jit(merge, static_argnums=2)


def lora_config(c: TrainConfig) -> LoraConfig | None:
    """The run's LoRA settings (``lora.rank``, ``lora.alpha``, ``lora.targets``), None for full fine-tuning."""
    lo = c.lora
    if lo is None or lo.rank == 0:
        return None
    return LoraConfig(rank=lo.rank, alpha=lo.alpha, targets=lo.targets)


def lora_forward(c: TrainConfig) -> str:
    """The loss's adapter forward, ``lora.forward``: "unmerged" (default) or "merged"."""
    return c.lora.forward if c.lora is not None else "unmerged"


@dataclasses.dataclass(frozen=True)
class Trainable:
    """The trained parameters' relation to the policy."""

    base: Any = None  # the frozen base parameters (LoRA), else None
    lora: LoraConfig | None = None
    forward: str = "unmerged"  # the loss's adapter forward: "unmerged" (attach) or "merged"

    def __post_init__(self) -> None:
        if self.forward not in ("unmerged", "merged"):
            raise ValueError(f"lora.forward must be 'unmerged' or 'merged', got {self.forward!r}")

    def initial(self, params: Any, seed: int) -> Any:
        """The trained parameters at step 0: ``params`` itself, or fresh adapters (B = 0) on it."""
        return params if self.lora is None else init_adapters(params, self.lora, jax.random.key(seed))

    def policy(self, trained: Any) -> Any:
        """The policy's parameters (merged weights under LoRA)."""
        return trained if self.lora is None else _merge(self.base, trained, self.lora.scale)

    def loss(self, loss: Callable[..., Any]) -> Callable[..., Any]:
        """``loss(params, cfg, lc, batch)`` of the policy as one of the trained parameters; under LoRA
        the batch is ``(base, batch)`` (see :meth:`batch`), so the base is an argument, not a constant."""
        if self.lora is None:
            return loss
        combine = attach if self.forward == "unmerged" else merge
        return functools.partial(_adapted_loss, loss=loss, scale=self.lora.scale, combine=combine)

    def batch(self, batch: Any) -> Any:
        """The step's batch argument: ``batch``, or ``(base, batch)`` under LoRA."""
        return batch if self.lora is None else (self.base, batch)


def _adapted_loss(adapters: Any, cfg: Any, lc: LossConfig, base_and_batch: tuple[Any, Any], *,
                  loss: Callable[..., Any], scale: float, combine: Callable[..., Any]) -> Any:
    base, batch = base_and_batch
    return loss(combine(base, adapters, scale), cfg, lc, batch)
