"""`python -m jaxrl_mt.benchmarks.engine`: a tiny smoke run of both modes.

transformers is the reference."""

from __future__ import annotations

import json

import pytest

from jaxrl_mt.benchmarks.engine import main, measure_bandwidth, measure_matmul_flops, random_prompts, two_roofs
from jaxrl_mt.models.config import ModelConfig
from tests.test_sampling import tiny_hf_llama


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "tiny"
    tiny_hf_llama(out)
    return out


def run_bench(tmp_path, capsys, *argv: str) -> tuple[dict, str]:
    out = tmp_path / "bench.json"
    assert main([*argv, "--repeats", "1", "--bandwidth-mb", "8", "--json", str(out)]) == 0
    return json.loads(out.read_text()), capsys.readouterr().out


def check_numbers(r: dict, tokens: int) -> None:
    for side in ("ours", "transformers"):
        s = r[side]
        assert s["tokens_per_s"] == pytest.approx(tokens / s["steady_s"])
        assert s["roofline_fraction"] == pytest.approx(s["steps_per_s"] / r["roofline_steps_per_s"])
        assert s["first_s"] > 0 and s["steady_s"] >= s["best_s"] > 0
    assert r["ratio_tokens_per_s"] == pytest.approx(r["ours"]["tokens_per_s"] / r["transformers"]["tokens_per_s"])
    assert r["roofline_steps_per_s"] == pytest.approx(r["bandwidth_gb_s"] * 1e9 / r["param_bytes"])
    assert r["torch_threads"] == r["cpus"]


def test_sampling_smoke(folder, tmp_path, capsys):
    # shapes (batch 4, prompt 32, 32 new) as in test_sampling, so a full run compiles them once
    r, text = run_bench(tmp_path, capsys, "sampling", "--model", str(folder), "--batch", "3", "--new-tokens", "20",
                        "--prompt-len", "9")
    assert r["prompt_lens"] == [9, 8, 6]
    check_numbers(r, 3 * 20)
    assert r["agree_rows"] == 3  # greedy parity with transformers on the same weights
    for side in ("ours", "transformers"):
        s = r[side]
        assert s["decode_s"] == pytest.approx(max(s["steady_s"] - s["prefill_s"], 1e-9))
        assert s["decode_tokens_per_s"] == pytest.approx(3 * 19 / s["decode_s"])
    assert r["ratio_decode_tokens_per_s"] == pytest.approx(r["ours"]["decode_tokens_per_s"]
                                                           / r["transformers"]["decode_tokens_per_s"])
    assert "decode loop alone" in text
    # the compute roof: the step's FLOPs (2*N + attention over the mean context 9 + 20/2 = 19) x 3 rows
    from jaxrl_mt.benchmarks.roofline import forward_flops_per_token
    from jaxrl_mt.models.registry import load_model

    cfg = load_model(str(folder), with_tokenizer=False).cfg
    assert r["decode_flops_per_step"] == 3 * forward_flops_per_token(cfg, 19)
    assert r["compute_roof_steps_per_s"] == pytest.approx(r["matmul_gflop_s"] * 1e9 / r["decode_flops_per_step"])
    assert r["two_roof_steps_per_s"] == min(r["compute_roof_steps_per_s"], r["roofline_steps_per_s"])
    assert r["ours"]["decode_two_roof_fraction"] == pytest.approx(r["ours"]["decode_steps_per_s"]
                                                                   / r["two_roof_steps_per_s"])
    assert "-bound on this host: two-roof limit" in text and "of the two-roof limit" in text
    assert "ratio ours / transformers" in text and "torch threads = " in text and "of roofline" in text


def test_scoring_smoke(folder, tmp_path, capsys):
    r, text = run_bench(tmp_path, capsys, "scoring", "--model", str(folder), "--batch", "4", "--prompt-len", "16")
    check_numbers(r, 4 * 16)
    assert r["max_abs_logprob_diff"] < 1e-4
    assert "teacher-forced" in text


def test_helpers():
    assert measure_bandwidth(8, repeats=2) > 1e8  # bytes/s: any machine reads faster than 100 MB/s
    assert measure_matmul_flops(128, repeats=2) > 1e8  # FLOP/s: any backend multiplies faster than 0.1 GFLOP/s


def test_two_roofs_by_hand():
    # L 2, D 4, F 8, Hq 2, Hkv 1, K 2, V 10: N = 2 * (4*(2+2)*2 + 2*2*4 + 3*4*8) + 10*4 = 2*144 + 40 = 328;
    # context 6 + 4/2 = 8: attention 4*2*2*2*8 = 256; per token 2*328 + 256 = 912; 2 rows: 1824 FLOPs
    cfg = ModelConfig(vocab_size=10, hidden_size=4, intermediate_size=8, num_layers=2, num_heads=2, num_kv_heads=1,
                      head_dim=2)
    r = two_roofs(cfg, batch=2, prompt_len=6, new_tokens=4, memory_roof=10.0, flops=18240.0)
    assert r["decode_flops_per_step"] == 1824
    assert r["compute_roof_steps_per_s"] == 10.0 and r["two_roof_steps_per_s"] == 10.0  # memory roof 10 too
    assert r["bound"] == "memory"  # a tie counts as memory-bound
    r = two_roofs(cfg, batch=2, prompt_len=6, new_tokens=4, memory_roof=10.0, flops=9120.0)
    assert (r["compute_roof_steps_per_s"], r["two_roof_steps_per_s"], r["bound"]) == (5.0, 5.0, "compute")
    rows = random_prompts(50, 4, 8, exclude=[7, 9])
    assert [len(r) for r in rows] == [8, 7, 6, 5]
    assert all(3 <= t < 50 and t not in (7, 9) for r in rows for t in r)
    assert random_prompts(50, 4, 8, exclude=[7, 9]) == rows  # deterministic


def test_unknown_model_exits_2(capsys):
    assert main(["sampling", "--model", "builtin:nope", "--no-reference"]) == 2
    assert capsys.readouterr().err.startswith("error: --model: unknown builtin model 'nope'")


def test_one_entry_point(capsys):
    """`python -m jaxrl_mt.benchmarks NAME` dispatches to the benchmark NAME."""
    from jaxrl_mt.benchmarks.__main__ import main as dispatch

    assert dispatch(["nope"]) == 2 and "sampling,scoring,workload,grpo,simulator" in capsys.readouterr().err
