"""The memory table: exact parameter / optimizer / cache bytes, the activation formula, the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_mt import memory_table as mt
from jaxrl_mt.models.config import ModelConfig

ROOT = Path(__file__).resolve().parents[1]


def test_parameter_counts_match_the_published_models() -> None:
    # Hugging Face model cards / safetensors index totals of Qwen2.5-0.5B, -3B, -7B
    assert mt.n_params(mt.QWEN25["Qwen2.5-0.5B"]) == 494_032_768
    assert mt.n_params(mt.QWEN25["Qwen2.5-3B"]) == 3_085_938_688
    assert mt.n_params(mt.QWEN25["Qwen2.5-7B"]) == 7_615_616_512


def test_exact_bytes_of_params_adamw_and_cache() -> None:
    cfg = mt.QWEN25["Qwen2.5-0.5B"]
    n = 494_032_768
    assert mt.param_bytes(cfg) == 4 * n
    assert mt.param_bytes(cfg.replace(param_dtype="bfloat16")) == 2 * n
    # AdamW: mu + nu in the parameter dtype, plus two int32 counters (adam, lr schedule)
    assert mt.opt_state_bytes(cfg) == 8 * n + 8
    assert mt.opt_state_bytes(cfg.replace(param_dtype="bfloat16")) == 4 * n + 8
    # MultiSteps adds the accumulated gradient and two more counters
    assert mt.opt_state_bytes(cfg, grad_accum=4) == 12 * n + 16
    # 2 x L x B x S x Hkv x K x 4 bytes + B x S validity bytes + the int32 index
    assert mt.kv_cache_bytes(cfg, 8, 4096) == 2 * 24 * 8 * 4096 * 2 * 64 * 4 + 8 * 4096 + 4
    assert mt.kv_cache_bytes(cfg.replace(dtype="bfloat16"), 8, 4096) == 2 * 24 * 8 * 4096 * 2 * 64 * 2 + 8 * 4096 + 4


def test_lora_columns_by_hand() -> None:
    cfg = mt.QWEN25["Qwen2.5-0.5B"]  # 24 layers, D 896, F 4864, q 14 x 64, k/v 2 x 64
    D, F, q, kv, L, r = 896, 4864, 896, 128, 24, 16
    per_layer = r * ((D + q) + 2 * (D + kv) + (q + D) + 2 * (D + F) + (F + D))  # A [in, r] + B [r, out]
    lo, lo_opt = mt.lora_bytes(cfg, r)
    assert lo == 4 * L * per_layer and lo_opt == 2 * lo + 8  # fp32; AdamW mu + nu + two int32 counters
    row = mt.memory_row("x", cfg, 8, 1024, remat=True)
    assert row.lora_total == row.params + 2 * row.lora + row.lora_opt + row.act_remat
    assert row.rlsta_total == row.train_total + row.params  # full fine-tuning keeps a reference copy


def test_activation_formula_by_hand() -> None:
    cfg = ModelConfig(vocab_size=100, hidden_size=8, intermediate_size=16, num_layers=3, num_heads=2,
                      num_kv_heads=1, head_dim=4)
    B, T = 2, 5
    layer = B * T * 4 * (4 * 8 + 3 * 8 + 3 * 4 + 4 * 16) + B * 2 * T * T * (4 + 4)  # 5280 + 800
    head = 3 * B * 5 * 100 * 4  # chunk = min(128, T)
    assert layer == 6080 and head == 12000
    assert mt.activation_bytes(cfg, B, T, remat=False) == 3 * layer + head
    assert mt.activation_bytes(cfg, B, T, remat=True) == 3 * B * T * 8 * 4 + layer + head


def test_cli_prints_all_three_models() -> None:
    r = subprocess.run([sys.executable, "-m", "jaxrl_mt.memory_table", "--batch", "8", "--length", "4096",
                        "--param-dtype", "bf16", "--remat"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("| Qwen")]
    assert [row.split("|")[1].strip() for row in rows] == ["Qwen2.5-0.5B", "Qwen2.5-3B", "Qwen2.5-7B"]
    assert "| 0.494B | 0.92 | 0.92 | 1.84 | 0.38 |" in rows[0]  # bf16: 2 bytes/param, AdamW 4 bytes/param
    assert "parameters bfloat16, compute bfloat16" in r.stdout and "(remat)" in r.stdout


@pytest.mark.parametrize("args, msg", [(["--param-dtype", "fp16"],
                                        "--param-dtype must be one of fp32, bf16; got 'fp16'"),
                                       (["--models", "Qwen2.5-1B"], "unknown model 'Qwen2.5-1B'"),
                                       (["--batch", "0"], "must be >= 1")])
def test_cli_rejects_bad_values(args: list[str], msg: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        mt.main(args)
    assert e.value.code == 2
    assert msg in capsys.readouterr().err


TINY = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=8, tie_word_embeddings=True)


@pytest.mark.slow  # the suite budget (issue 52): 15 s
def test_measured_blockwise_temp_grows_linearly_einsum_quadratically() -> None:
    """Compiled memory_analysis of the scorer and the train step at 512 and 1024 tokens (blockwise: the
    [T, block_k] block scores are its largest temporaries, linear in T; blocks of 128 keys, so both
    lengths scan several blocks: a single block compiles to a smaller program)."""
    cfg = TINY.replace(attention_block=128)
    for program in ("score", "train"):
        got = {(impl, n): mt.measure("tiny", cfg, program, impl, n) for impl in ("einsum", "blockwise")
               for n in (512, 1024)}
        e = got["einsum", 1024].temp / got["einsum", 512].temp
        b = got["blockwise", 1024].temp / got["blockwise", 512].temp
        assert e > 3.0 and b < 2.3 and got["blockwise", 1024].temp < got["einsum", 1024].temp / 2, (program, e, b)
        # arguments: the fp32 parameters, int32 tokens and bool mask of one row, exactly
        assert got["blockwise", 1024].argument == mt.param_bytes(TINY) + 1024 * 4 + 1024
        assert {r.backend for r in got.values()} == {"cpu"}


def test_cli_measured_prints_ratios(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setitem(mt.QWEN25, "tiny", TINY)
    assert mt.main(["--measured", "--models", "tiny", "--batch", "1", "--lengths", "256,512",
                    "--programs", "score,prefill"]) == 0
    out = capsys.readouterr().out
    assert "compiled by XLA:CPU" in out and "| temp 256 | temp 512 | 512/256 | arguments |" in out
    assert sum(line.startswith("| tiny |") for line in out.splitlines()) == 4


@pytest.mark.parametrize("remat", [False, True])
def test_blockwise_masks_are_not_hoisted_out_of_the_layer_scan(remat: bool) -> None:
    """The block masks depend only on positions, the same in every layer; hoisted out of the layer
    scan they become a [blocks, B, Hkv, G, T, block_k] residual (the whole T x S mask per head):
    train-step temp bytes then grow ~3x per doubling here instead of 2x."""
    cfg = TINY.replace(num_heads=14, num_kv_heads=2, head_dim=16, attention_block=64)
    small, big = (mt.measure("tiny", cfg, "train", "blockwise", n, remat=remat).temp for n in (1024, 2048))
    assert big / small < 2.1, big / small
