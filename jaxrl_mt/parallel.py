"""Meshes, partition rules and multi-host initialisation.

One `jax.sharding.Mesh` with named axes ("data", "fsdp", "tensor"). Batches are split over
("data", "fsdp"); parameters follow partition rules keyed by their path in the pytree
(models/decoder.py's layout); `jax.jit` propagates the shardings. The same code runs on one CPU,
8 fake CPU devices (`--xla_force_host_platform_device_count=8`), a GPU host or a TPU pod.

What is sharded how:

- parameters: `PARAM_RULES` by path (matrices over fsdp x tensor, norms replicated);
- optimizer state (`opt_state_shardings`): the same rules, since optax moments keep the
  parameter's path as a suffix (`.../mu/layers/q`); step counters are scalars (replicated);
- KV cache (`CACHE_RULES`, `shard_cache`): rows over (data, fsdp), KV heads over tensor;
- batches: leading axis over (data, fsdp) (`shard_batch`; per-process rows: `global_batch`).

Multi-host: `maybe_initialize_distributed` calls `jax.distributed.initialize` from the config
or the environment; every process then builds the same global mesh over `jax.devices()`, feeds
its own rows with `global_batch` and logs through `log0` (process 0 only).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the batch (row) axis of activations, caches and inputs

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
    for pat, spec in PARAM_RULES:
        if re.search(pat, path):
            break
    return _fit(spec, shape, mesh)


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


def opt_state_shardings(opt_state: Any, mesh: Mesh) -> Any:
    """NamedShardings of an optax state: each moment is sharded like its parameter.

    optax keeps the parameter tree inside its states (`ScaleByAdamState.mu` / `.nu`,
    `MultiStepsState.acc_grads`), so a moment's path ends with its parameter's path and the
    parameter rules apply unchanged; step counters are scalars and stay replicated.
    """
    return param_shardings(opt_state, mesh)


def shard_train_state(params: Any, opt_state: Any, mesh: Mesh) -> tuple[Any, Any]:
    """Places parameters and optimizer state on the mesh (moments sharded like their parameters)."""
    return shard_params(params, mesh), jax.device_put(opt_state, opt_state_shardings(opt_state, mesh))


def shard_train_step(step: Callable[..., Any], mesh: Mesh, params: Any, opt_state: Any) -> Callable[..., Any]:
    """Pins a `step(params, opt_state, batch) -> (params, opt_state, metrics)` to the rules.

    Without it `jax.jit` lets XLA choose the output shardings, which can drift from the rules
    (e.g. norm weights come back sharded) and recompile the step on its second call. With it,
    updated parameters and optimizer moments keep `param_shardings` / `opt_state_shardings`,
    metrics are replicated and the batch keeps the sharding it arrives with.

    Args:
      step: the (jitted or plain) train step, e.g. from `jaxrl_mt.rl.step.make_train_step`.
      mesh: the mesh.
      params, opt_state: examples of the trees (arrays or ShapeDtypeStructs) for their paths.
    """
    ps, os_ = param_shardings(params, mesh), opt_state_shardings(opt_state, mesh)
    return jax.jit(step, in_shardings=(ps, os_, None), out_shardings=(ps, os_, NamedSharding(mesh, P())))


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

    Shards repeated over non-batch axes (e.g. tensor) are taken once; rows come back in global
    order. On one process this is the whole array.
    """
    if x.is_fully_addressable:
        return np.asarray(x)
    by_start: dict[int, np.ndarray] = {}
    for shard in x.addressable_shards:
        start = (shard.index[0].start or 0) if x.ndim else 0
        by_start.setdefault(start, np.asarray(shard.data))
    return np.concatenate([by_start[k] for k in sorted(by_start)], axis=0)


def is_main_process() -> bool:
    """True on process 0 (the one that logs and writes run summaries)."""
    return jax.process_index() == 0


def log0(msg: str, *, printer: Callable[[str], None] | None = None) -> None:
    """Prints `msg` on process 0 only."""
    if is_main_process():
        (printer or (lambda m: print(m, flush=True)))(msg)


def _cfg_get(config: Any, name: str) -> Any:
    """`config.distributed.<name>` when the config has that section, else None."""
    section = getattr(config, "distributed", None) if config is not None else None
    if section is None:
        return None
    value = section.get(name) if hasattr(section, "get") else getattr(section, name, None)
    return value if value not in ("", None) else None


def distributed_settings(config: Any = None, environ: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The `jax.distributed.initialize` arguments for this process, or None for a single process.

    Sources, first match wins:
      1. an optional config section `distributed` with `coordinator_address`, `num_processes`,
         `process_id` (and `enabled` = "auto" | "on" | "off");
      2. environment JAX_COORDINATOR_ADDRESS + JAX_NUM_PROCESSES + JAX_PROCESS_ID (GPU clusters,
         localhost tests; JAX_LOCAL_DEVICE_IDS="0,1" optionally picks the local devices);
      3. JAXRL_MT_DISTRIBUTED=1: JAX detects the cluster itself (TPU pod slices, SLURM, Open MPI):
         an empty dict (no arguments).

    Raises:
      ValueError: a coordinator address without the process count or id, or a bad number
        (naming the variable and its value).
    """
    env = os.environ if environ is None else environ
    enabled = _cfg_get(config, "enabled") or "auto"
    if enabled == "off":
        return None
    addr = _cfg_get(config, "coordinator_address")
    src = "config.distributed"
    nproc, pid = _cfg_get(config, "num_processes"), _cfg_get(config, "process_id")
    if addr is None and env.get("JAX_COORDINATOR_ADDRESS"):
        addr, src = env["JAX_COORDINATOR_ADDRESS"], "environment"
        nproc, pid = env.get("JAX_NUM_PROCESSES") or None, env.get("JAX_PROCESS_ID") or None
    if addr is not None:
        out: dict[str, Any] = {"coordinator_address": str(addr)}
        for key, val in (("num_processes", nproc), ("process_id", pid)):
            var = f"JAX_{key.upper()}" if src == "environment" else f"config.distributed.{key}"
            if val is None:
                raise ValueError(f"{src}: coordinator address {addr!r} given but {var} is not set")
            try:
                out[key] = int(val)
            except (TypeError, ValueError):
                raise ValueError(f"{src}: {var} must be an integer, got {val!r}") from None
        if not 0 <= out["process_id"] < out["num_processes"]:
            raise ValueError(f"{src}: process_id {out['process_id']} not in [0, {out['num_processes']})")
        ids = env.get("JAX_LOCAL_DEVICE_IDS")
        if ids:
            try:
                out["local_device_ids"] = [int(x) for x in ids.split(",")]
            except ValueError:
                raise ValueError(f"environment: JAX_LOCAL_DEVICE_IDS must be comma-separated ints, got {ids!r}") from None
        return out
    if enabled == "on" or env.get("JAXRL_MT_DISTRIBUTED") == "1":
        return {}
    return None


def maybe_initialize_distributed(config: Any = None) -> bool:
    """Calls `jax.distributed.initialize` for multi-process runs (see `distributed_settings`).

    Idempotent: returns True if JAX is (now or already) initialised for several processes,
    False for a single-process run. Processes other than 0 log at WARNING level only.
    """
    if jax.distributed.is_initialized():
        return True
    kw = distributed_settings(config)
    if kw is None:
        return False
    jax.distributed.initialize(**kw)
    if jax.process_index() != 0:
        logging.getLogger().setLevel(logging.WARNING)
        try:
            from absl import logging as absl_logging

            absl_logging.set_verbosity(absl_logging.WARNING)
        except ImportError:
            pass
    return True
