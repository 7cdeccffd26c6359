"""Peak rates of accelerators and the roofline / MFU arithmetic of the accelerator benchmark.

The FLOPs and the peaks are ``models.flops``' (re-exported here; the trainer's per-step MFU uses
them too); the decode bytes below are this module's. Peaks are per JAX device (one GPU, one TPU
chip: v4 and v5p chips are one JAX device each), dense bf16 matrix FLOP/s (no 2:4 sparsity) and
HBM bytes/s, from the vendors' data sheets.

FLOPs of the decoder and MFU: see ``models.flops`` (PaLM's model-FLOPs convention).

Bytes read by one decode step of B rows whose queries attend C positions on average:

    bytes = W + 2 * L * B * Hkv * K * C * b      # weights + the K and V cache read at that length
    W     = bytes of all parameters, less an untied embedding table (only B of its rows are read)
    roofline fraction = decode steps/s * bytes / peak HBM bytes/s

For a decode of N new tokens after prompts of P tokens, steps 1..N-1 (the first token comes with
the prefill) attend P + i positions: C = P + N/2.
"""

from __future__ import annotations

from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.flops import (PEAKS, DevicePeak, attention_flops_per_token, forward_flops_per_token, fraction,
                                   lookup_peak, matmul_params, mfu, train_flops_per_token)

__all__ = ["PEAKS", "DevicePeak", "attention_flops_per_token", "decode_bytes_per_step", "forward_flops_per_token",
           "fraction", "hbm_fraction", "kv_bytes_read", "lookup_peak", "matmul_params", "mean_decode_context", "mfu",
           "train_flops_per_token", "weight_bytes_read"]


def weight_bytes_read(cfg: ModelConfig, param_bytes: int, itemsize: int) -> int:
    """W: parameter bytes one decode step reads (an untied embedding table is only gathered from)."""
    return param_bytes - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size * itemsize)


def kv_bytes_read(cfg: ModelConfig, batch: int, context: float, itemsize: int) -> float:
    """2*L*B*Hkv*K*C*b: the K and V cache of `batch` rows at `context` positions."""
    return 2 * cfg.num_layers * batch * cfg.num_kv_heads * cfg.head_dim * context * itemsize


def mean_decode_context(prompt_len: int, new_tokens: int) -> float:
    """C = P + N/2: mean positions attended by decode steps 1..N-1 (step i attends P + i)."""
    return prompt_len + new_tokens / 2


def decode_bytes_per_step(cfg: ModelConfig, *, batch: int, prompt_len: int, new_tokens: int, param_bytes: int,
                          itemsize: int) -> float:
    """W + KV: bytes one decode step reads on average over a decode of `new_tokens`."""
    return (weight_bytes_read(cfg, param_bytes, itemsize)
            + kv_bytes_read(cfg, batch, mean_decode_context(prompt_len, new_tokens), itemsize))


def hbm_fraction(bytes_per_step: float, steps_per_s: float, peak: DevicePeak | None) -> float | None:
    """Fraction of the HBM-bandwidth roofline: bytes per step * steps/s / peak bytes/s (None: unknown peak)."""
    return fraction(bytes_per_step * steps_per_s, None if peak is None else peak.hbm_gb_s * 1e9)
