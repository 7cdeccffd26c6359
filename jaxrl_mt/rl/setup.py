"""Start-up of a training run: the device mesh, the policy and its frozen reference, the batch checks.

Pure functions of the typed config (``rl.run_config.TrainConfig``); each refuses what cannot run
with one ``ConfigError`` line before any step.
"""

from __future__ import annotations

import dataclasses

from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_mt.chat import ChatError, with_template_options
from jaxrl_mt.models.registry import Model, load_model
from jaxrl_mt.parallel import mesh_from_spec, rows_multiple, shard_params
from jaxrl_mt.rl.recipe import ConfigError
from jaxrl_mt.rl.run_config import TrainConfig

__all__ = ["check_micro_batch", "load_policy_model", "make_mesh", "reference"]


def make_mesh(c: TrainConfig) -> Any:
    """The device mesh of ``mesh_shape`` (``parallel.mesh_from_spec``: "auto", "none" or "data,fsdp,tensor")."""
    try:
        return mesh_from_spec(c.mesh_shape)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def load_policy_model(c: TrainConfig, mesh: Any) -> Model:
    """The policy model of ``c.model``, its parameters placed on ``mesh`` (when there is one)."""
    model = load_model(c.model, param_dtype=c.param_dtype, dtype=c.dtype, attention=c.attention)
    thinking = c.chat.enable_thinking if c.chat is not None else None
    if thinking is not None:  # every rendering (rollouts, histories, anchors, probe) passes it to the template
        try:
            model = dataclasses.replace(model, tokenizer=with_template_options(model.tokenizer,
                                                                               enable_thinking=thinking))
        except ChatError as e:
            raise ConfigError(f"chat.enable_thinking: {e}") from None
    return dataclasses.replace(model, params=shard_params(model.params, mesh))


def check_micro_batch(c: TrainConfig, mesh: Any) -> None:
    """Refuses a micro-batch that the mesh's data x fsdp shards of each process cannot split evenly
    (``rows_multiple``: 1 on one process, where nothing is refused)."""
    micro_rows = c.rl.rows // c.rl.grad_accum  # rl.batch_size (x rl.group_size with rollouts) / rl.grad_accum
    if micro_rows % rows_multiple(mesh):
        raise ConfigError(f"train micro-batch of {micro_rows} rows per process (rl.batch_size [* rl.group_size] "
                          f"/ rl.grad_accum) is not a multiple of {rows_multiple(mesh)}, this process's "
                          "share of the mesh's data x fsdp shards")


def reference(c: TrainConfig, policy: Model, mesh: Any, *, copy: bool = True) -> tuple[Any, Any]:
    """The frozen reference model: its own parameters and its own config.

    Default: a separate copy of the policy's initial parameters (the train step donates the
    policy's buffers, so the reference must not share them); ``copy=False`` (LoRA, where the
    base weights are never donated): the policy's initial parameters themselves. With
    ``ref_model``, that model under its own config (another depth or width is fine).

    Raises:
      ConfigError: the reference's token ids cannot mean the policy's (another vocabulary) or its
        context is shorter.
    """
    cfg = policy.cfg
    if not c.ref_model or c.ref_model == c.model:
        return (jax.tree_util.tree_map(jnp.copy, policy.params) if copy else policy.params), cfg
    ref = load_model(c.ref_model, param_dtype=c.param_dtype, dtype=c.dtype, with_tokenizer=False,
                     attention=c.attention)
    if ref.cfg.vocab_size != cfg.vocab_size:
        raise ConfigError(f"ref_model {c.ref_model!r} has a vocabulary of {ref.cfg.vocab_size} tokens, the policy "
                          f"{c.model!r} {cfg.vocab_size}: the reference must score the policy's token ids")
    if ref.cfg.max_position_embeddings < cfg.max_position_embeddings:
        raise ConfigError(f"ref_model {c.ref_model!r} has a context of {ref.cfg.max_position_embeddings} "
                          f"tokens, shorter than the policy's {cfg.max_position_embeddings}")
    return shard_params(ref.params, mesh), ref.cfg
