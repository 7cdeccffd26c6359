"""The decoder's one piece of mesh awareness: its activations' rows stay split over the mesh.

`constrain_rows` pins a traced activation [B, ...] to rows over ``ROW_AXES`` (the mesh's data and
fsdp axes: `parallel.BATCH_AXES`, defined here so that the models layer does not import the
engine's `parallel`). The mesh is the one the traced value carries (its inputs' placement), so the
decoder needs no mesh argument, and on one device nothing is added to the program.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

ROW_AXES = ("data", "fsdp")  # the mesh axes a batch's rows are split over (`parallel.BATCH_AXES`)


def constrain_rows(x: Any) -> Any:
    """Inside a jitted program on a mesh: pins activations `x` [B, ...] to rows over (data, fsdp).

    The mesh is the one `x`'s abstract value carries (from its inputs: parameters or rows placed on
    a mesh). Without the pin, XLA's partitioner follows the fsdp-sharded hidden dimension of the
    parameters and all-gathers the rows, so every device runs every row (docs/scaling.md, the step's
    measured memory). The other dimensions are left to the partitioner (`P.UNCONSTRAINED`).

    Args:
      x: an array, traced or not.

    Returns:
      `x` under a sharding constraint; `x` itself outside a trace, without a mesh, on a mesh whose
      data x fsdp is 1, and when B does not divide it (such rows stay replicated, as
      `parallel.shard_batch` places them), so a one-device program is unchanged.
    """
    if not isinstance(x, jax.core.Tracer) or x.ndim == 0:
        return x
    mesh = getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None)
    sizes = dict(getattr(mesh, "shape", None) or {})
    if not all(a in sizes for a in ROW_AXES):
        return x
    n = int(np.prod([sizes[a] for a in ROW_AXES]))
    if n == 1 or x.shape[0] % n:
        return x
    spec = P(ROW_AXES, *([P.UNCONSTRAINED] * (x.ndim - 1)))
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
