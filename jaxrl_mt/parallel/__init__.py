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
- batches: leading axis over (data, fsdp) (`shard_batch`; per-process rows: `global_batch`);
- activations: inside the jitted programs, the decoder's layer inputs and outputs are pinned to
  rows over (data, fsdp) (`constrain_rows`, from ``models.sharding``), so the partitioner
  gathers the fsdp-sharded weights layer by layer instead of the hidden states over the rows.

Modules: ``rules`` (meshes, partition rules, shardings, batch placement) and ``hosts``
(multi-host initialisation, per-process rows); every name is importable from here.

Multi-host: `maybe_initialize_distributed` calls `jax.distributed.initialize` from the config
or the environment; every process then builds the same global mesh over `jax.devices()`, feeds
its own rows with `global_batch` and logs through `log0` (process 0 only). Around a jitted call
on per-process rows: `agree_max` (the same buckets everywhere), `put_rows` (rows in),
`fetch_rows` (this process's rows out), `mean_over_processes` (global metrics); `gather_to_host`
/ `local_copy` / `local_mesh` for work a process does alone. On one process all of them reduce
to the single-process path (`shard_batch`, `jax.device_get`, the identity).
"""

from jaxrl_mt.models.sharding import constrain_rows
from jaxrl_mt.parallel.hosts import (agree_max, agree_max_many,
                                     allgather_ints, allgather_json, broadcast_json, check_same_rows,
                                     distributed_settings, fetch_rows, gather_to_host, is_main_process, local_copy,
                                     local_mesh, log0, maybe_initialize_distributed, mean_over_processes,
                                     process_block, put_replicated, put_rows, rows_multiple, spans_processes)
from jaxrl_mt.parallel.rules import (AXES, BATCH_AXES, CACHE_RULES, PARAM_RULES, batch_sharding,
                                     cache_shardings, global_batch, local_rows, make_mesh, mesh_from_spec,
                                     opt_state_shardings, param_shardings, param_spec, row_shards, shard_batch,
                                     shard_cache, shard_params, shard_train_state, shard_train_step)

__all__ = [
    "AXES", "BATCH_AXES", "CACHE_RULES", "PARAM_RULES", "agree_max", "agree_max_many", "allgather_ints",
    "allgather_json", "batch_sharding", "broadcast_json", "cache_shardings", "check_same_rows", "constrain_rows",
    "distributed_settings", "fetch_rows", "gather_to_host", "global_batch", "is_main_process", "local_copy",
    "local_mesh", "local_rows", "log0", "make_mesh", "maybe_initialize_distributed", "mean_over_processes",
    "mesh_from_spec", "opt_state_shardings", "param_shardings", "param_spec", "process_block", "put_replicated",
    "put_rows", "row_shards", "rows_multiple", "shard_batch", "shard_cache", "shard_params", "shard_train_state",
    "shard_train_step", "spans_processes",
]
