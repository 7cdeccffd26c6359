"""The slot engine on a mesh over several processes: every process runs the same host loop on the global rows.

A call on such a mesh is collective: each process passes its own rows. `global_rows` gathers every
process's rows (prompts, budgets, row seeds, stop ids) to every process, in process order: the
global call is their concatenation, and each process keeps its own block of the outputs. Every
process then runs `sampling.scheduler.run_slots` on the same global rows: its decisions
(admissions, segments, compactions) depend only on those rows and on values read back from the
device in full on every process, so every process launches the same device programs with the same
shapes in the same order. `Transfers` moves the host loop's arrays: within one process as plain
`jnp.asarray` / `np.asarray` (no extra copy); across processes, host values (the same on every
process) go in replicated on the mesh and device values come out whole on every process.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np


class Transfers:
    """Host <-> device of one `run_slots` call on `mesh` (None or within one process: plain transfers).

    Across processes `get` is a collective: every process calls it with the same arrays in the
    same order (the host loops are identical, see the module doc).
    """

    def __init__(self, mesh: Any):
        from jaxrl_mt.parallel import spans_processes

        self.mesh, self.multi = mesh, spans_processes(mesh)

    def put(self, tree: Any) -> Any:
        """Host arrays (the same on every process) as device arrays: replicated on a multi-process mesh."""
        if not self.multi:
            return jax.tree_util.tree_map(jnp.asarray, tree)
        from jaxrl_mt.parallel import put_replicated

        return put_replicated(self.mesh, jax.tree_util.tree_map(np.asarray, tree))

    def get(self, *arrays: Any) -> tuple[np.ndarray, ...]:
        """Device arrays as whole host arrays (across processes: gathered from every process)."""
        if not self.multi:
            return tuple(np.asarray(x) for x in arrays)
        from jaxrl_mt.parallel import gather_to_host

        return tuple(gather_to_host(list(arrays)))

    def host_key(self, key: Any) -> Any:
        """The call's key, readable by this process alone (a key on a multi-process mesh: its host copy)."""
        if self.multi and isinstance(key, jax.Array) and not key.is_fully_addressable:
            return self.get(key)[0]
        return key


def _key_list(key: Any) -> list[int]:
    """The key's data as ints (for the check that every process passed the same key)."""
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    if isinstance(key, jax.Array) and not key.is_fully_addressable:
        key = key.addressable_data(0)
    return np.asarray(key).reshape(-1).tolist()


def global_rows(prompts: Sequence[Sequence[int]], budgets: np.ndarray, row_seeds: np.ndarray,
                stops: Sequence[Sequence[int]], group: int, what: Any, key: Any
                ) -> tuple[list[list[int]], np.ndarray, np.ndarray, list[list[int]], tuple[int, int]]:
    """Every process's rows of a collective call, concatenated in process order (a collective).

    Args:
      prompts: this process's U prompts (rows p0 x group, p1 x group, ...); budgets, row_seeds:
        its [U * group] rows' values; stops: its rows' stop-id lists.
      group: G, the same on every process (a group never straddles processes).
      what: the call's sampling settings, `key` its PRNG key: the same on every process (checked).

    Returns:
      (prompts, budgets, row_seeds, stops) of the global call, and this process's rows [lo, hi) in it.

    Raises:
      ValueError (on every process): the processes passed different groups, settings or keys.
    """
    from jaxrl_mt.parallel import allgather_json

    mine = {"prompts": [[int(t) for t in p] for p in prompts], "budgets": np.asarray(budgets).tolist(),
            "seeds": np.asarray(row_seeds).tolist(), "stops": [[int(t) for t in s] for s in stops],
            "same": [group, repr(what), _key_list(key)]}
    parts = allgather_json(mine)
    if any(p["same"] != parts[0]["same"] for p in parts):
        raise ValueError("a sampling call over several processes needs the same group size, sampling config and "
                         f"seed on every process, got {[p['same'] for p in parts]}")
    rows = [len(p["budgets"]) for p in parts]
    lo = sum(rows[: jax.process_index()])
    return ([q for p in parts for q in p["prompts"]], np.asarray([b for p in parts for b in p["budgets"]], np.int32),
            np.asarray([s for p in parts for s in p["seeds"]], np.uint32), [s for p in parts for s in p["stops"]],
            (lo, lo + rows[jax.process_index()]))


def check_same(obj: Any, what: str) -> None:
    """Refuses (on every process) a collective call whose JSON-able `obj` differs between processes
    (a collective: every process calls it; only a digest of `obj` is exchanged).

    Raises:
      ValueError: `what` names the call in the message.
    """
    import hashlib
    import json

    from jaxrl_mt.parallel import allgather_json

    digest = hashlib.sha256(json.dumps(obj, sort_keys=True, default=repr).encode()).hexdigest()
    digests = allgather_json(digest)
    if len(set(digests)) > 1:
        raise ValueError(f"{what} over several processes needs the same arguments on every process (a replicated "
                         f"caller), got {len(set(digests))} different ones")


def feeds_digest(feeds: Sequence[Any], what: Any, key: Any) -> list[Any]:
    """What must agree across processes in a `sampling.turns.run_turns` call: its first feeds, sampling
    settings and key."""
    rows = [[f.conv, [int(t) for t in f.tokens], int(f.seed), bool(f.fresh), f.budget,
             None if f.stop_ids is None else [int(t) for t in f.stop_ids], f.temperature, f.top_p,
             None if f.key is None else _key_list(f.key)] for f in feeds]
    return [rows, repr(what), _key_list(key)]
