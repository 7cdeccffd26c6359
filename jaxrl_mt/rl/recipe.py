"""The recipe interface of the training loop: what a method brings, and the one list of methods.

A method is a *recipe* (where its items come from, how a step's items are picked, how held-out
items are scored, what state it keeps) plus a reward (``jaxrl_mt.rewards.registry``, chosen apart).
The loop (``rl.loop.Trainer``) calls every hook of :class:`Recipe` unconditionally; the optional
ones have no-op defaults here, so a recipe overrides only what it uses (tunix ``RLLearner``'s
abstract hooks, levanter ``Trainer``'s hooks):

- ``load`` / ``prepare`` / ``evaluate`` (required): scenarios from the config before any model
  loads; the training and held-out items (cached in the workdir); the held-out metrics;
- ``step_items``: the items a step trains on (default: the drawn ones; RLAAR's curriculum);
- ``observe``: the step's metrics, after the update (default: nothing; RLAAR's curriculum);
- ``state_json`` / ``set_state``: the recipe's own state in every checkpoint (default: none);
- ``select``: the held-out metric whose best checkpoint is kept and exported (default: none, the
  last step is exported; SFT and DPO: the lowest validation loss);
- ``objective``: what the steps optimise (``rl.objective.Objective``: the step's batch builder and
  its loss; default: GRPO on the policy's rewarded rollouts).

Supervised recipes (SFT, DPO: fixed targets, no rollouts) are :class:`SupervisedRecipe`: they add
``batch`` (rows -> a batch pytree) and ``loss`` (the jittable loss), their objective.

A recipe sees the run as a frozen :class:`RecipeEnv` (it imports no trainer). Built-in methods
register in :data:`METHODS` (loaded on the first lookup); a bad config fails at start-up with one
:class:`ConfigError` line.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from jaxrl_mt.registry import Registry
from jaxrl_mt.rl.run_config import ConfigError, TrainConfig

if TYPE_CHECKING:
    from jaxrl_mt.rl.objective import Objective

__all__ = ["METHODS", "ConfigError", "Recipe", "RecipeEnv", "SupervisedRecipe", "is_supervised"]


@dataclasses.dataclass(frozen=True)
class RecipeEnv:
    """What a data recipe sees of the run that hosts it: a narrow, frozen view (recipes import no trainer).

    A recipe reads the config, writes its caches in the workdir, samples with ``sampler`` (the
    policy on its initial parameters) or with ``policy_sampler(params)`` (a view of the same
    sampler on other parameters: the shared one is never changed).
    """

    config: TrainConfig  # the validated config
    workdir: Path
    is_main: bool  # process 0
    multi: bool  # the mesh spans several processes
    system: str | None  # the system prompt
    sampler: Any  # the policy's sampler on its initial parameters (histories, filtering)
    mesh: Any
    log: Callable[[str], None]
    ref_params: Any = None  # the frozen reference model (DPO's reference log-probs)
    ref_cfg: Any = None

    def policy_sampler(self, params: Any) -> Any:
        """The policy's sampler on ``params`` (``Sampler.bound``: the shared sampler is unchanged)."""
        return self.sampler.bound(params)


class Recipe(abc.ABC):
    """A method's data recipe: the hooks the training loop calls (see the module doc).

    Attributes:
      select: ``(metric, "min" | "max")``: the held-out metric whose best evaluation is kept
        (``<workdir>/best``) and exported instead of the last step; None: the last step.
    """

    select: ClassVar[tuple[str, str] | None] = None

    @abc.abstractmethod
    def load(self, c: TrainConfig) -> tuple[list[Any], list[Any]]:
        """Training and held-out scenarios (or problems) of the config, before any model is loaded.

        Args:
          c: the validated config.

        Returns:
          ``(train, held)``, the inputs of :meth:`prepare`.

        Raises:
          ConfigError: a bad source or an empty dataset.
        """

    @abc.abstractmethod
    def prepare(self, env: RecipeEnv, train: Sequence[Any], held: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """The training items (what the data iterator draws) and the held-out items, cached in the workdir.

        Args:
          env: the run.
          train, held: :meth:`load`'s output.

        Returns:
          ``(items, held_items)``.
        """

    @abc.abstractmethod
    def evaluate(self, env: RecipeEnv, params: Any, held: Sequence[Any]) -> dict[str, float]:
        """The held-out metrics (``eval/*``) of the policy ``params``; ``{}`` when ``held`` is empty."""

    def step_items(self, env: RecipeEnv, items: Sequence[Any], step: int) -> tuple[Sequence[Any], dict[str, float]]:
        """The items step ``step`` (0-based) trains on, from the ones the data iterator drew.

        Args:
          env: the run.
          items: the drawn batch.
          step: the optimizer steps done before this one.

        Returns:
          ``(items, metrics)``: by default the drawn items and no metrics.
        """
        del env, step
        return items, {}

    def observe(self, metrics: dict[str, float]) -> None:
        """Sees a step's metrics (global means) after its update; by default nothing."""
        del metrics

    def state_json(self) -> dict[str, Any] | None:
        """The recipe's own state, JSON-able, saved in every checkpoint; None (the default): no state."""
        return None

    def set_state(self, state: dict[str, Any]) -> None:
        """Sets the state :meth:`state_json` saved (on a resume); by default nothing."""
        del state

    def objective(self, env: RecipeEnv, rollout: Callable[[], Any]) -> Objective:
        """What the method's steps optimise: by default the GRPO loss on the policy's rewarded rollouts.

        Args:
          env: the run.
          rollout: builds the run's rollout engine (``rl.rollout.RolloutEngine``: the sampler, the
            reward, the reference model); called only by an objective that samples.
        """
        from jaxrl_mt.rl.objective import GRPOObjective

        return GRPOObjective(rollout(), batch_size=env.config.rl.batch_size, seed=env.config.seed)


class SupervisedRecipe(Recipe):
    """A recipe with fixed targets (SFT, DPO): its steps train on :meth:`batch` with :meth:`loss`, no rollouts.

    Attributes:
      name: the method's name and its config section (``sft``, ``dpo``).
    """

    name: ClassVar[str] = ""

    @abc.abstractmethod
    def batch(self, env: RecipeEnv, rows: Sequence[Any]) -> Any:
        """The rows as a batch pytree of numpy arrays, lengths bucketed (``rows``, ``slice_rows``,
        ``footprint``: see ``rl.objective``), with the normaliser its loss needs under ``rl.grad_accum``."""

    @abc.abstractmethod
    def loss(self, env: RecipeEnv) -> Callable[[Any, Any, Any, Any], tuple[Any, dict[str, Any]]]:
        """``loss(params, cfg, lc, batch) -> (loss, metrics)``, jittable (``lc``: ``rl.step.LossConfig``, its
        ``chunk`` and ``remat``); ``metrics`` holds ``loss``."""

    def objective(self, env: RecipeEnv, rollout: Callable[[], Any]) -> Objective:
        """:meth:`batch` and :meth:`loss`: no rollout (``rollout`` is not called)."""
        from jaxrl_mt.rl.objective import SupervisedObjective

        del rollout
        return SupervisedObjective(self, env, grad_accum=env.config.rl.grad_accum)


# method -> its recipe class (a ``Recipe``); the one list of methods (the reward is chosen apart,
# ``rl.data.reward_name``). Built-ins register on the first lookup.
METHODS: Registry[type[Recipe]] = Registry("method", builtins=(
    "jaxrl_mt.rl.multiturn", "jaxrl_mt.rl.icpo", "jaxrl_mt.rl.supervised", "jaxrl_mt.rl.rlaar_data",
    "jaxrl_mt.rl.conv_recipe"))


def is_supervised(method: str) -> bool:
    """Whether a method trains on fixed targets (SFT, DPO: a :class:`SupervisedRecipe`) rather than on
    rewarded rollouts; False for an unknown method."""
    return method in METHODS and issubclass(METHODS.get(method), SupervisedRecipe)
