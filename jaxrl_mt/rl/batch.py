"""A training step's batch, whatever its objective: a pytree of rows, how to slice them, and its one placement.

GRPO's rollout example (``rl.example.TrainExample``), SFT's rows (``rl.sft.SftBatch``) and DPO's
pairs (``rl.dpo.PreferenceBatch``) are each a pytree whose array leaves hold rows of the step (a
grouped GRPO example's prompt arrays: one row per group) with ``rows`` and ``slice_rows``; the
training loop splits any of them into ``rl.grad_accum`` micro-batches the same way and puts each on
the mesh with :func:`place`.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import jax
import numpy as np

from jaxrl_mt.parallel import put_rows

__all__ = ["Batch", "place"]

B = TypeVar("B")


class Batch(Protocol):
    """What the training loop reads of a batch (``rl.objective``)."""

    @property
    def rows(self) -> int:
        """The rows the step's micro-batches split (GRPO: completion rows; SFT: rows; DPO: pairs)."""
        ...

    def slice_rows(self, start: int, n: int) -> Any:
        """Rows ``[start, start + n)``, as a batch of the same type."""
        ...


def place(mesh: Any, batch: B, *, pad: bool = False) -> B:
    """A batch's row arrays on the mesh (this process's rows of a global batch); unchanged without a mesh.

    Every array leaf with a row axis goes through ``parallel.put_rows`` (no padding: a repeated row
    would change the loss; without a mesh it returns the arrays as they are); scalars (GRPO's
    Clip-Cov seed) stay as they are. One process or several: the same call (the rows of every
    process, in process order, form the global batch). ``pad=True`` (a pass without a loss, e.g.
    reference log-probs): rows are padded to the mesh's multiple by repeating the last one; the
    caller keeps its first rows of ``parallel.fetch_rows``.
    """
    leaves, tree = jax.tree_util.tree_flatten(batch)
    rows = [i for i, x in enumerate(leaves) if np.ndim(x) >= 1]
    for i, x in zip(rows, put_rows(mesh, [leaves[i] for i in rows], pad=pad)):
        leaves[i] = x
    return jax.tree_util.tree_unflatten(tree, leaves)
