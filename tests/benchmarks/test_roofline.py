"""The peak table lookup and the roofline / MFU arithmetic, on values worked out by hand."""

from __future__ import annotations

import math

import pytest

from jaxrl_mt.benchmarks.accel import SHAPES
from jaxrl_mt.benchmarks.roofline import (PEAKS, DevicePeak, attention_flops_per_token, decode_bytes_per_step,
                                          forward_flops_per_token, hbm_fraction, kv_bytes_read, lookup_peak,
                                          matmul_params, mean_decode_context, mfu, train_flops_per_token,
                                          weight_bytes_read)
from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import param_shapes

# device_kind strings as JAX reports them -> (table name, bf16 TFLOP/s, HBM GB/s)
KNOWN = {
    "NVIDIA H100 80GB HBM3": ("NVIDIA H100 SXM", 989.5, 3350.0),
    "NVIDIA H100 PCIe": ("NVIDIA H100 PCIe", 756.5, 2000.0),
    "NVIDIA H200": ("NVIDIA H200 SXM", 989.5, 4800.0),
    "NVIDIA A100-SXM4-40GB": ("NVIDIA A100 40GB", 312.0, 1555.0),
    "NVIDIA A100-PCIE-40GB": ("NVIDIA A100 40GB", 312.0, 1555.0),
    "NVIDIA A100-SXM4-80GB": ("NVIDIA A100 80GB SXM", 312.0, 2039.0),
    "NVIDIA A100 80GB PCIe": ("NVIDIA A100 80GB PCIe", 312.0, 1935.0),
    "NVIDIA L4": ("NVIDIA L4", 121.0, 300.0),
    "NVIDIA A10G": ("NVIDIA A10G", 70.0, 600.0),
    "TPU v4": ("TPU v4", 275.0, 1200.0),
    "TPU v5 lite": ("TPU v5e", 197.0, 819.0),
    "TPU v5e": ("TPU v5e", 197.0, 819.0),
    "TPU v5": ("TPU v5p", 459.0, 2765.0),
    "TPU v5p": ("TPU v5p", 459.0, 2765.0),
    "TPU v6 lite": ("TPU v6e", 918.0, 1640.0),
}


@pytest.mark.parametrize("kind", sorted(KNOWN))
def test_known_device_kinds(kind: str) -> None:
    p = lookup_peak(kind)
    assert p is not None and (p.name, p.bf16_tflops, p.hbm_gb_s) == KNOWN[kind]
    assert lookup_peak(kind.upper()) == p and lookup_peak(f"  {kind}  ") == p  # case and spaces do not matter


@pytest.mark.parametrize("kind", ["cpu", "TFRT_CPU_0", "TPU v4 lite", "TPU v3", "NVIDIA H100 NVL", "NVIDIA H200 NVL",
                                  "NVIDIA A10", "NVIDIA L40S", "NVIDIA GeForce RTX 4090", "TPU v6", ""])
def test_unknown_device_kinds(kind: str) -> None:
    assert lookup_peak(kind) is None


def test_every_table_entry_is_reachable() -> None:
    assert {v[0] for v in KNOWN.values()} == {p.name for p in PEAKS}


# a toy by hand: L=2, D=8, F=16, V=32, Hq=2, Hkv=1, K=4
TOY = ModelConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
                  head_dim=4, tie_word_embeddings=True)


def test_flops_worked_by_hand() -> None:
    # per layer: q/k/v 8*(2+2)*4 = 128, o 2*4*8 = 64, gate/up/down 3*8*16 = 384 -> 576; x2 layers + head 32*8
    assert matmul_params(TOY) == 2 * 576 + 256 == 1408
    assert attention_flops_per_token(TOY, 16) == 4 * 2 * 2 * 4 * 16 == 1024
    assert forward_flops_per_token(TOY, 16) == 2 * 1408 + 1024 == 3840
    assert train_flops_per_token(TOY, 16) == 6 * 1408 + 12 * 2 * 2 * 4 * 16 == 11520
    assert matmul_params(TOY.replace(tie_word_embeddings=False)) == 1408  # the head is a product either way


def test_decode_bytes_worked_by_hand() -> None:
    assert weight_bytes_read(TOY, 10_000, 2) == 10_000  # tied: the table is read whole, as the head
    assert weight_bytes_read(TOY.replace(tie_word_embeddings=False), 10_000, 2) == 10_000 - 32 * 8 * 2  # 9488
    assert kv_bytes_read(TOY, 3, 10, 2) == 2 * 2 * 3 * 1 * 4 * 10 * 2 == 960
    assert mean_decode_context(16, 8) == 20.0
    # 10000 + 2 (K, V) * 2 layers * 3 rows * 1 head * 4 dims * 20 positions * 2 bytes
    assert decode_bytes_per_step(TOY, batch=3, prompt_len=16, new_tokens=8, param_bytes=10_000, itemsize=2) == 11_920


def test_fractions_worked_by_hand() -> None:
    peak = DevicePeak("toy", "^toy$", bf16_tflops=1.0, hbm_gb_s=100.0)
    # 32 tokens x 3840 FLOPs in 1 us = 1.2288e11 FLOP/s of 1e12
    assert mfu(32, 3840, 1e-6, peak) == pytest.approx(0.12288)
    # 11920 bytes x 1e6 steps/s = 11.92 GB/s of 100 GB/s
    assert hbm_fraction(11_920, 1e6, peak) == pytest.approx(0.1192)
    assert mfu(32, 3840, 1e-6, None) is None and hbm_fraction(11_920, 1e6, None) is None


@pytest.mark.parametrize("name, total, non_embedding", [("qwen2.5-0.5b", 0.49, 0.36), ("qwen2.5-1.5b", 1.54, 1.31)])
def test_shapes_have_the_published_parameter_counts(name: str, total: float, non_embedding: float) -> None:
    """The model cards of Qwen2.5-0.5B/1.5B-Instruct: 0.49B / 1.54B parameters, 0.36B / 1.31B non-embedding."""
    cfg = SHAPES[name]
    n = sum(math.prod(s) for s in _leaves(param_shapes(cfg)))
    assert round(n / 1e9, 2) == total
    assert round((n - cfg.vocab_size * cfg.hidden_size) / 1e9, 2) == non_embedding
    assert cfg.tie_word_embeddings and cfg.architecture == "qwen2" and cfg.attention_bias
    assert cfg.hidden_size == cfg.num_heads * cfg.head_dim


def _leaves(tree: dict) -> list[tuple[int, ...]]:
    return [s for v in tree.values() for s in (_leaves(v) if isinstance(v, dict) else [v])]
