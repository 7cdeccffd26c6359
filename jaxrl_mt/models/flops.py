"""Model FLOPs of the decoder and the peak rates of accelerators: the arithmetic of an MFU.

Shared by the accelerator benchmark (``benchmarks.roofline``, ``benchmarks.accel``) and the trainer's
per-step MFU (``rl.metrics_log.PhaseClock``). Peaks are per JAX device (one GPU, one TPU chip: v4 and
v5p chips are one JAX device each), dense bf16 matrix FLOP/s (no 2:4 sparsity) and HBM bytes/s, from
the vendors' data sheets.

FLOPs of the decoder (PaLM's model-FLOPs convention, Chowdhery et al. 2022, appendix B):

    N = L * (D*(Hq + 2*Hkv)*K + Hq*K*D + 3*D*F) + V*D     # parameters in matrix products:
                                                          # q/k/v, o, gate/up/down, LM head (tied or not);
                                                          # the embedding gather, norms and biases excluded
    forward FLOPs per token at sequence length T = 2*N + 4*L*Hq*K*T      # + QK^T and PV over all T keys
    train FLOPs per token (forward + backward)   = 6*N + 12*L*Hq*K*T     # 3 x forward
    MFU = tokens * FLOPs per token / seconds / peak bf16 FLOP/s

The attention term counts all T keys per query (not T/2 for the causal mask): the decoder
computes the full T x T score matrix. MFU counts model FLOPs only, so rematerialisation's
second forward does not raise it.
"""

from __future__ import annotations

import dataclasses
import re

from jaxrl_mt.models.config import ModelConfig

__all__ = ["PEAKS", "DevicePeak", "attention_flops_per_token", "forward_flops_per_token", "fraction", "lookup_peak",
           "matmul_params", "mfu", "train_flops_per_token"]


@dataclasses.dataclass(frozen=True)
class DevicePeak:
    """Peak rates of one JAX device."""

    name: str  # the device, as the table shows it
    pattern: str  # regex matched (re.search) against the lower-cased `device_kind`
    bf16_tflops: float  # dense bf16 matrix TFLOP/s (1e12)
    hbm_gb_s: float  # HBM (L4, A10G: GDDR6) bandwidth in GB/s (1e9)


# Order matters: the first match wins (PCIe before the SXM catch-all of the same chip).
PEAKS: tuple[DevicePeak, ...] = (
    # NVIDIA H100 data sheet (nvidia.com/en-us/data-center/h100): BF16 1,979 (SXM) / 1,513 (PCIe) TFLOPS
    # "with sparsity" -> half dense; GPU memory bandwidth 3.35 TB/s (SXM, HBM3) / 2 TB/s (PCIe, HBM2e).
    DevicePeak("NVIDIA H100 PCIe", r"\bh100\b.*pcie", 756.5, 2000.0),
    DevicePeak("NVIDIA H100 SXM", r"\bh100\b(?!.*\b(pcie|nvl)\b)", 989.5, 3350.0),  # kind "NVIDIA H100 80GB HBM3"
    # NVIDIA H200 data sheet (nvidia.com/en-us/data-center/h200): H200 SXM BF16 1,979 TFLOPS with sparsity,
    # 4.8 TB/s HBM3e. The NVL (PCIe) part has a lower peak and is left out (unknown) on purpose.
    DevicePeak("NVIDIA H200 SXM", r"\bh200\b(?!.*\bnvl\b)", 989.5, 4800.0),
    # NVIDIA A100 data sheet (nvidia.com/en-us/data-center/a100): BF16 tensor core 312 TFLOPS dense (all
    # variants); bandwidth 1,555 GB/s (40GB), 2,039 GB/s (80GB SXM), 1,935 GB/s (80GB PCIe).
    # Kinds: "NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe".
    DevicePeak("NVIDIA A100 40GB", r"\ba100\b.*\b40gb\b", 312.0, 1555.0),
    DevicePeak("NVIDIA A100 80GB PCIe", r"\ba100\b(?=.*\b80gb\b)(?=.*pcie)", 312.0, 1935.0),
    DevicePeak("NVIDIA A100 80GB SXM", r"\ba100\b.*\b80gb\b", 312.0, 2039.0),
    # NVIDIA L4 data sheet (nvidia.com/en-us/data-center/l4): BF16 242 TFLOPS with sparsity; 300 GB/s GDDR6.
    DevicePeak("NVIDIA L4", r"^nvidia l4$", 121.0, 300.0),
    # A10G (AWS g5): NVIDIA publishes no data sheet; 70 TFLOPS bf16 dense as used by levanter's flop_utils,
    # citing baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference; 600 GB/s GDDR6 (AWS g5 page).
    DevicePeak("NVIDIA A10G", r"^nvidia a10g$", 70.0, 600.0),
    # Google Cloud TPU docs (cloud.google.com/tpu/docs/v4, v5e, v5p, v6e), per chip:
    # v4 275 TFLOPS bf16, 1,200 GB/s; v5e 197, 819 GB/s; v5p 459, 2,765 GB/s; v6e 918, 1,640 GB/s.
    # JAX device kinds: "TPU v4", "TPU v5 lite" (v5e), "TPU v5" (v5p), "TPU v6 lite" (v6e); "TPU v4 lite" is v4i.
    DevicePeak("TPU v4", r"^tpu v4$", 275.0, 1200.0),
    DevicePeak("TPU v5e", r"^tpu v5( lite|e)$", 197.0, 819.0),
    DevicePeak("TPU v5p", r"^tpu v5p?$", 459.0, 2765.0),
    DevicePeak("TPU v6e", r"^tpu v6( lite|e)$", 918.0, 1640.0),
)


def lookup_peak(device_kind: str) -> DevicePeak | None:
    """The peak of a JAX `device_kind` (e.g. "NVIDIA H100 80GB HBM3", "TPU v5 lite"); None if unknown."""
    kind = " ".join(device_kind.lower().split())
    return next((p for p in PEAKS if re.search(p.pattern, kind)), None)


def matmul_params(cfg: ModelConfig) -> int:
    """N: parameters taking part in matrix products per token (see the module doc)."""
    d, f, k = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    hq, hkv = cfg.num_heads, cfg.num_kv_heads
    per_layer = d * (hq + 2 * hkv) * k + hq * k * d + 3 * d * f
    return cfg.num_layers * per_layer + cfg.vocab_size * d


def attention_flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Forward FLOPs of QK^T and PV for one query over `seq_len` keys, all layers: 4*L*Hq*K*T."""
    return 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq_len


def forward_flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """2*N + 4*L*Hq*K*T: model FLOPs of one token's forward pass in a sequence of `seq_len`."""
    return 2 * matmul_params(cfg) + attention_flops_per_token(cfg, seq_len)


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """6*N + 12*L*Hq*K*T: forward + backward (3 x forward)."""
    return 3 * forward_flops_per_token(cfg, seq_len)


def fraction(rate: float, peak: float | None) -> float | None:
    """rate / peak, or None when the peak is unknown."""
    return None if peak is None else rate / peak


def mfu(tokens: int, flops_per_token: float, seconds: float, peak: DevicePeak | None) -> float | None:
    """Model FLOPs utilisation: tokens * FLOPs per token / seconds / peak bf16 FLOP/s (None: unknown peak)."""
    return fraction(tokens * flops_per_token / seconds, None if peak is None else peak.bf16_tflops * 1e12)
