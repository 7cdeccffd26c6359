"""Import and export of HF-format checkpoint folders (config.json + safetensors)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

import jax
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from jaxrl_mt.models.config import ModelConfig, ModelError
from jaxrl_mt.models.decoder import Params, param_shapes

# (our layer key, HF suffix under model.layers.{i}., transpose)
_LAYER_MAP = (
    ("attn_norm", "input_layernorm.weight", False),
    ("q", "self_attn.q_proj.weight", True),
    ("k", "self_attn.k_proj.weight", True),
    ("v", "self_attn.v_proj.weight", True),
    ("o", "self_attn.o_proj.weight", True),
    ("q_bias", "self_attn.q_proj.bias", False),
    ("k_bias", "self_attn.k_proj.bias", False),
    ("v_bias", "self_attn.v_proj.bias", False),
    ("q_norm", "self_attn.q_norm.weight", False),
    ("k_norm", "self_attn.k_norm.weight", False),
    ("mlp_norm", "post_attention_layernorm.weight", False),
    ("gate", "mlp.gate_proj.weight", True),
    ("up", "mlp.up_proj.weight", True),
    ("down", "mlp.down_proj.weight", True),
)


def read_config(folder: str | os.PathLike) -> ModelConfig:
    """Reads `config.json` of an HF folder into a ModelConfig."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ModelError(f"{path}: no config.json (not an HF model folder)")
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelError(f"{path}: invalid JSON ({e})") from None
    return ModelConfig.from_hf_dict(d, where=str(path))


def _safetensor_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise ModelError(f"{index}: invalid index ({e})") from None
        files = sorted({folder / f for f in weight_map.values()})
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{folder}: no *.safetensors files")
    for f in files:
        if not f.is_file():
            raise ModelError(f"{f}: missing safetensors file listed in the index")
    return files


def read_tensors(folder: str | os.PathLike) -> dict[str, np.ndarray]:
    """All tensors of the folder's safetensors files, as fp32 numpy arrays."""
    out: dict[str, np.ndarray] = {}
    for f in _safetensor_files(Path(folder)):
        try:
            with safe_open(str(f), framework="flax") as sf:  # flax: reads bf16 too
                for name in sf.keys():
                    out[name] = np.asarray(sf.get_tensor(name), dtype=np.float32)
        except (SafetensorError, OSError, ValueError) as e:
            raise ModelError(f"{f}: unreadable safetensors file ({e})") from None
    return out


def params_from_hf(cfg: ModelConfig, tensors: Mapping[str, np.ndarray], *, where: str = "") -> Params:
    """Maps HF tensor names onto our stacked pytree, checking every name and shape."""
    shapes = param_shapes(cfg)
    where = f"{where}: " if where else ""

    def get(name: str, shape: tuple[int, ...], transpose: bool) -> np.ndarray:
        if name not in tensors:
            raise ModelError(f"{where}missing tensor {name!r}")
        a = tensors[name]
        a = a.T if transpose else a
        if a.shape != shape:
            got = a.T.shape if transpose else a.shape
            want = shape[::-1] if transpose else shape
            raise ModelError(f"{where}tensor {name!r} has shape {tuple(got)}, expected {tuple(want)}")
        return a

    pd = cfg.jnp_param_dtype
    layers: dict[str, Any] = {}
    for key, suffix, tr in _LAYER_MAP:
        if key not in shapes["layers"]:
            continue
        per = shapes["layers"][key][1:]
        layers[key] = np.stack([get(f"model.layers.{i}.{suffix}", per, tr) for i in range(cfg.num_layers)])
    params: Params = {
        "embed": get("model.embed_tokens.weight", shapes["embed"], False),
        "layers": layers,
        "final_norm": get("model.norm.weight", shapes["final_norm"], False),
    }
    if not cfg.tie_word_embeddings:
        params["lm_head"] = get("lm_head.weight", shapes["lm_head"], True)
    return jax.tree_util.tree_map(lambda a: jax.numpy.asarray(a, pd), params)


def params_to_hf(cfg: ModelConfig, params: Params) -> dict[str, np.ndarray]:
    """Inverse of params_from_hf: HF tensor names to contiguous fp32 numpy arrays."""
    p = jax.tree_util.tree_map(lambda a: np.asarray(jax.device_get(a), np.float32), params)
    out = {"model.embed_tokens.weight": p["embed"], "model.norm.weight": p["final_norm"]}
    for key, suffix, tr in _LAYER_MAP:
        if key not in p["layers"]:
            continue
        for i in range(cfg.num_layers):
            a = p["layers"][key][i]
            out[f"model.layers.{i}.{suffix}"] = a.T if tr else a
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = p["lm_head"].T
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def load_hf_folder(folder: str | os.PathLike, *, param_dtype: str = "float32",
                   dtype: str = "float32") -> tuple[ModelConfig, Params]:
    """Loads config and parameters of an HF-format folder."""
    cfg = read_config(folder).replace(param_dtype=param_dtype, dtype=dtype)
    return cfg, params_from_hf(cfg, read_tensors(folder), where=str(folder))


def generation_config(cfg: ModelConfig) -> dict[str, Any]:
    eos = list(cfg.eos_token_id)
    return {"bos_token_id": cfg.bos_token_id,
            "eos_token_id": eos[0] if len(eos) == 1 else eos,
            "pad_token_id": cfg.pad_token_id, "do_sample": False}


class ExportError(ModelError):
    """An export folder that cannot be written (unwritable place, full disk); the old folder is kept."""


def export_hf_folder(cfg: ModelConfig, params: Params, out_dir: str | os.PathLike, *,
                     tokenizer: Any = None, extra_files: Iterable[Path] = ()) -> Path:
    """Writes an HF folder that transformers loads as is; atomic.

    Files: config.json, model.safetensors, generation_config.json and, when a tokenizer is
    given, its files (tokenizer.json, tokenizer_config.json, chat template, ...). They are written
    into a temporary folder beside ``out_dir`` that is then renamed to it; an existing folder is
    renamed away first and deleted only once the new one is in place, so a failed export leaves it
    as it was.

    Raises:
      ExportError: the folder cannot be written (one line naming it and the cause).
    """
    out = Path(out_dir)
    tmp = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        (tmp / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2))
        (tmp / "generation_config.json").write_text(json.dumps(generation_config(cfg), indent=2))
        tensors = {k: v.astype(cfg.jnp_param_dtype, copy=False) for k, v in params_to_hf(cfg, params).items()}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        for f in extra_files:
            shutil.copy(f, tmp / Path(f).name)
        _swap_in(tmp, out)
    except (OSError, SafetensorError) as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        why = getattr(e, "strerror", None) or " ".join(str(e).split())
        if "No space left on device" in why:  # also safetensors' "Error while serializing: I/O error: ..."
            why = "No space left on device"
        elif isinstance(e, FileExistsError) and e.filename and not os.path.isdir(e.filename):
            why = f"{e.filename} is a file, not a folder"  # mkdir's "File exists" for a file in the path
        elif getattr(e, "filename", None) and str(e.filename) != str(out):
            why += f": {e.filename}"
        kept = "; the previous folder is kept" if out.is_dir() else ""
        raise ExportError(f"cannot write the export folder {out} ({why}){kept}") from None
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _swap_in(tmp: Path, out: Path) -> None:
    """Renames ``tmp`` to ``out``; an existing ``out`` is moved aside first and restored on failure."""
    if not out.exists():
        os.replace(tmp, out)
        return
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
