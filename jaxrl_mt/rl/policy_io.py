"""The policy of a finished (or running) training run, for evaluation and serving: ``load_policy``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from jaxrl_mt.checkpointing import Checkpointer
from jaxrl_mt.models.registry import Model, load_model
from jaxrl_mt.rl.optim import optimizer_from_config
from jaxrl_mt.rl.state import RETIRED_KEYS

__all__ = ["load_policy"]


def load_policy(workdir: str | os.PathLike, step: int | None = None) -> Model:
    """The policy of a training run: its base model with the checkpoint's parameters."""
    wd = Path(workdir)
    cfg_path = wd / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{wd}: not a training workdir (no config.json)")
    conf = json.loads(cfg_path.read_text())
    model = load_model(conf["model"], param_dtype=conf.get("param_dtype", "float32"),
                       dtype=conf.get("dtype", "float32"))
    ck = Checkpointer(wd / "checkpoints", read_only=True)
    if ck.latest_step() is None:
        raise FileNotFoundError(f"{wd}/checkpoints: no checkpoint")
    opt = optimizer_from_config(conf["rl"])
    target = {"params": model.params, "opt_state": opt.init(model.params)}
    state, _ = ck.restore(step, target=target, retired=RETIRED_KEYS)
    ck.close()
    model.params = state["params"]
    model.spec = f"workdir:{wd}"
    return model
