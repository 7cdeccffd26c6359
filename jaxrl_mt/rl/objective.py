"""What a training step optimises: an objective is its batch builder and its loss.

Every method trains through the one update of ``rl.loop.Trainer``: an :class:`Objective` builds the
step's batch (GRPO: a rollout of the policy, rewarded; SFT: target rows; DPO: preference pairs),
and the loop slices it into ``rl.grad_accum`` micro-batches of rows (``batch.slice_rows``), puts
each on the mesh (``rl.batch.place``) and runs the objective's compiled step on it (one per
rematerialisation choice, shardings and donation decided once: ``rl.step.make_train_step``).

A batch (``rl.batch.Batch``) is a pytree whose array leaves are rows of the step, with ``rows`` and
``slice_rows(start, n)``. What makes micro-batches add up to the step is the loss's
normaliser, carried by every row: GRPO's ``dapo`` token count, SFT's target-token count
(``num_items``: the step's tokens / ``rl.grad_accum``); DPO's mean over pairs needs none (every
micro-batch holds as many pairs).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from jaxrl_mt.rl.batch import Batch, place
from jaxrl_mt.rl.rollout import RolloutEngine, rollout
from jaxrl_mt.rl.step import LossConfig, loss_fn, micro_seed
from jaxrl_mt.sampling import bucket

__all__ = ["Batch", "Footprint", "GRPOObjective", "Objective", "SupervisedObjective", "place"]

Footprint = tuple[int, int, int, int]  # a micro-batch's (prompts, rows per prompt, prompt length, completion length)
Loss = Callable[[Any, Any, LossConfig, Any], tuple[Any, dict[str, Any]]]


class Objective(abc.ABC):
    """What the steps of a method optimise: how a step's batch is built, and the loss of a micro-batch.

    Attributes:
      passes: passes over a step's batch (GRPO's ``rl.mu``; 1 for fixed targets).
    """

    passes: int = 1

    @abc.abstractmethod
    def batch(self, policy: Callable[[], Any], items: Sequence[Any], step: int
              ) -> tuple[Any, dict[str, float], list[dict]]:
        """The step's batch from its items.

        Args:
          policy: returns the policy's current parameters (called only by a batch that samples).
          items: the step's items (``Recipe.step_items``).
          step: the optimizer steps done before this one.

        Returns:
          ``(batch, metrics, samples)``: the batch (host arrays, this process's rows), the
          builder's metrics (rewards, lengths) and sample-table rows.
        """

    @abc.abstractmethod
    def loss(self, params: Any, cfg: Any, lc: LossConfig, batch: Any) -> tuple[Any, dict[str, Any]]:
        """``(loss, metrics)`` of a micro-batch, jittable; ``metrics`` holds ``loss``."""

    @abc.abstractmethod
    def plan(self, batch: Any) -> tuple[int | str, Footprint]:
        """The memory plan's bucket of a batch (one ``rl.remat`` choice each) and its micro-batch's footprint."""

    def micro(self, batch: Any, *, step: int, inner: int, index: int) -> Any:
        """A placed micro-batch as the loss reads it (default: unchanged).

        Args:
          batch: micro-batch ``index`` of pass ``inner`` of step ``step`` (0-based; steps done before it).
        """
        del step, inner, index
        return batch


@dataclasses.dataclass(frozen=True)
class GRPOObjective(Objective):
    """The GRPO loss (``rl.step.loss_fn``) on a rollout of the policy, rewarded (``rl.rollout.rollout``)."""

    engine: RolloutEngine
    batch_size: int  # prompts per step (``rl.batch_size``)
    seed: int  # the run's seed: Clip-Cov's random token choice per micro-step

    @property
    def passes(self) -> int:  # type: ignore[override]
        """``rl.mu``."""
        return self.engine.mu

    def batch(self, policy: Callable[[], Any], items: Sequence[Any], step: int
              ) -> tuple[Any, dict[str, float], list[dict]]:
        r = rollout(self.engine, policy(), items, step)
        return r.example, r.metrics, r.samples

    def loss(self, params: Any, cfg: Any, lc: LossConfig, batch: Any) -> tuple[Any, dict[str, Any]]:
        return loss_fn(params, cfg, lc, batch)

    def plan(self, batch: Any) -> tuple[int | str, Footprint]:
        """Bucket: the prompt length P; footprint: the configured micro-batch at the longest completions."""
        return batch.prompt_len, self.footprint(batch.prompt_len)

    def footprint(self, prompt_len: int) -> Footprint:
        """A micro-batch of prompt bucket ``prompt_len``: its prompts x rows each (the flat layout repeats
        each prompt), at the completion bucket of ``rl.max_new_tokens``."""
        e = self.engine
        rows, G = self.batch_size * e.group_size // e.grad_accum, e.group_size
        prompts, group = (rows // G, G) if e.grouped else (rows, 1)
        return prompts, group, prompt_len, bucket(e.max_new_tokens, 16)

    def micro(self, batch: Any, *, step: int, inner: int, index: int) -> Any:
        if self.engine.lc.loss_variant == "clip_cov":  # its random token choice: one seed per micro-step
            return batch.replace(seed=micro_seed(self.seed, step, inner, index))
        return batch


class FixedTargets(Protocol):
    """What :class:`SupervisedObjective` reads of a recipe with fixed targets (``rl.recipe.SupervisedRecipe``)."""

    name: str

    def batch(self, env: Any, rows: Sequence[Any]) -> Any: ...

    def loss(self, env: Any) -> Loss: ...


@dataclasses.dataclass(frozen=True)
class SupervisedObjective(Objective):
    """A recipe's fixed-target rows (SFT, DPO) and its loss: no rollout.

    The batch (``SftBatch``, ``PreferenceBatch``) tells its footprint (``batch.footprint()``).
    """

    recipe: FixedTargets
    env: Any  # the run (``rl.recipe.RecipeEnv``)
    grad_accum: int

    def batch(self, policy: Callable[[], Any], items: Sequence[Any], step: int
              ) -> tuple[Any, dict[str, float], list[dict]]:
        del policy, step
        return self.recipe.batch(self.env, items), {}, []

    def loss(self, params: Any, cfg: Any, lc: LossConfig, batch: Any) -> tuple[Any, dict[str, Any]]:
        return self.recipe.loss(self.env)(params, cfg, lc, batch)

    def plan(self, batch: Any) -> tuple[int | str, Footprint]:
        """Bucket: the method and its row lengths (``sft:0x160``, ``dpo:64x32``)."""
        prompts, group, p, c = batch.footprint()
        return f"{self.recipe.name}:{p}x{c}", (prompts // self.grad_accum, group, p, c)
