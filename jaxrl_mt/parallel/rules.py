"""Meshes, partition rules and shardings: what is placed how on a `jax.sharding.Mesh`.

See the package doc (``jaxrl_mt.parallel``) for the layout of parameters, optimizer state, KV
caches and batches.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxrl_mt.models.sharding import ROW_AXES

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ROW_AXES  # ("data", "fsdp"): the batch (row) axis of activations (`constrain_rows`), caches and inputs

# (regex on the parameter path, spec). Stacked layer weights have a leading layer axis.
PARAM_RULES: tuple[tuple[str, P], ...] = (
    (r"embed$", P("tensor", "fsdp")),  # [V, D]
    (r"lm_head$", P("fsdp", "tensor")),  # [D, V]
    (r"layers/(q|k|v|gate|up)$", P(None, "fsdp", "tensor")),  # [L, D, out]
    (r"layers/(o|down)$", P(None, "tensor", "fsdp")),  # [L, in, D]
    (r"layers/(q|k|v)_bias$", P(None, "tensor")),  # [L, out]
    # LoRA adapters (models/lora.py): A [L, in, r] and B [L, r, out] sharded like their base matrix's in / out
    (r"layers/(q|k|v|gate|up)/a$", P(None, "fsdp", None)),
    (r"layers/(q|k|v|gate|up)/b$", P(None, None, "tensor")),
    (r"layers/(o|down)/a$", P(None, "tensor", None)),
    (r"layers/(o|down)/b$", P(None, None, "fsdp")),
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


def mesh_from_spec(spec: str) -> Mesh | None:
    """The mesh of a config field ``mesh_shape``.

    ``"auto"``: every device on ``data`` (a 1-device mesh on one CPU: the same code path on
    every layout); ``"none"`` (or ``""``): no mesh (one device, the plain jit path); ``"D,F,T"``:
    that (data, fsdp, tensor) shape (one entry may be -1).

    Raises:
      ValueError: a malformed spec, or a shape the devices cannot fill (the message names it).
    """
    spec = str(spec).strip()
    if spec in ("", "none"):
        return None
    if spec == "auto":
        return make_mesh((-1, 1, 1))
    try:
        shape = tuple(int(x) for x in spec.split(","))
    except ValueError:
        raise ValueError(f"mesh_shape must be 'auto', 'none' or 'data,fsdp,tensor' integers, got {spec!r}") from None
    if len(shape) != 3:
        raise ValueError(f"mesh_shape needs 3 entries (data, fsdp, tensor), got {spec!r}")
    try:
        return make_mesh(shape)
    except ValueError as e:
        raise ValueError(f"mesh_shape {spec!r}: {e}") from None


def row_shards(mesh: Mesh | None) -> int:
    """How many ways a batch's rows are split on `mesh` (data x fsdp; 1 without a mesh).

    A sampler or scorer pads its rows to a multiple of it, so that every batch is split over the
    devices instead of replicated.
    """
    return 1 if mesh is None else int(mesh.shape["data"] * mesh.shape["fsdp"])


# KV-cache rules (models/decoder.py's KVCache fields): rows over the batch axes, KV heads over tensor.
CACHE_RULES: dict[str, P] = {
    "k": P(None, BATCH_AXES, "tensor", None, None),  # [L, B, Hkv, S, K]
    "v": P(None, BATCH_AXES, "tensor", None, None),  # [L, B, Hkv, S, K]
    "valid": P(BATCH_AXES, None),  # [B, S]
    "index": P(),  # []
}


def _key_str(k: Any) -> str:
    for attr in ("key", "name", "idx"):  # DictKey, GetAttrKey (optax NamedTuples), SequenceKey
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def _path(kp: Any) -> str:
    return "/".join(_key_str(k) for k in kp)


def _fit(spec: P, shape: tuple[int, ...], mesh: Mesh) -> P:
    """Drops the mesh axes of `spec` that do not divide their dimension."""
    out = []
    for dim, ax in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = () if ax is None else ((ax,) if isinstance(ax, str) else tuple(ax))
        size = int(np.prod([mesh.shape[a] for a in names])) if names else 1
        out.append(ax if names and dim % size == 0 else None)
    return P(*out)


def param_spec(path: str, shape: tuple[int, ...], mesh: Mesh) -> P:
    """The PartitionSpec of one parameter; axes that do not divide the dim are dropped."""
    spec = next(s for pat, s in PARAM_RULES if re.search(pat, path))  # the last rule matches everything
    return _fit(spec, shape, mesh)


def param_shardings(params: Any, mesh: Mesh) -> Any:
    """NamedShardings for every leaf of a parameter (or optimizer-state) pytree."""
    def one(kp, x):
        shape = getattr(x, "shape", ())
        if len(shape) == 0:
            return NamedSharding(mesh, P())
        return NamedSharding(mesh, param_spec(_path(kp), tuple(shape), mesh))

    return jax.tree_util.tree_map_with_path(one, params)


def shard_params(params: Any, mesh: Mesh | None) -> Any:
    """Places a parameter pytree on the mesh by the partition rules (no mesh: as it is)."""
    return params if mesh is None else jax.device_put(params, param_shardings(params, mesh))


def opt_state_shardings(opt_state: Any, mesh: Mesh) -> Any:
    """NamedShardings of an optax state: each moment is sharded like its parameter.

    optax keeps the parameter tree inside its states (`ScaleByAdamState.mu` / `.nu`,
    `MultiStepsState.acc_grads`), so a moment's path ends with its parameter's path and the
    parameter rules apply unchanged; step counters are scalars and stay replicated.
    """
    return param_shardings(opt_state, mesh)


def shard_train_state(params: Any, opt_state: Any, mesh: Mesh | None) -> tuple[Any, Any]:
    """Places parameters and optimizer state on the mesh (moments sharded like their parameters; no
    mesh: as they are)."""
    if mesh is None:
        return params, opt_state
    return shard_params(params, mesh), jax.device_put(opt_state, opt_state_shardings(opt_state, mesh))


def shard_train_step(step: Callable[..., Any], mesh: Mesh | None, params: Any, opt_state: Any, *,
                     donate: bool = False) -> Callable[..., Any]:
    """Pins a `step(params, opt_state, batch) -> (params, opt_state, metrics)` to the rules.

    Without it `jax.jit` lets XLA choose the output shardings, which can drift from the rules
    (e.g. norm weights come back sharded) and recompile the step on its second call. With it,
    updated parameters and optimizer moments keep `param_shardings` / `opt_state_shardings`,
    metrics are replicated and the batch keeps the sharding it arrives with.

    Args:
      step: the (jitted or plain) train step, e.g. from `jaxrl_mt.rl.step.make_train_step`.
      mesh: the mesh; None: a plain `jax.jit` (one device, XLA's placement).
      params, opt_state: examples of the trees (arrays or ShapeDtypeStructs) for their paths
        (unused without a mesh).
      donate: donate the parameters and optimizer state (their buffers become the outputs'; the
        caller must not read the arrays it passed in again).
    """
    if mesh is None:
        return jax.jit(step, donate_argnums=(0, 1) if donate else ())
    ps, os_ = param_shardings(params, mesh), opt_state_shardings(opt_state, mesh)
    return jax.jit(step, in_shardings=(ps, os_, None), out_shardings=(ps, os_, NamedSharding(mesh, P())),
                   donate_argnums=(0, 1) if donate else ())


def cache_shardings(mesh: Mesh, cache: Any) -> Any:
    """Shardings of a `KVCache` by `CACHE_RULES` (axes that do not divide are dropped)."""
    return type(cache)(**{f: NamedSharding(mesh, _fit(CACHE_RULES[f], tuple(getattr(cache, f).shape), mesh))
                          for f in cache._fields})


def shard_cache(cache: Any, mesh: Mesh) -> Any:
    """Places a `KVCache` on the mesh by `CACHE_RULES`."""
    return jax.device_put(cache, cache_shardings(mesh, cache))


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


def global_batch(mesh: Mesh, arrays: Sequence[Any]) -> list[jax.Array]:
    """Global arrays from each process's own rows (per-process data sharding).

    Every process passes its local rows (the same number on each); the global batch is their
    concatenation in process order, split over (data, fsdp). With one process this is
    `shard_batch` for arrays whose batch divides the data x fsdp size.

    Args:
      mesh: the global mesh.
      arrays: host arrays [B_local, ...] of this process.

    Returns:
      `jax.Array`s [B_local * process_count, ...] sharded over the batch axes.
    """
    out = []
    for a in arrays:
        a = np.asarray(a)
        sharding = batch_sharding(mesh, a.ndim)
        out.append(jax.make_array_from_process_local_data(sharding, a))
    return out


def local_rows(x: jax.Array) -> np.ndarray:
    """This process's rows of a batch-sharded global array (the inverse of `global_batch`).

    The addressable shards are placed by their index; shards repeated over other mesh axes
    (e.g. tensor) count once; rows come back in global order. On one process this is the whole
    array.

    Raises:
      ValueError: the addressable shards do not cover whole rows (a non-batch dimension is split
        over devices of another process; `fetch_rows` reshards such arrays first).
    """
    if x.is_fully_addressable:
        return np.asarray(x)
    if x.ndim == 0:
        return np.asarray(x.addressable_data(0))
    shards = [(sh.index, sh) for sh in x.addressable_shards]
    lo = min(idx[0].start or 0 for idx, _ in shards)
    hi = max(x.shape[0] if idx[0].stop is None else idx[0].stop for idx, _ in shards)
    out = np.empty((hi - lo,) + tuple(x.shape[1:]), x.dtype)
    seen = np.zeros(out.shape, bool)
    for idx, sh in shards:
        at = (slice((idx[0].start or 0) - lo, (x.shape[0] if idx[0].stop is None else idx[0].stop) - lo),) + idx[1:]
        out[at] = np.asarray(sh.data)
        seen[at] = True
    if not seen.all():
        raise ValueError(f"local_rows: this process's shards of an array {x.shape} ({x.sharding}) do not cover "
                         "whole rows; reshard it over the batch axis first")
    return out
