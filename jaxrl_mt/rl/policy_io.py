"""The policy of a finished (or running) training run, for evaluation and serving: ``load_policy``."""

from __future__ import annotations

import dataclasses

import json
import os
from pathlib import Path

import jax

from jaxrl_mt.checkpointing import Checkpointer
from jaxrl_mt.models.lora import LoraConfig, init_adapters, merge
from jaxrl_mt.models.registry import Model, load_model
from jaxrl_mt.rl.best import kept_params
from jaxrl_mt.rl.optim import optimizer_from_config
from jaxrl_mt.rl.run_config import typed_config
from jaxrl_mt.rl.state import RETIRED_KEYS

__all__ = ["load_policy"]


def load_policy(workdir: str | os.PathLike, step: int | None = None, *, attention: str = "auto") -> Model:
    """The policy of a training run: its base model with a checkpoint's parameters (a LoRA run's
    checkpoint holds adapters: merged onto the base). Imports no trainer (``rl.loop``): evaluation
    and serving load a checkpoint through this module alone.

    Args:
      workdir: the run's workdir (``config.json``, ``checkpoints/``).
      step: a training checkpoint's step; None: the policy the run exports, i.e. its kept best
        checkpoint (``<workdir>/best``: SFT's and DPO's lowest validation loss) when it keeps one, else its latest.
      attention: the attention implementation of the model's forwards (``models.attention.IMPLS``).
    """
    wd = Path(workdir)
    cfg_path = wd / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{wd}: not a training workdir (no config.json)")
    conf = typed_config(json.loads(cfg_path.read_text()))
    model = load_model(conf.model, param_dtype=conf.param_dtype, dtype=conf.dtype, attention=attention)
    lo = conf.lora
    lc = LoraConfig(rank=lo.rank, alpha=lo.alpha, targets=lo.targets) if lo is not None and lo.rank else None
    trained = model.params if lc is None else init_adapters(model.params, lc, jax.random.key(0))  # the structure
    kept = kept_params(wd, trained) if step is None else None
    if kept is None:
        ck = Checkpointer(wd / "checkpoints", read_only=True)
        if ck.latest_step() is None:
            raise FileNotFoundError(f"{wd}/checkpoints: no checkpoint")
        target = {"params": trained, "opt_state": optimizer_from_config(conf.rl).init(trained)}
        state, _ = ck.restore(step, target=target, retired=RETIRED_KEYS)
        ck.close()
        kept = state["params"]
    return dataclasses.replace(model, params=kept if lc is None else merge(model.params, kept, lc.scale),
                               spec=f"workdir:{wd}")
