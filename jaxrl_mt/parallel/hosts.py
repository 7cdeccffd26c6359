"""Processes: multi-host initialisation and the per-process-rows helpers around a jitted call.

In a multi-process run every process holds its own rows (its data shard). A jitted program is
one global computation, so every process must call it with the same global shapes: the
processes agree on buckets with `agree_max` before padding, feed their rows with `put_rows`,
read their rows back with `fetch_rows` and log global metrics with `mean_over_processes`.
With one process every helper reduces to the single-process code path (`shard_batch`,
`jax.device_get`, the identity), so single-process results do not change.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxrl_mt.parallel.rules import global_batch, local_rows, make_mesh, shard_batch, shard_params

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
                raise ValueError(f"environment: JAX_LOCAL_DEVICE_IDS must be comma-separated ints, "
                                 f"got {ids!r}") from None
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


# ----------------------------------------------------------------------------- per-process rows


def _allgather(x: np.ndarray) -> np.ndarray:
    """[P, ...] stack of a host array of the same shape and dtype from every process."""
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(np.asarray(x)))


def allgather_ints(values: Sequence[int]) -> np.ndarray:
    """The int32 `values` of every process, [P, len(values)] in process order ([1, k] on one process).

    Every process must pass the same number of values.
    """
    v = np.asarray(list(values), np.int32).reshape(-1)  # [k]
    if jax.process_count() == 1:
        return v[None]
    return _allgather(v).reshape(jax.process_count(), -1)


def agree_max(value: int) -> int:
    """The largest `value` over all processes (the identity on one process).

    Used so every process pads to the same bucket: a jitted program must see the same global
    shapes on every process.
    """
    return int(allgather_ints([value]).max())


def agree_max_many(values: Sequence[int]) -> tuple[int, ...]:
    """Element-wise `agree_max` of several ints in one collective."""
    return tuple(int(x) for x in allgather_ints(values).max(axis=0))


def check_same_rows(n: int, what: str) -> None:
    """Raises ValueError (on every process) unless every process has `n` rows of `what`."""
    if jax.process_count() == 1:
        return
    got = allgather_ints([n])[:, 0]
    if np.any(got != got[0]):
        raise ValueError(f"{what}: processes have different row counts {got.tolist()}; every process must "
                         "feed the same number of rows")


def allgather_json(obj: Any) -> list[Any]:
    """The JSON-able `obj` of every process, as a list in process order ([obj] on one process)."""
    import json

    if jax.process_count() == 1:
        return [obj]
    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)  # [L]
    longest = agree_max(len(data))
    lens = allgather_ints([len(data)])[:, 0]
    buf = np.zeros(longest, np.uint8)
    buf[: len(data)] = data
    rows = _allgather(buf)  # [P, longest]
    return [json.loads(bytes(rows[i, : lens[i]]).decode()) for i in range(len(lens))]


def broadcast_json(obj: Any) -> Any:
    """Process 0's JSON-able `obj` on every process (what the others pass is ignored)."""
    import json

    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return obj
    data = np.frombuffer(json.dumps(obj).encode(), np.uint8) if is_main_process() else np.zeros(0, np.uint8)
    size = agree_max(len(data))  # process 0's length
    buf = np.zeros(size, np.uint8)
    buf[: len(data)] = data
    return json.loads(bytes(np.asarray(multihost_utils.broadcast_one_to_all(buf))).decode())


def process_block(n: int) -> tuple[int, int]:
    """This process's contiguous block [lo, hi) of n items (sizes differ by at most one)."""
    p, i = jax.process_count(), jax.process_index()
    return i * n // p, (i + 1) * n // p


def spans_processes(mesh: Mesh | None) -> bool:
    """Whether `mesh` has devices of more than one process (its arrays are not fully addressable)."""
    return mesh is not None and len({d.process_index for d in mesh.devices.flat}) > 1


def rows_multiple(mesh: Mesh | None) -> int:
    """Each process's row count must be a multiple of this: its share of the data x fsdp shards.

    1 without a mesh or for a mesh within one process (`shard_batch` replicates rows that do not divide).
    """
    if not spans_processes(mesh):
        return 1
    shards, procs = mesh.shape["data"] * mesh.shape["fsdp"], jax.process_count()
    if shards % procs:
        raise ValueError(f"mesh data x fsdp = {shards} is not a multiple of the {procs} processes: per-process "
                         "rows need the batch axis split over the processes")
    return shards // procs


def put_rows(mesh: Mesh | None, arrays: Sequence[Any], *, pad: bool = True) -> list[Any]:
    """This process's rows -> arrays on the mesh.

    No mesh (one device, the plain jit path): the arrays as they are. A mesh within one process
    (e.g. a single-process run): `shard_batch`, unchanged. A mesh over
    several processes: `global_batch`, the concatenation of every process's rows in process
    order. Each process must pass the same number of rows (agree on it with `agree_max` first).
    Rows are padded to a multiple of `rows_multiple(mesh)` by repeating the last row;
    `fetch_rows` returns the padding too, so callers keep their first n rows.

    Args:
      mesh: the mesh.
      arrays: host arrays [B_local, ...] of this process.
      pad: False raises ValueError instead of padding (a training batch, where a repeated row
        would change the loss).

    Returns:
      Arrays [B_local' * process_count, ...] (B_local' = B_local padded) split over (data, fsdp).
    """
    if mesh is None:
        return list(arrays)
    if not spans_processes(mesh):
        return shard_batch(mesh, arrays)
    m = rows_multiple(mesh)
    out = []
    for a in arrays:
        a = np.asarray(a)
        if a.ndim == 0:
            raise ValueError(f"put_rows: a scalar has no rows (shape {a.shape}); use put_replicated")
        extra = (-a.shape[0]) % m
        if extra and not pad:
            raise ValueError(f"put_rows: {a.shape[0]} rows per process is not a multiple of {m} "
                             f"(this process's share of the data x fsdp shards)")
        if extra:
            a = np.concatenate([a, np.repeat(a[-1:], extra, axis=0)], axis=0)
        out.append(a)
    return global_batch(mesh, out)


def put_replicated(mesh: Mesh, tree: Any) -> Any:
    """A pytree that is the same on every process (a PRNG key, a scalar), replicated on the mesh."""
    return jax.device_put(tree, NamedSharding(mesh, P()))


def _process_rows(x: jax.Array) -> np.ndarray:
    """This process's rows of one global array (see `fetch_rows`)."""
    if x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    if x.ndim == 0:
        return np.asarray(x.addressable_data(0))
    sh = x.sharding
    if isinstance(sh, NamedSharding) and any(a is not None for a in tuple(sh.spec)[1:]):
        # a non-batch dim split over devices (e.g. pooled [B, D] with D over fsdp): keep the row
        # split, gather the rest (a collective; the spec is the same on every process)
        x = jax.device_put(x, NamedSharding(sh.mesh, P(sh.spec[0] if len(sh.spec) else None)))
    rows = local_rows(x)
    if rows.shape[0] == x.shape[0]:  # rows not split over processes (replicated): this process's block
        lo, hi = process_block(x.shape[0])
        return rows[lo:hi]
    return rows


def fetch_rows(tree: Any) -> Any:
    """This process's rows of each (global, batch-major) leaf, as host arrays.

    The inverse of `put_rows`: leaf rows split over (data, fsdp) come back as the rows this
    process holds; a leaf whose rows are not split over the processes (replicated) gives its
    process block (the rows this process fed, under the standard device order); a leaf with a
    sharded non-batch dim is first resharded over its rows only (a collective: every process
    calls `fetch_rows` on the same tree); a scalar is returned whole. Fully addressable leaves
    (one process, or a process-local mesh): `jax.device_get`.
    """
    if jax.process_count() == 1:
        return jax.device_get(tree)
    return jax.tree_util.tree_map(_process_rows, tree)  # fully addressable leaves: a plain device_get


def mean_over_processes(metrics: dict[str, float], *, weight: float = 1.0,
                        max_keys: Sequence[str] = ()) -> dict[str, float]:
    """Weighted mean of each metric over processes (the identity on one process).

    Every process must pass the same keys (checked: a clear ValueError on every process).

    Args:
      metrics: this process's values.
      weight: this process's weight (e.g. its row count; 0 drops it). Equal weights give the
        mean of per-process means, which is the global mean when every process has the same
        number of rows.
      max_keys: keys reduced by the maximum instead (e.g. a max length).

    Returns:
      The global values, the same on every process.
    """
    import zlib

    if jax.process_count() == 1:
        return dict(metrics)
    keys = sorted(metrics)
    sig = float(zlib.crc32("\n".join(keys).encode()))  # exact in float64
    vec = np.asarray([sig, float(weight)] + [float(metrics[k]) for k in keys], np.float64)  # [2 + K]
    sizes = allgather_ints([len(vec)])[:, 0]
    if np.any(sizes != sizes[0]):
        raise ValueError(f"mean_over_processes: processes have different numbers of metrics {sizes.tolist()}")
    rows = _allgather(vec.view(np.int32)).view(np.float64).reshape(jax.process_count(), -1)  # exact float64
    if np.any(rows[:, 0] != sig):
        raise ValueError("mean_over_processes: processes logged different metric names")
    w, vals = rows[:, 1], rows[:, 2:]  # [P], [P, K]
    if w.sum() <= 0:
        raise ValueError(f"mean_over_processes: weights {w.tolist()} sum to <= 0")
    out = {}
    live = w > 0  # a weight-0 process may hold NaN (e.g. the mean of nothing)
    for j, k in enumerate(keys):
        col = vals[live, j]
        out[k] = float(col.max()) if k in max_keys else float(np.dot(w[live], col) / w[live].sum())
    return out


def local_mesh(mesh: Mesh) -> Mesh:
    """A mesh over this process's devices only, (data, 1, 1): for work done by each process alone."""
    return make_mesh((-1, 1, 1), devices=[d for d in mesh.devices.flat if d.process_index == jax.process_index()])


def gather_to_host(tree: Any) -> Any:
    """Every leaf of a (global) pytree as a whole host array, on every process.

    Fully addressable and replicated leaves are read locally; sharded ones are gathered from
    every process (a collective: every process must call this with the same tree).
    """
    from jax.experimental import multihost_utils

    def host(x: Any) -> np.ndarray:
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return np.asarray(jax.device_get(x))
        if x.sharding.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree_util.tree_map(host, tree)


def local_copy(params: Any, mesh: Mesh) -> Any:
    """A copy of global parameters on `local_mesh(mesh)`, usable without the other processes.

    Collective (`gather_to_host`); costs a second copy of the weights while it is held.
    """
    return shard_params(gather_to_host(params), local_mesh(mesh))
