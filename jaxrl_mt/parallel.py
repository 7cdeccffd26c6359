"""Meshes, partition rules and multi-host initialisation.

One `jax.sharding.Mesh` with named axes ("data", "fsdp", "tensor"). Batches are split over
("data", "fsdp"); parameters follow partition rules keyed by their path in the pytree
(models/decoder.py's layout); `jax.jit` propagates the shardings. The same code runs on one CPU,
8 fake CPU devices (`--xla_force_host_platform_device_count=8`), a GPU host or a TPU pod.
"""

from __future__ import annotations

import os
import re
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXES = ("data", "fsdp", "tensor")

# (regex on the parameter path, spec). Stacked layer weights have a leading layer axis.
PARAM_RULES: tuple[tuple[str, P], ...] = (
    (r"embed$", P("tensor", "fsdp")),  # [V, D]
    (r"lm_head$", P("fsdp", "tensor")),  # [D, V]
    (r"layers/(q|k|v|gate|up)$", P(None, "fsdp", "tensor")),  # [L, D, out]
    (r"layers/(o|down)$", P(None, "tensor", "fsdp")),  # [L, in, D]
    (r"layers/(q|k|v)_bias$", P(None, "tensor")),  # [L, out]
    (r".*", P()),  # norms and everything else: replicated
)


def make_mesh(shape: Sequence[int] = (-1, 1, 1), devices: Sequence[Any] | None = None) -> Mesh:
    """A mesh over (data, fsdp, tensor); one -1 entry takes the remaining devices."""
    devs = list(devices if devices is not None else jax.devices())
    shape = list(shape)
    if shape.count(-1) > 1:
        raise ValueError(f"mesh shape {shape}: at most one -1")
    if -1 in shape:
        rest = int(np.prod([s for s in shape if s != -1]))
        shape[shape.index(-1)] = len(devs) // rest
    if int(np.prod(shape)) != len(devs):
        raise ValueError(f"mesh shape {tuple(shape)} needs {int(np.prod(shape))} devices, have {len(devs)}")
    return Mesh(np.asarray(devs).reshape(shape), AXES)


def _path(kp: Any) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in kp)


def param_spec(path: str, shape: tuple[int, ...], mesh: Mesh) -> P:
    """The PartitionSpec of one parameter; axes that do not divide the dim are dropped."""
    for pat, spec in PARAM_RULES:
        if re.search(pat, path):
            break
    out = []
    for dim, ax in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        out.append(ax if ax is not None and dim % mesh.shape[ax] == 0 else None)
    return P(*out)


def param_shardings(params: Any, mesh: Mesh) -> Any:
    """NamedShardings for every leaf of a parameter (or optimizer-state) pytree."""
    def one(kp, x):
        shape = getattr(x, "shape", ())
        if len(shape) == 0:
            return NamedSharding(mesh, P())
        return NamedSharding(mesh, param_spec(_path(kp), tuple(shape), mesh))

    return jax.tree_util.tree_map_with_path(one, params)


def shard_params(params: Any, mesh: Mesh) -> Any:
    """Places a parameter pytree on the mesh by the partition rules."""
    return jax.device_put(params, param_shardings(params, mesh))


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Leading (batch) axis over data x fsdp, the rest replicated."""
    return NamedSharding(mesh, P(("data", "fsdp"), *([None] * (ndim - 1))))


def shard_batch(mesh: Mesh, arrays: Sequence[Any]) -> list[Any]:
    """Puts host arrays on the mesh, batch axis split over (data, fsdp) when it divides."""
    n = mesh.shape["data"] * mesh.shape["fsdp"]
    out = []
    for a in arrays:
        a = np.asarray(a)
        if a.ndim and a.shape[0] % n == 0:
            out.append(jax.device_put(a, batch_sharding(mesh, a.ndim)))
        else:
            out.append(jax.device_put(a, NamedSharding(mesh, P())))
    return out


def maybe_initialize_distributed(config: Any = None) -> bool:
    """Calls `jax.distributed.initialize` for multi-process runs.

    Driven by the environment: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID (GPU
    clusters, localhost tests), or a TPU pod / SLURM environment that JAX detects itself
    (JAXRL_MT_DISTRIBUTED=1). Returns True when initialised.
    """
    addr = os.environ.get("JAX_COORDINATOR_ADDRESS")
    if addr:
        jax.distributed.initialize(coordinator_address=addr, num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                                   process_id=int(os.environ["JAX_PROCESS_ID"]))
        return True
    if os.environ.get("JAXRL_MT_DISTRIBUTED") == "1":
        jax.distributed.initialize()
        return True
    return False
