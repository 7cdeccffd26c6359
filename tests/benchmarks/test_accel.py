"""`python -m jaxrl_mt.benchmarks accel`: a tiny end-to-end run on the CPU, the OOM skip path, the report.

The CPU has no entry in the peak table, so every fraction must be n/a while the raw rates are
real (float32 here: it compiles faster than bfloat16 on the CPU). The out-of-memory path is
driven by the hook `run_shape` calls before each measurement, raising the error XLA raises
(jax.errors.JaxRuntimeError, RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import pytest

from jaxrl_mt.benchmarks import roofline as rf
from jaxrl_mt.benchmarks.accel import SHAPES, ShapeBench, device_slug, is_oom, main, run_shape
from jaxrl_mt.benchmarks.accel_report import format_markdown

ARGS = ["--shape", "tiny", "--prompt-len", "8", "--new-tokens", "4", "--repeats", "1", "--dtype", "float32"]
OOM = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1073741824 bytes."


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[dict, str, Path]:
    out = tmp_path_factory.mktemp("accel")
    assert main([*ARGS, "--batch", "2,1", "--json", str(out / "{device}.json"),
                 "--markdown", str(out / "accel_{device}.md")]) == 0
    slug = device_slug(jax.devices()[0].device_kind)
    return json.loads((out / f"{slug}.json").read_text()), (out / f"accel_{slug}.md").read_text(), out


def test_tiny_run_has_every_row_and_na_fractions_on_cpu(tiny_run) -> None:
    r, md, _ = tiny_run
    assert r["device_kind"] == jax.devices()[0].device_kind and r["peak"] is None  # the CPU has no peak
    assert f"peak unknown for {r['device_kind']}" in md
    (shape,) = r["shapes"]
    assert shape["name"] == "tiny" and [row["batch"] for row in shape["rows"]] == [1, 2]
    cfg = SHAPES["tiny"].replace(param_dtype="float32", dtype="float32")
    for row in shape["rows"]:
        b = row["batch"]
        for phase in ("decode", "score", "train"):
            assert row[phase]["tokens_per_s"] > 0 and row[phase]["seconds"] > 0
        d = row["decode"]
        assert d["roofline_fraction"] is None
        assert d["tokens_per_s"] == pytest.approx(b * 3 / d["decode_s"])  # 4 new tokens: 3 decode steps
        assert d["bytes_per_step"] == rf.decode_bytes_per_step(cfg, batch=b, prompt_len=8, new_tokens=4,
                                                               param_bytes=shape["param_bytes"], itemsize=4)
        assert d["gb_per_s"] == pytest.approx(d["bytes_per_step"] * d["steps_per_s"] / 1e9)
        for phase, per_token in (("score", rf.forward_flops_per_token(cfg, 12)),
                                 ("train", rf.train_flops_per_token(cfg, 12))):
            s = row[phase]
            assert s["mfu"] is None and s["flops_per_token"] == per_token
            assert s["tokens_per_s"] == pytest.approx(b * 12 / s["seconds"])
            assert s["tflops"] == pytest.approx(s["tokens_per_s"] * per_token / 1e12)
        assert row["train"]["finite"] is True  # random weights, real GRPO loss: a finite step
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert len(table) == 3 and table[1].startswith("| 1 |") and table[2].startswith("| 2 |")
    for line in table[1:]:  # 9 value cells: the 3 fractions n/a, the 6 rates numbers
        cells = [c.strip() for c in line.strip("|").split("|")][1:]
        assert len(cells) == 9 and [i for i, c in enumerate(cells) if c == "n/a"] == [2, 5, 8]
        assert all(float(c.replace(",", "")) > 0 for i, c in enumerate(cells) if i not in (2, 5, 8))
    assert "Notes:" not in md and "2*N + 4*L*Hq*K*T" in md


def test_report_with_a_known_peak_shows_percentages(tiny_run) -> None:
    r = json.loads(json.dumps(tiny_run[0]))
    r["peak"] = {"name": "TPU v5e", "bf16_tflops": 197.0, "hbm_gb_s": 819.0}
    row = r["shapes"][0]["rows"][0]
    row["decode"]["roofline_fraction"], row["score"]["mfu"], row["train"]["mfu"] = 0.5, 0.123, 0.0456
    row["train"]["finite"] = False
    md = format_markdown(r)
    assert "- batch 1 train: non-finite loss or gradient" in md
    assert "197 TFLOP/s bf16 dense, 819 GB/s HBM" in md and "peak unknown" not in md
    line = next(x for x in md.splitlines() if x.startswith("| 1 |"))
    cells = [c.strip() for c in line.strip("|").split("|")][1:]
    assert (cells[2], cells[5], cells[8]) == ("50.0%", "12.3%", "4.6%")


def test_is_oom() -> None:
    assert is_oom(jax.errors.JaxRuntimeError(OOM)) and is_oom(MemoryError())
    assert is_oom(jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of "
                                             "memory in memory space hbm."))
    assert not is_oom(jax.errors.JaxRuntimeError("INVALID_ARGUMENT: shapes do not match"))
    assert not is_oom(ValueError("bad batch"))


def test_out_of_memory_is_skipped_with_a_note_and_larger_batches_not_run() -> None:
    bench = ShapeBench(SHAPES["tiny"], dtype="float32", prompt_len=8, new_tokens=4, repeats=1, remat=False, peak=None)
    calls = []

    def hook(phase: str, batch: int) -> None:
        calls.append((phase, batch))
        if batch == 2:
            raise jax.errors.JaxRuntimeError(OOM)

    rows = run_shape(bench, [4, 1, 2], phases=("score",), hook=hook)
    assert [r["batch"] for r in rows] == [1, 2, 4]
    assert calls == [("score", 1), ("score", 2)]  # batch 4 is not tried after batch 2 ran out of memory
    assert rows[0]["score"]["tokens_per_s"] > 0
    assert rows[1]["score"] == {"skipped": f"out of memory: {OOM}"}
    assert rows[2]["score"] == {"skipped": "not run: batch 2 did not fit"}
    r = {"device_kind": "cpu", "platform": "cpu", "device_count": 1, "jax_version": jax.__version__, "date": "",
         "peak": None, "dtype": "float32", "prompt_len": 8, "new_tokens": 4, "repeats": 1, "remat": False,
         "phases": ["score"], "shapes": [{"name": "tiny", "params": bench.n_params, "param_bytes": bench.param_bytes,
                                          "matmul_params": rf.matmul_params(bench.cfg),
                                          "config": json.loads(bench.cfg.to_json()), "rows": rows}]}
    md = format_markdown(r)
    assert "| 2 | skipped | skipped | skipped |" in md
    assert f"- batch 2 score: out of memory: {OOM}" in md and "- batch 4 score: not run: batch 2 did not fit" in md

    def failing(phase: str, batch: int) -> None:
        raise ValueError("not a memory error")

    with pytest.raises(ValueError, match="not a memory error"):  # anything else propagates
        run_shape(bench, [1], phases=("score",), hook=failing)


@pytest.mark.parametrize("argv, msg", [(["--shape", "qwen9"], "unknown ['qwen9']"),
                                       (["--batch", "1,0"], "expected positive integers"),
                                       (["--new-tokens", "1"], "--new-tokens must be >= 2"),
                                       (["--phases", "decode,nope"], "unknown ['nope']")])
def test_bad_arguments_exit_2(argv: list[str], msg: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err


def test_dispatch_and_device_slug(capsys) -> None:
    from jaxrl_mt.benchmarks.__main__ import main as dispatch

    with pytest.raises(SystemExit) as e:
        dispatch(["accel", "--shape", "nope"])
    assert e.value.code == 2 and "python -m jaxrl_mt.benchmarks accel" in capsys.readouterr().err
    assert device_slug("NVIDIA H100 80GB HBM3") == "nvidia_h100_80gb_hbm3"
    assert device_slug("TPU v5 lite") == "tpu_v5_lite" and device_slug("") == "device"
