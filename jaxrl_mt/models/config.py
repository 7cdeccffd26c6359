"""Model configuration for the Llama / Qwen2 / Qwen3 / SmolLM2 decoder family."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

import jax.numpy as jnp

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


class ModelError(ValueError):
    """A model, checkpoint or model spec that cannot be used; the message names the culprit."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a decoder-only transformer (HF `config.json` semantics)."""

    vocab_size: int  # number of token embeddings
    hidden_size: int  # residual stream width D
    intermediate_size: int  # SwiGLU inner width F
    num_layers: int  # number of decoder blocks L
    num_heads: int  # query heads Hq
    num_kv_heads: int  # key/value heads Hkv (GQA when < Hq)
    head_dim: int  # per-head width
    rope_theta: float = 10000.0  # RoPE base frequency
    rope_scaling: tuple[tuple[str, Any], ...] | None = None  # HF rope_scaling dict, as sorted items
    rms_norm_eps: float = 1e-6  # RMSNorm epsilon
    tie_word_embeddings: bool = False  # LM head shares the embedding matrix
    attention_bias: bool = False  # Qwen2: bias on q/k/v projections
    qk_norm: bool = False  # Qwen3: RMSNorm on per-head q and k
    max_position_embeddings: int = 2048  # context length
    architecture: str = "llama"  # "llama" | "qwen2" | "qwen3"
    bos_token_id: int | None = None  # beginning-of-sequence id
    eos_token_id: tuple[int, ...] = ()  # end-of-sequence ids
    pad_token_id: int | None = None  # padding id
    param_dtype: str = "float32"  # dtype of stored parameters
    dtype: str = "float32"  # compute dtype of activations
    attention: str = "auto"  # attention implementation (models.attention.IMPLS); static under jit
    attention_block: int = 512  # keys per block of the blockwise attention

    @property
    def rope_scaling_dict(self) -> dict[str, Any] | None:
        return dict(self.rope_scaling) if self.rope_scaling else None

    @property
    def jnp_dtype(self) -> Any:
        return jnp.dtype(self.dtype)

    @property
    def jnp_param_dtype(self) -> Any:
        return jnp.dtype(self.param_dtype)

    def replace(self, **kw: Any) -> "ModelConfig":
        return dataclasses.replace(self, **kw)

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any], *, where: str = "config.json") -> "ModelConfig":
        """Builds a config from a HF `config.json` dict; raises ModelError naming `where`."""
        archs = d.get("architectures") or []
        arch = None
        for a in archs:
            if a in SUPPORTED_ARCHITECTURES:
                arch = SUPPORTED_ARCHITECTURES[a]
        if arch is None:
            mt = d.get("model_type")
            if mt in ("llama", "qwen2", "qwen3") and not archs:
                arch = mt
            else:
                raise ModelError(
                    f"{where}: unsupported architecture {archs or mt!r}; supported: "
                    f"{sorted(SUPPORTED_ARCHITECTURES)}")
        if float(d.get("partial_rotary_factor", 1.0)) != 1.0:
            raise ModelError(f"{where}: partial_rotary_factor={d['partial_rotary_factor']} is not supported")
        if d.get("use_sliding_window"):
            raise ModelError(f"{where}: use_sliding_window=true is not supported")
        try:
            heads = int(d["num_attention_heads"])
            hidden = int(d["hidden_size"])
            rs = d.get("rope_scaling") or d.get("rope_parameters")
            rope_theta = d.get("rope_theta")
            if rs is not None:
                rs = dict(rs)
                rope_theta = rope_theta or rs.get("rope_theta")
                rtype = rs.get("rope_type", rs.get("type", "default"))
                if rtype not in _ROPE_TYPES:
                    raise ModelError(f"{where}: unsupported rope_scaling type {rtype!r}")
                rs["rope_type"] = rtype
                rs.pop("type", None)
                rs.pop("rope_theta", None)
                if rtype == "default":
                    rs = None
            eos = d.get("eos_token_id")
            eos_t = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
            return cls(
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_layers=int(d["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or hidden // heads),
                rope_theta=float(rope_theta or 10000.0),
                rope_scaling=tuple(sorted(rs.items())) if rs else None,
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                attention_bias=bool(d.get("attention_bias", arch == "qwen2")),
                qk_norm=arch == "qwen3",
                max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
                architecture=arch,
                bos_token_id=d.get("bos_token_id"),
                eos_token_id=eos_t,
                pad_token_id=d.get("pad_token_id"),
            )
        except KeyError as e:
            raise ModelError(f"{where}: missing field {e.args[0]!r}") from None

    def to_hf_dict(self) -> dict[str, Any]:
        """The HF `config.json` dict that transformers loads as this architecture."""
        arch_name = {v: k for k, v in SUPPORTED_ARCHITECTURES.items()}[self.architecture]
        d: dict[str, Any] = {
            "architectures": [arch_name],
            "model_type": self.architecture,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling_dict,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "torch_dtype": self.param_dtype,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": (list(self.eos_token_id) if len(self.eos_token_id) != 1
                             else self.eos_token_id[0]),
            "pad_token_id": self.pad_token_id,
        }
        if self.architecture == "llama":
            d["attention_bias"] = self.attention_bias
            d["mlp_bias"] = False
        if self.architecture == "qwen3":
            d["attention_bias"] = False
        return d

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)
