"""Optimizer and learning-rate schedule for RL fine-tuning (optax).

``make_optimizer`` builds ``clip_by_global_norm -> adamw(schedule)``, wrapped in
``optax.MultiSteps`` for gradient accumulation. MultiSteps averages the gradients of the
``grad_accum_steps`` micro-batches and applies the inner optimizer once, so clipping and the
schedule act on the accumulated gradient and count optimizer updates, not micro-batches
(the same as torch/TRL with ``gradient_accumulation_steps``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import optax

if TYPE_CHECKING:
    from jaxrl_mt.rl.run_config import RLSection

SCHEDULES = ("constant", "cosine", "linear")


def make_schedule(
    lr: float,
    *,
    schedule: str = "constant",
    warmup_steps: int = 0,
    total_steps: int = 1,
) -> optax.Schedule:
    """Learning rate as a function of the optimizer update count.

    All schedules warm up linearly from 0 to ``lr`` over ``warmup_steps`` updates (as
    transformers' ``get_*_schedule_with_warmup``), then:
    ``constant`` stays at ``lr``; ``linear`` decays linearly to 0 at ``total_steps``;
    ``cosine`` decays as ``lr * (1 + cos(pi * (s - warmup) / (total - warmup))) / 2`` to 0 at
    ``total_steps``. Past ``total_steps`` the decaying schedules stay at 0.

    Args:
      lr: peak learning rate.
      schedule: ``"constant"``, ``"cosine"`` or ``"linear"``.
      warmup_steps: number of linear warmup updates (0: none).
      total_steps: total number of updates, warmup included (used by the decaying schedules).

    Returns:
      An ``optax.Schedule``.

    Raises:
      ValueError: for an unknown schedule or inconsistent step counts.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"make_schedule: unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
    if warmup_steps < 0:
        raise ValueError(f"make_schedule: warmup_steps={warmup_steps} must be >= 0")
    if schedule != "constant" and total_steps <= warmup_steps:
        raise ValueError(
            f"make_schedule: total_steps={total_steps} must exceed warmup_steps={warmup_steps} "
            f"for schedule {schedule!r}"
        )
    if schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=lr, warmup_steps=warmup_steps, decay_steps=total_steps, end_value=0.0
        )
    if schedule == "linear":
        after = optax.linear_schedule(lr, 0.0, transition_steps=total_steps - warmup_steps)
    else:
        after = optax.constant_schedule(lr)
    if warmup_steps == 0:
        return after
    warmup = optax.linear_schedule(0.0, lr, transition_steps=warmup_steps)
    return optax.join_schedules([warmup, after], boundaries=[warmup_steps])


def make_optimizer(
    lr: float,
    *,
    schedule: str = "constant",
    warmup_steps: int = 0,
    total_steps: int = 1,
    weight_decay: float = 0.0,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    max_grad_norm: float | None = 1.0,
    grad_accum_steps: int = 1,
    weight_decay_mask: Any | Callable[[Any], Any] | None = None,
) -> optax.GradientTransformation:
    """AdamW with global-norm clipping, a warmup/decay schedule and gradient accumulation.

    Args:
      lr: peak learning rate.
      schedule: see :func:`make_schedule`.
      warmup_steps: see :func:`make_schedule`.
      total_steps: see :func:`make_schedule` (optimizer updates, not micro-batches).
      weight_decay: decoupled weight decay (multiplied by the scheduled learning rate, as optax).
      b1: Adam's first-moment decay.
      b2: Adam's second-moment decay.
      eps: Adam's epsilon (added outside the square root).
      max_grad_norm: clip the (accumulated) gradient to this global L2 norm; ``None``: no clip.
      grad_accum_steps: micro-batches per update; > 1 wraps the chain in ``optax.MultiSteps``,
        which returns zero updates on the intermediate micro-steps.
      weight_decay_mask: optional pytree of bools (or a function of params returning one) that
        selects the leaves to decay, passed to ``optax.adamw``; ``None`` decays every leaf.

    Returns:
      An ``optax.GradientTransformation``.

    Raises:
      ValueError: for a bad schedule, ``grad_accum_steps < 1`` or ``max_grad_norm <= 0``.
    """
    if grad_accum_steps < 1:
        raise ValueError(f"make_optimizer: grad_accum_steps={grad_accum_steps} must be >= 1")
    if max_grad_norm is not None and max_grad_norm <= 0:
        raise ValueError(f"make_optimizer: max_grad_norm={max_grad_norm} must be > 0 or None")
    learning_rate = make_schedule(lr, schedule=schedule, warmup_steps=warmup_steps, total_steps=total_steps)
    parts = []
    if max_grad_norm is not None:
        parts.append(optax.clip_by_global_norm(max_grad_norm))
    parts.append(
        optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=weight_decay_mask)
    )
    tx = optax.chain(*parts)
    if grad_accum_steps > 1:
        tx = optax.MultiSteps(tx, every_k_schedule=grad_accum_steps).gradient_transformation()
    return tx


def optimizer_from_config(rl: RLSection) -> optax.GradientTransformation:
    """The optimizer of a training config's ``rl`` section (its ``optim``, ``steps`` and ``grad_accum``):
    the one place a run's optimizer is built (the loop, and ``load_policy`` to restore a checkpoint's
    optimizer state; a stored ``config.json`` through ``run_config.typed_config``)."""
    o = rl.optim
    return make_optimizer(o.lr, schedule=o.schedule, warmup_steps=o.warmup_steps, total_steps=rl.steps,
                          weight_decay=o.weight_decay, max_grad_norm=o.max_grad_norm or None,
                          grad_accum_steps=rl.grad_accum)
