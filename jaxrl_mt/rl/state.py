"""The train state pytree and the loop's start-up and checkpoint steps, each a small function.

:class:`TrainState` is what a step changes and a checkpoint holds: the optimizer step, the policy
parameters and the optimizer state (no RNG: rollouts draw their keys from ``(seed, step)``).
The functions below are the run's start-up and persistence steps, kept apart so that each can
grow its own checks:

- ``write_config``: the config of the run into ``config.json`` (where a resumed run would compare
  the stored config with the new one before overwriting it);
- ``fresh_state`` / ``restore_state``: the state at step 0, or the newest checkpoint that restores;
- ``save_state``: one checkpoint (where a finite-update check belongs, before anything is written).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax.struct

from jaxrl_mt.checkpointing import Checkpointer
from jaxrl_mt.parallel import shard_train_state

__all__ = ["TrainState", "fresh_state", "restore_state", "save_state", "write_config"]


@flax.struct.dataclass
class TrainState:
    """The policy's parameters and optimizer state after ``step`` optimizer steps (host-side count)."""

    params: Any
    opt_state: Any
    step: int = flax.struct.field(pytree_node=False, default=0)

    def arrays(self) -> dict[str, Any]:
        """The checkpointed arrays."""
        return {"params": self.params, "opt_state": self.opt_state}


def write_config(config: dict[str, Any], workdir: Path, *, is_main: bool) -> None:
    """Writes the run's config (a JSON-able dict) to ``workdir/config.json`` (process 0)."""
    if is_main:
        (workdir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))


def fresh_state(params: Any, optimizer: Any, mesh: Any = None) -> TrainState:
    """Step 0: the initial parameters and a new optimizer state, on the mesh's partition rules."""
    opt_state = optimizer.init(params)
    if mesh is not None:
        params, opt_state = shard_train_state(params, opt_state, mesh)
    return TrainState(params, opt_state, 0)


def restore_state(ck: Checkpointer, like: TrainState, data_iter: Any, *, log: Callable[[str], None]
                  ) -> TrainState | None:
    """The newest checkpoint that restores (its data iterator state set on ``data_iter``), or None."""
    if ck.latest_step() is None:
        return None
    arrays, extra = ck.restore(target=like.arrays(), on_skip=log)
    data_iter.set_state(extra["data_state"])
    return TrainState(arrays["params"], arrays["opt_state"], int(extra["step"]))


def save_state(ck: Checkpointer, state: TrainState, data_iter: Any) -> None:
    """Checkpoints ``state`` with the data iterator's position (asynchronous; ``ck.wait()`` to finish)."""
    ck.save(state.step, state.arrays(), {"step": state.step, "data_state": data_iter.get_state()}, force=True)
