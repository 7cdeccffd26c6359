"""Worker of tests/rl/test_two_processes.py: one process of a Trainer run of SFT, DPO or RLAAR on mesh 2,2,1.

``python -m tests.rl._two_process_worker METHOD WORKDIR MODEL_DIR OUT.json [PER_PROCESS_BATCH]``

Two processes (``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` set, 2 CPU devices
each): ``rl.batch_size`` rows per process, each process drawing its own shard of the items (the
trainer's grain iterator, unpatched). One process (4 CPU devices, the same mesh): ``rl.batch_size``
doubled, and the data iterator yields the concatenation of the two shards' batches, so every step's
global batch (every process's rows, in process order) is the two processes'.

Writes OUT.json (process, devices, the item ids of every step) and, on process 0, OUT.npz: the
final policy parameters, gathered. METHOD ``sft-prepare``: SFT's data stage only, from nothing (the
histories and the filter's samples, split over the processes; the tiny model's rows are empty, so it
stops there with a ConfigError, after writing both caches).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

STEPS = 3


def config(method: str, workdir: str, model: str, batch: int) -> Any:
    """A tiny run of ``method`` (SFT and DPO: from the rows cached in the workdir)."""
    from configs import dpo, rlaar, sft

    if method == "sft-prepare":
        c = sft.get_config("cpu")
        c.data.limit, c.data.heldout, c.data.max_turns = 4, 0, 4
        c.history.max_new_tokens, c.rl.max_new_tokens, c.filter.k = 6, 8, 2
    elif method in ("sft", "dpo"):
        c = (sft if method == "sft" else dpo).get_config("cpu")
        c.rl.lr = 1e-2
        c.eval.every = 1
        if method == "sft":  # the held-out probe: greedy conversations before and after training
            c.eval.probe_source, c.eval.probe_limit, c.eval.probe_kinds = "synthetic:4:1", 2, "sharded"
            c.eval.max_new_tokens = 6
    else:
        c = rlaar.get_config("cpu")
        c.data.add_source, c.data.limit, c.data.heldout, c.data.max_turns = "synthetic:8:0", 8, 1, 4
        c.history.max_new_tokens = 4
        c.rl.group_size, c.rl.max_new_tokens, c.rl.lr, c.rl.remat = 2, 6, 1e-3, False
        c.eval.max_new_tokens = 6
    c.model, c.workdir, c.mesh_shape = model, workdir, "2,2,1"
    c.rl.steps, c.rl.batch_size = STEPS, batch
    c.checkpoint.every, c.log.samples_every, c.export = STEPS, 0, False
    return c


class BothShards:
    """The batches of two processes' grain shards, concatenated in process order (one process)."""

    def __init__(self, its: list[Any]):
        self.its = its

    def __iter__(self) -> "BothShards":
        return self

    def __next__(self) -> list[Any]:
        return [x for it in self.its for x in next(it)]

    def get_state(self) -> dict:
        return {str(i): it.get_state() for i, it in enumerate(self.its)}

    def set_state(self, state: dict) -> None:
        for i, it in enumerate(self.its):
            it.set_state(state[str(i)])


def main(method: str, workdir: str, model: str, out: str, batch: str = "2") -> None:
    import jax
    import numpy as np

    from jaxrl_mt import parallel
    from jaxrl_mt.rl import loop
    from jaxrl_mt.rl.loop import Trainer

    two = parallel.maybe_initialize_distributed()
    per = int(batch)
    if not two:  # one process holds both processes' rows
        real = loop.make_iterator

        def both(items: Any, *, batch_size: int, shard_index: int, shard_count: int, **kw: Any) -> BothShards:
            return BothShards([real(items, batch_size=per, shard_index=i, shard_count=2, **kw) for i in range(2)])

        loop.make_iterator = both
    seen: dict[str, Any] = {"items": []}
    train_step, write_outputs = Trainer.train_step, loop.write_outputs

    def step_spy(self: Trainer, state: Any, items: Any) -> Any:
        seen["items"].append([it.item_id for it in items])
        return train_step(self, state, items)

    def outputs_spy(c: Any, cfg: Any, tok: Any, params: Any, evals: Any, **kw: Any) -> Any:
        host = parallel.gather_to_host(params)  # collective: every process
        if jax.process_index() == 0:
            flat = {parallel.rules._path(kp): np.asarray(x) for kp, x in jax.tree_util.tree_flatten_with_path(host)[0]}
            np.savez(Path(out).with_suffix(".npz"), **flat)
        return write_outputs(c, cfg, tok, params, evals, **kw)

    Trainer.train_step, loop.write_outputs = step_spy, outputs_spy
    t = Trainer(config(method, workdir, model, per if two else 2 * per), log=lambda m: print(m, flush=True))
    if method == "sft-prepare":
        from jaxrl_mt.rl.recipe import ConfigError

        try:
            t.prepare()
        except ConfigError as e:  # no SFT row: the tiny model solves nothing
            print(f"prepare: {e}", flush=True)
    else:
        t.run()
    Path(out).write_text(json.dumps({"process": jax.process_index(), "processes": jax.process_count(),
                                     "devices": jax.device_count(), "mesh": dict(t.mesh.shape),
                                     "items": seen["items"]}))
    if two:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
