"""Checks of a PEFT LoRA folder before its tensors reach the model: every flaw one ``ModelError`` line.

An adapter is loaded only when its ``adapter_config.json`` is a JSON object of the expected schema
(``peft_type`` LORA, ``r`` a positive integer, ``lora_alpha`` a finite positive number), its
``adapter_model.safetensors`` is readable and holds only LoRA A/B weights of known projections,
every tensor is 2-D floating point (float16, bfloat16, float32 or float64) of finite values, the
rank of every A and B equals the config's ``r``, the layer indices lie within the base model and
the shapes match the base's projections (A [r, in], B [out, r]).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl_mt.models.config import ModelConfig, ModelError

__all__ = ["FLOAT_DTYPES", "check_tensors", "load_tensors", "read_config"]

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
_NAME = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.([a-z_]+\.[a-z_]+)\.lora_([AB])\.weight")


def read_config(path: Path) -> tuple[dict[str, Any], int, float]:
    """``adapter_config.json`` as ``(config, rank, alpha)``.

    Raises:
      ModelError: ``path: ...`` for a file that is not UTF-8 JSON, not an object, not plain
        LoRA, or has a bad ``r`` / ``lora_alpha``.
    """
    try:
        conf = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ModelError(f"{path}: not a JSON file ({type(e).__name__}: {str(e)[:120]})") from None
    if not isinstance(conf, dict):
        raise ModelError(f"{path}: expected a JSON object, got {type(conf).__name__}")
    if conf.get("peft_type") != "LORA" or conf.get("use_rslora") or conf.get("fan_in_fan_out"):
        raise ModelError(f"{path}: only plain LoRA adapters are supported (peft_type LORA, no rsLoRA, "
                         "no fan_in_fan_out)")
    rank = conf.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ModelError(f"{path}: field 'r': expected a positive integer, got {json.dumps(rank)[:40]}")
    alpha = conf.get("lora_alpha", rank)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise ModelError(f"{path}: field 'lora_alpha': expected a finite positive number, got "
                         f"{json.dumps(alpha)[:40]}")
    return conf, rank, float(alpha)


def load_tensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of ``adapter_model.safetensors``.

    Raises:
      ModelError: ``path: unreadable safetensors file (...)`` for a truncated or damaged file.
    """
    from safetensors.numpy import load_file

    try:
        return load_file(str(path))
    except Exception as e:  # noqa: BLE001 (SafetensorError, OSError, a dtype numpy lacks: one line)
        raise ModelError(f"{path}: unreadable safetensors file ({type(e).__name__}: {str(e)[:160]})") from None


def _dims(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) of every adaptable projection of the base (TARGETS' module paths)."""
    d, f = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return {"self_attn.q_proj": (d, q), "self_attn.k_proj": (d, kv), "self_attn.v_proj": (d, kv),
            "self_attn.o_proj": (q, d), "mlp.gate_proj": (d, f), "mlp.up_proj": (d, f), "mlp.down_proj": (f, d)}


def check_tensors(path: Path, tensors: Mapping[str, np.ndarray], cfg: ModelConfig, rank: int) -> None:
    """Checks every tensor's name, layer, dtype, rank, shape and values against the base ``cfg``.

    Raises:
      ModelError: ``path: tensor NAME: ...`` for the first tensor that does not fit.
    """
    dims = _dims(cfg)
    for name in sorted(tensors):
        x = tensors[name]
        m = _NAME.fullmatch(name)
        if m is None or m.group(2) not in dims:
            raise ModelError(f"{path}: tensor {name!r}: not a LoRA A/B weight of a known projection "
                             f"({', '.join(dims)})")
        layer, module, which = int(m.group(1)), m.group(2), m.group(3)
        if layer >= cfg.num_layers:
            raise ModelError(f"{path}: tensor {name!r}: layer {layer}, but the base model has {cfg.num_layers} "
                             "layers (an adapter of another model?)")
        if x.dtype.name not in FLOAT_DTYPES:
            raise ModelError(f"{path}: tensor {name!r}: dtype {x.dtype.name}; expected one of "
                             f"{', '.join(FLOAT_DTYPES)}")
        d_in, d_out = dims[module]
        want = (rank, d_in) if which == "A" else (d_out, rank)
        if x.ndim != 2:
            raise ModelError(f"{path}: tensor {name!r}: {x.ndim}-D {list(x.shape)}; expected 2-D {list(want)}")
        got_rank = x.shape[0] if which == "A" else x.shape[1]
        if got_rank != rank:
            raise ModelError(f"{path}: tensor {name!r}: rank {got_rank} {list(x.shape)}, but adapter_config.json "
                             f"says r={rank}")
        if tuple(x.shape) != want:
            raise ModelError(f"{path}: tensor {name!r}: shape {list(x.shape)}; the base model's {module} needs "
                             f"{list(want)} (an adapter of another model?)")
        if not np.isfinite(x.astype(np.float32)).all():
            raise ModelError(f"{path}: tensor {name!r}: {int((~np.isfinite(x.astype(np.float32))).sum())} "
                             "non-finite values (NaN or Inf)")
