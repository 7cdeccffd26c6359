"""The attention benchmark: its table arithmetic by hand, the parity check, one tiny end-to-end run."""

from __future__ import annotations

import json

import pytest

from jaxrl_mt.benchmarks import attention as bench


def _row(program: str, median: float, **kw) -> dict:
    row = {"program": program, "compile_s": 1.25, "times": [median], "median_s": median, "tokens_per_s": 200 / median,
           "tflops": 2.0, "mfu": None, "temp_bytes": 2**30, "cudnn_fmha_in_hlo": False, "pallas_in_hlo": False}
    return {**row, **kw}


def test_format_rows_by_hand() -> None:
    a = bench._parser().parse_args(["--length", "100", "--batch", "2", "--repeats", "3", "--shape", "tiny"])
    results = [{"impl": "einsum", "backend": "gpu", "device_kind": "NVIDIA H200", "jax": "0.11.2",
                "peak_bytes": 2**31, "peak_kind": "device",
                "rows": [_row("score", 2.0), _row("train", 4.0, mfu=0.1234)]},
               {"impl": "cudnn", "backend": "gpu", "device_kind": "NVIDIA H200", "jax": "0.11.2",
                "peak_bytes": 2**30, "peak_kind": "device",
                "rows": [_row("score", 0.5, cudnn_fmha_in_hlo=True),
                         {"program": "train", "oom": "RESOURCE_EXHAUSTED"}]}]
    lines = bench.format_rows(results, a).splitlines()
    assert lines[0] == ("2 x 100 tokens, tiny, float32, remat False, XLA:GPU (NVIDIA H200, jax 0.11.2), "
                        "median of 3")
    assert lines[4] == "| einsum | score | - | 1.2 | 2.000 | 100 | 2.0 | n/a | 1.00 | 2.00 (device) | 1.00 |"
    assert lines[5] == "| einsum | train | - | 1.2 | 4.000 | 50 | 2.0 | 0.123 | 1.00 | 2.00 (device) | 1.00 |"
    assert lines[6] == "| cudnn | score | cudnn | 1.2 | 0.500 | 400 | 2.0 | n/a | 1.00 | 1.00 (device) | 0.25 |"
    assert lines[7].startswith("| cudnn | train | | out of memory: RESOURCE_EXHAUSTED |")


@pytest.mark.slow  # suite budget: tests/models/test_attention.py checks the same kernels' values and gradients
def test_parity_on_cpu_is_within_the_issue_tolerances() -> None:
    """On the CPU only blockwise is a kernel-free implementation to compare: fp32, outputs within
    1e-5 absolute and gradients within 1e-4 relative of the einsum, for every padding case."""
    rows = bench.parity()
    assert {(r["impl"], r["case"]) for r in rows} == {("blockwise", c) for c in ("none", "left", "right", "hole")}
    for r in rows:
        assert r["dtype"] == "float32"
        assert r["out_max_abs"] < 1e-5 and max(r["grad_rel_q"], r["grad_rel_k"], r["grad_rel_v"]) < 1e-4, r


@pytest.mark.slow  # the suite budget (issue 52): 15 s
def test_tiny_run_of_every_program(capsys: pytest.CaptureFixture, tmp_path) -> None:
    out_json = tmp_path / "r.json"
    assert bench.main(["--shape", "tiny", "--length", "24", "--repeats", "1", "--block", "8", "--impls",
                       "einsum,blockwise", "--programs", "score,prefill,extend,train", "--json", str(out_json)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [(x.split(" | ")[0], x.split(" | ")[1]) for x in lines[-8:]] == [
        (f"| {i}", p) for i in ("einsum", "blockwise") for p in ("score", "prefill", "extend", "train")]
    r = json.loads(out_json.read_text())
    assert [x["impl"] for x in r["impls"]] == ["einsum", "blockwise"]
    # the prefill attends T keys, the general cached path T + S: fewer temp bytes, same tokens/s arithmetic
    rows = {x["program"]: x for x in r["impls"][0]["rows"]}
    assert rows["prefill"]["temp_bytes"] < rows["extend"]["temp_bytes"]
    for x in rows.values():
        assert x["tokens_per_s"] == pytest.approx(24 / x["median_s"])


def test_bad_arguments_fail_at_start(capsys: pytest.CaptureFixture) -> None:
    for args, msg in ((["--programs", "scroe"], "--programs: unknown ['scroe']"),
                      (["--impls", "flash"], "--impls: unknown ['flash']"),
                      (["--shape", "qwen9"], "--shape: unknown 'qwen9'"), (["--length", "0"], "--length must be >= 1")):
        with pytest.raises(SystemExit):
            bench.main(args)
        assert msg in capsys.readouterr().err
