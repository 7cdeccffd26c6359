"""The best checkpoint by a held-out metric (SFT's lowest validation loss), kept apart and exported.

``<workdir>/best/<step>`` holds the parameters of the best evaluation so far (one orbax step),
``<workdir>/best.json`` its step and value, so a resumed run keeps comparing with it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable

from jaxrl_mt.checkpointing import Checkpointer
from jaxrl_mt.parallel import broadcast_json
from jaxrl_mt.rl.workdir import check_finite_state

__all__ = ["BestKeeper", "kept_params"]

BEST_DIR, BEST_INFO = "best", "best.json"


def _restore(directory: Path, step: int, like: Any) -> Any:
    ck = Checkpointer(directory, read_only=True)
    try:
        arrays, _ = ck.restore(step, target={"params": like})
    finally:
        ck.close()
    return arrays["params"]


def kept_params(workdir: Path, like: Any) -> Any | None:
    """The parameters of the best checkpoint a run keeps (``<workdir>/best.json``), restored into ``like``'s
    structure; None when it keeps none (a run without a held-out selection metric, or none evaluated yet)."""
    info = Path(workdir) / BEST_INFO
    if not info.is_file():
        return None
    return _restore(Path(workdir) / BEST_DIR, int(json.loads(info.read_text())["step"]), like)


class BestKeeper:
    """Keeps the parameters of the evaluation with the best ``metric`` (``mode`` "min" or "max").

    Several processes: every process keeps one (the orbax save is collective: each writes its
    shards) and makes the same choice (the held-out metric is global; ``best.json`` is process 0's,
    read by process 0 and sent to the others); only ``write`` (process 0) writes ``best.json``.
    """

    def __init__(self, workdir: Path, metric: str, mode: str, *, enabled: bool = True, write: bool = True,
                 log: Callable[[str], None] = print):
        if mode not in ("min", "max"):
            raise ValueError(f"BestKeeper: mode must be min|max, got {mode!r}")
        self.metric, self.mode, self.enabled, self.write, self.log = metric, mode, enabled, write, log
        self.dir, self.info_path = workdir / BEST_DIR, workdir / BEST_INFO
        self.info: dict[str, Any] | None = broadcast_json(
            json.loads(self.info_path.read_text()) if write and self.info_path.exists() else None)

    def _better(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.info is None:
            return True
        best = self.info["value"]
        return value < best if self.mode == "min" else value > best

    def offer(self, step: int, params: Any, metrics: dict[str, float]) -> bool:
        """Saves ``params`` when ``metrics[metric]`` beats the best so far (step 0, the initial model, is
        not a training checkpoint and is never kept). Returns whether it was kept."""
        value = metrics.get(self.metric)
        if not self.enabled or step == 0 or value is None or not self._better(float(value)):
            return False
        check_finite_state(step, {"params": params})
        ck = Checkpointer(self.dir, max_to_keep=1)
        ck.save(step, {"params": params}, {"step": step, self.metric: float(value)}, force=True)
        ck.wait()
        ck.close()
        self.info = {"step": step, "value": float(value), "metric": self.metric}
        if self.write:
            tmp = self.info_path.with_name(self.info_path.name + ".tmp")
            tmp.write_text(json.dumps(self.info) + "\n")
            os.replace(tmp, self.info_path)
        self.log(f"best {self.metric} so far: {value:.4f} at step {step} (kept in {self.dir})")
        return True

    def params(self, like: Any) -> Any | None:
        """The kept parameters (restored into ``like``'s structure), or None when none is kept."""
        return None if self.info is None else _restore(self.dir, self.info["step"], like)
