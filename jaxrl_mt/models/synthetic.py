"""Synthetic-weights models: ``random:NAME[:SEED]``, a published architecture with random weights.

    random:qwen2.5-0.5b   random:qwen2.5-1.5b   random:qwen2.5-7b   random:tiny   (random:tiny:3: seed 3)

The shapes are those of the named model (``ARCHITECTURES``: Qwen2.5's published ``config.json``
values: GQA, q/k/v biases, RoPE theta 1e6, RMSNorm eps 1e-6, tied embeddings below 7B); the
tokenizer and chat template are the embedded model's (``builtin:smollm2-135m-instruct``), carried
with its vocabulary: the embedding has the tokenizer's ``vocab_size`` rows (49,152), not Qwen's
151,936, so every id the tokenizer makes has a row and every sampled id decodes. Nothing is
downloaded: the trainer, the evaluation and the server run the real code path at a big model's
shapes on a machine without model files (timings, memory; the replies are noise).

Weights: ``models.decoder.init_params`` (normal(0, 0.02) matrices and biases, unit norms) under
``jax.jit``, one ``jax.random`` key per leaf from the seed, so they are made on the default
device (no host copy of a 7B model) and are the same for the same (name, seed, param dtype).
``synthetic_shapes`` is the parameter tree's ``jax.eval_shape``: no weight is allocated.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from jaxrl_mt.models.config import ModelConfig, ModelError
from jaxrl_mt.models.decoder import Params, init_params

__all__ = ["ARCHITECTURES", "PREFIX", "SEED", "SyntheticSpec", "init_synthetic", "parse_spec", "synthetic_config",
           "synthetic_shapes"]

PREFIX = "random:"
SEED = 0  # the seed of a spec that names none
SCALE = 0.02  # std of the random matrices (init_params' default)

# Hugging Face Qwen/Qwen2.5-{0.5B,1.5B,7B}(-Instruct) config.json: Qwen2ForCausalLM, hidden_size,
# intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads (head_dim =
# hidden_size / heads), rope_theta 1e6, rms_norm_eps 1e-6, tie_word_embeddings true (0.5B, 1.5B) /
# false (7B), max_position_embeddings 32768, vocab_size 151936 (0.5B, 1.5B) / 152064 (7B).
# `tiny`: the same layout at a toy size (GQA 4:2, biases, tied), for CPU tests and smoke runs.
_QWEN25 = dict(rope_theta=1e6, rms_norm_eps=1e-6, attention_bias=True, architecture="qwen2",
               max_position_embeddings=32768)
ARCHITECTURES: dict[str, ModelConfig] = {
    "qwen2.5-0.5b": ModelConfig(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                                num_heads=14, num_kv_heads=2, head_dim=64, tie_word_embeddings=True, **_QWEN25),
    "qwen2.5-1.5b": ModelConfig(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
                                num_heads=12, num_kv_heads=2, head_dim=128, tie_word_embeddings=True, **_QWEN25),
    "qwen2.5-7b": ModelConfig(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
                              num_heads=28, num_kv_heads=4, head_dim=128, tie_word_embeddings=False, **_QWEN25),
    "tiny": ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=16, tie_word_embeddings=True, **_QWEN25),
}


@dataclasses.dataclass(frozen=True)
class SyntheticSpec:
    """A parsed ``random:NAME[:SEED]``."""

    name: str  # a key of ARCHITECTURES
    seed: int


def is_synthetic(spec: str) -> bool:
    """Whether a model spec names a synthetic model (``random:...``)."""
    return spec.startswith(PREFIX)


def parse_spec(spec: str) -> SyntheticSpec:
    """``random:NAME[:SEED]`` -> (NAME, SEED); ModelError naming the spec and the choices otherwise."""
    if not is_synthetic(spec):
        raise ModelError(f"model {spec!r}: not a {PREFIX}NAME spec")
    name, _, seed = spec[len(PREFIX):].partition(":")
    if name not in ARCHITECTURES:
        raise ModelError(f"unknown synthetic model {spec!r}; available: "
                         f"{', '.join(PREFIX + n for n in ARCHITECTURES)} (optionally :SEED)")
    if seed and not (seed.isdigit() and seed.isascii()):
        raise ModelError(f"model {spec!r}: the seed after {PREFIX}{name}: must be a non-negative integer")
    return SyntheticSpec(name, int(seed) if seed else SEED)


def synthetic_config(name: str, carried: ModelConfig, *, param_dtype: str = "float32",
                     dtype: str = "float32") -> ModelConfig:
    """The architecture ``name`` with the carried tokenizer's model's vocabulary and special ids.

    Args:
      name: a key of ``ARCHITECTURES``.
      carried: the config of the model whose tokenizer is carried (its ``vocab_size``, bos, eos, pad).
      param_dtype, dtype: the parameters' and the computation's dtypes.
    """
    return ARCHITECTURES[name].replace(vocab_size=carried.vocab_size, bos_token_id=carried.bos_token_id,
                                       eos_token_id=carried.eos_token_id, pad_token_id=carried.pad_token_id,
                                       param_dtype=param_dtype, dtype=dtype)


def _init(cfg: ModelConfig, seed: int) -> Params:
    return init_params(cfg, jax.random.PRNGKey(seed), scale=SCALE)


def init_synthetic(cfg: ModelConfig, seed: int = SEED) -> Params:
    """Random parameters of ``cfg`` (``init_params``), made by one jitted program on the default device."""
    return jax.jit(_init, static_argnums=(0, 1))(cfg, seed)


def synthetic_shapes(cfg: ModelConfig, seed: int = SEED) -> Any:
    """The parameter tree of ``init_synthetic(cfg, seed)`` as ``jax.ShapeDtypeStruct`` leaves: nothing allocated."""
    return jax.eval_shape(lambda: _init(cfg, seed))
