"""The train state pytree and the loop's start-up and checkpoint steps, each a small function.

:class:`TrainState` is what a step changes and a checkpoint holds: the optimizer step, the policy
parameters and the optimizer state (no RNG: rollouts draw their keys from ``(seed, step)``).
The functions below are the run's start-up and persistence steps, kept apart so that each can
grow its own checks:

- ``fresh_state`` / ``restore_state``: the state at step 0, or the newest checkpoint that restores;
- ``save_state``: one checkpoint, after the finite-update check (a non-finite state is never written).

The config comparison of a resumed run, before ``config.json`` is written, is
``jaxrl_mt.rl.workdir.check_resume_config``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.struct

from jaxrl_mt.checkpointing import Checkpointer
from jaxrl_mt.parallel import shard_train_state
from jaxrl_mt.rl.recipe import Recipe
from jaxrl_mt.rl.workdir import check_finite_state

__all__ = ["RETIRED_KEYS", "TrainState", "fresh_state", "restore_state", "save_state"]

#: Entries that checkpoints written before the typed state held and it no longer has: ``rng``
#: (a PRNG key that was saved and never used). Read when present and dropped.
RETIRED_KEYS = ("rng",)


@flax.struct.dataclass
class TrainState:
    """The policy's parameters and optimizer state after ``step`` optimizer steps (host-side count)."""

    params: Any
    opt_state: Any
    step: int = flax.struct.field(pytree_node=False, default=0)

    def arrays(self) -> dict[str, Any]:
        """The checkpointed arrays."""
        return {"params": self.params, "opt_state": self.opt_state}


def fresh_state(params: Any, optimizer: Any, mesh: Any = None) -> TrainState:
    """Step 0: the initial parameters and a new optimizer state, on the mesh's partition rules."""
    opt_state = optimizer.init(params)
    params, opt_state = shard_train_state(params, opt_state, mesh)
    return TrainState(params, opt_state, 0)


def restore_state(ck: Checkpointer, like: TrainState, data_iter: Any, *, log: Callable[[str], None],
                  stored_opt_state: Any = None, recipe: Recipe | None = None) -> TrainState | None:
    """The newest checkpoint that restores (its data iterator state set on ``data_iter``), or None.

    Args:
      stored_opt_state: the checkpoint's optimizer state structure when an allowed config change
        (``allow_config_changes``) altered it: restored as that, then replaced by ``like``'s fresh one.
      recipe: the run's recipe: its own state (``Recipe.set_state``, e.g. RLAAR's curriculum) is
        set from the checkpoint when the checkpoint holds one.
    """
    if ck.latest_step() is None:
        return None
    target = like.arrays() if stored_opt_state is None else {"params": like.params, "opt_state": stored_opt_state}
    arrays, extra = ck.restore(target=target, on_skip=log, retired=RETIRED_KEYS)
    data_iter.set_state(extra["data_state"])
    if recipe is not None and "recipe_state" in extra:
        recipe.set_state(extra["recipe_state"])
    opt_state = arrays["opt_state"] if stored_opt_state is None else like.opt_state
    return TrainState(arrays["params"], opt_state, int(extra["step"]))


def save_state(ck: Checkpointer, state: TrainState, data_iter: Any, recipe: Recipe | None = None) -> None:
    """Checkpoints ``state`` with the data iterator's position (asynchronous; ``ck.wait()`` to finish)
    and the recipe's own state (``recipe.state_json()``, when not None).

    Raises:
      NonFiniteUpdate: a non-finite parameter or optimizer-state value; nothing is written.
    """
    check_finite_state(state.step, state.arrays())
    extra = {"step": state.step, "data_state": data_iter.get_state()}
    recipe_state = None if recipe is None else recipe.state_json()
    if recipe_state is not None:
        extra["recipe_state"] = recipe_state
    ck.save(state.step, state.arrays(), extra, force=True)
