"""LoRA adapters as their own pytree: init, merge into the base weights, and PEFT's file format in and out.

An adapter of a target projection W [L, in, out] (the decoder's stacked layer weights: ``q``, ``k``,
``v``, ``o``, ``gate``, ``up``, ``down``) is a pair A [L, in, r], B [L, r, out]; the adapted weight is
W + (alpha / r) A B. B starts at zero (the adapted model is the base model), A as PEFT's default
(kaiming-uniform with a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in))). Targets are chosen by regex over the
layer keys, like the partition rules.

Files: PEFT's ``adapter_model.safetensors`` (``base_model.model.model.layers.{i}.<module>.lora_A.weight``
[r, in], ``lora_B.weight`` [out, r]) and ``adapter_config.json``, which ``peft.PeftModel.from_pretrained``
loads onto the transformers base model; and back (:func:`load_peft`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file, save_file

from jaxrl_mt.models.config import ModelConfig, ModelError
from jaxrl_mt.models.decoder import Params
from jaxrl_mt.models.lora_check import check_tensors, load_tensors, read_config

__all__ = ["LoraConfig", "TARGETS", "attach", "copy_peft", "init_adapters", "load_peft", "merge", "save_peft"]

# our layer key -> PEFT/transformers module path under model.layers.{i}.
TARGETS = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
           "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
_PREFIX = "base_model.model.model.layers"


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Adapter shape: rank r, scale alpha / r, target layer keys (a regex, full match)."""

    rank: int = 16
    alpha: float = 32.0
    targets: str = "q|k|v|o|gate|up|down"

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def keys(self) -> tuple[str, ...]:
        """The targeted layer keys, in TARGETS order.

        Raises:
          ValueError: a regex that matches no projection.
        """
        try:
            got = tuple(k for k in TARGETS if re.fullmatch(self.targets, k))
        except (re.error, TypeError) as e:
            raise ValueError(f"lora targets {self.targets!r} is not a regular expression ({e})") from None
        if not got:
            raise ValueError(f"lora targets {self.targets!r} match none of {', '.join(TARGETS)}")
        return got


def init_adapters(params: Params, lc: LoraConfig, key: jax.Array) -> Params:
    """``{"layers": {k: {"a": [L, in, r], "b": [L, r, out]}}}`` for every target key (B = 0)."""
    out = {}
    for i, k in enumerate(lc.keys()):
        w = params["layers"][k]  # [L, in, out]
        n_layers, d_in, d_out = w.shape
        bound = 1.0 / math.sqrt(d_in)
        a = jax.random.uniform(jax.random.fold_in(key, i), (n_layers, d_in, lc.rank), jnp.float32, -bound, bound)
        out[k] = {"a": a.astype(w.dtype), "b": jnp.zeros((n_layers, lc.rank, d_out), w.dtype)}
    return {"layers": out}


def merge(params: Params, adapters: Params, scale: float) -> Params:
    """The base parameters with every adapted weight replaced by W + scale A B (differentiable in A, B)."""
    layers = dict(params["layers"])
    for k, ab in adapters["layers"].items():
        delta = jnp.einsum("lir,lro->lio", ab["a"].astype(jnp.float32), ab["b"].astype(jnp.float32))
        layers[k] = (layers[k].astype(jnp.float32) + scale * delta).astype(layers[k].dtype)
    return {**params, "layers": layers}


def attach(params: Params, adapters: Params, scale: float) -> Params:
    """The base parameters with the adapters beside their weights, for the unmerged forward
    x W + (x scale A) B (`models.decoder.dense`): layer keys ``<k>_lora_a`` = scale A [L, in, r] and
    ``<k>_lora_b`` = B [L, r, out]. Differentiable in A and B; the backward holds no [in, out]
    weight gradient (the merged form's dL/dW'), only the adapters' and the [.., r] activations."""
    layers = dict(params["layers"])
    for k, ab in adapters["layers"].items():
        layers[k + "_lora_a"] = scale * ab["a"]
        layers[k + "_lora_b"] = ab["b"]
    return {**params, "layers": layers}


def save_peft(out_dir: str | os.PathLike, adapters: Params, lc: LoraConfig, *, base_model: str = "") -> Path:
    """Writes ``adapter_model.safetensors`` and ``adapter_config.json`` (PEFT's LoRA format)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for k, ab in adapters["layers"].items():
        a, b = np.asarray(ab["a"], np.float32), np.asarray(ab["b"], np.float32)
        for i in range(a.shape[0]):
            tensors[f"{_PREFIX}.{i}.{TARGETS[k]}.lora_A.weight"] = np.ascontiguousarray(a[i].T)  # [r, in]
            tensors[f"{_PREFIX}.{i}.{TARGETS[k]}.lora_B.weight"] = np.ascontiguousarray(b[i].T)  # [out, r]
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lc.rank, "lora_alpha": lc.alpha,
              "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
              "use_rslora": False, "init_lora_weights": True, "base_model_name_or_path": base_model or None,
              "target_modules": sorted(TARGETS[k].split(".")[-1] for k in adapters["layers"])}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def _peft_files(folder: str | os.PathLike) -> tuple[Path, Path]:
    """A PEFT folder's ``adapter_config.json`` and ``adapter_model.safetensors``; ModelError when either is missing."""
    folder = Path(folder)
    cpath, wpath = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not cpath.is_file() or not wpath.is_file():
        raise ModelError(f"{folder}: not a PEFT adapter (adapter_config.json and adapter_model.safetensors)")
    return cpath, wpath


def load_peft(folder: str | os.PathLike, cfg: ModelConfig) -> tuple[Params, LoraConfig]:
    """A PEFT LoRA folder as ``(adapters, LoraConfig)`` for a base model of config ``cfg``.

    The folder is checked first (``models.lora_check``): config schema, rank and alpha against the
    tensors, layer count and shapes against the base, dtypes, finite values.

    Raises:
      ModelError: a folder that is not a PEFT LoRA adapter of this model (one line naming the file
        and why).
    """
    cpath, wpath = _peft_files(folder)
    _, rank, alpha = read_config(cpath)
    tensors = load_tensors(wpath)
    check_tensors(wpath, tensors, cfg, rank)
    adapters: dict[str, dict[str, np.ndarray]] = {}
    for ours, path in TARGETS.items():
        if not any(f".{path}.lora_A." in name or f".{path}.lora_B." in name for name in tensors):
            continue
        a = [tensors.get(f"{_PREFIX}.{i}.{path}.lora_A.weight") for i in range(cfg.num_layers)]
        b = [tensors.get(f"{_PREFIX}.{i}.{path}.lora_B.weight") for i in range(cfg.num_layers)]
        if any(x is None for x in a + b):
            raise ModelError(f"{wpath}: {path} is not adapted in every one of {cfg.num_layers} layers")
        adapters[ours] = {"a": np.stack([x.T for x in a]).astype(np.float32),
                          "b": np.stack([x.T for x in b]).astype(np.float32)}
    if not adapters:
        raise ModelError(f"{wpath}: no LoRA weights of a known projection ({', '.join(TARGETS.values())})")
    lc = LoraConfig(rank=rank, alpha=alpha, targets="|".join(adapters))
    return {"layers": adapters}, lc


def copy_peft(src: str | os.PathLike, dst: str | os.PathLike, *, dtype: str = "float32") -> Path:
    """A copy of the PEFT LoRA folder ``src`` at ``dst`` with every tensor stored as ``dtype``.

    ``"bfloat16"`` halves an fp32 adapter (rank 16 on the embedded model: 19.6 -> 9.8 MB) at
    bfloat16's rounding (8 significant bits, fp32's range); ``load_peft`` reads it back as fp32, so
    the model evaluated from the copy is the copy's, not the original's.

    Raises:
      ModelError: ``src`` is not a PEFT adapter folder, or an unknown ``dtype``.
    """
    import ml_dtypes

    types = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
    if dtype not in types:
        raise ModelError(f"copy_peft: dtype must be one of {sorted(types)}, got {dtype!r}")
    cpath, wpath = _peft_files(src)
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    tensors = {k: np.ascontiguousarray(v.astype(types[dtype])) for k, v in load_file(str(wpath)).items()}
    save_file(tensors, str(dst / "adapter_model.safetensors"))
    (dst / "adapter_config.json").write_bytes(cpath.read_bytes())
    return dst
