"""Worker of tests/rl/test_mesh_grouped.py: 2-step GRPO runs of the Trainer under several meshes, in one process.

Run as ``python -m tests.rl._mesh_worker OUT.json MODEL_DIR ROOT`` with
``XLA_FLAGS=--xla_force_host_platform_device_count=8``. The first run (no mesh: one device) prepares
the items; every other run reads the same cached items, so the runs differ only in the mesh. For each
run it reports whether the trainer chose the grouped layout, the group of every rollout's example and
the per-step metrics.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

MESHES = ("none", "8,1,1", "2,2,2")
CACHES = ("histories.jsonl", "train_items.jsonl")


def main(out: str, model_dir: str, root: str) -> None:
    import jax

    from jaxrl_mt.rl.loop import Trainer
    from tests.rl.test_loop import tiny_config, train_rows

    assert jax.device_count() == 8, jax.devices()
    groups: list[int] = []
    real = Trainer.update

    def spy(self, state, ex):
        groups.append(ex.group)  # the rollout's example, as the update receives it
        return real(self, state, ex)

    Trainer.update = spy
    report = {}
    first = Path(root) / "none"
    for spec in MESHES:
        wd = Path(root) / spec.replace(",", "x")
        wd.mkdir(parents=True, exist_ok=True)
        if spec != "none":
            for name in CACHES:
                shutil.copy(first / name, wd / name)
        c = tiny_config(Path(model_dir), wd, steps=2)
        c.mesh_shape = spec
        c.data.heldout = 0
        c.rl.batch_size, c.rl.group_size = 4, 2  # 4 prompts, 8 completion rows: split over 8 / 4 row shards
        groups.clear()
        t = Trainer(c)
        mesh = None if t.mesh is None else dict(t.mesh.shape)
        grouped = t._grouped()
        t.run()
        report[spec] = {"mesh": mesh, "grouped": grouped, "groups": list(groups),
                        "rows": {str(k): v for k, v in train_rows(wd).items()}}
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:])
