"""tpu/device_check.sh (`benchmarks.device_check`): its CPU form writes a JSON with every field and sane
values; a part that fails or overruns its budget is recorded while the others run; the report reads
the JSON alone; the shell wrapper runs exactly the Python command."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from jaxrl_mt.benchmarks.device_check import default_out, run_check
from jaxrl_mt.benchmarks.device_parts import EMBEDDED, OPTIONAL_PARTS, PARTS, SHAPES
from jaxrl_mt.benchmarks.device_report import format_markdown, summary

ROOT = Path(__file__).resolve().parents[2]
PHASES = ("perf/rollout_s", "perf/anchor_s", "perf/reference_s", "perf/update_s", "perf/step_s", "perf/compile_s",
          "perf/update_tokens_per_s", "perf/rollout_tokens_per_s")


def test_shell_wrapper_runs_the_python_command():
    r = subprocess.run(["bash", "tpu/device_check.sh", "--dry-run", "--shape", "tiny", "--out", "/tmp/o",
                        "--parts", "device,parity", "--budget", "parity=9"], cwd=ROOT, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "env XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 .venv/bin/python -m jaxrl_mt.benchmarks device_check --shape tiny "
        "--out /tmp/o --parts device,parity --budget parity=9"]
    bad = subprocess.run(["bash", "tpu/device_check.sh", "--dry-run", "--shape", "huge"], cwd=ROOT,
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "--shape must be full or tiny" in bad.stderr


def test_full_form_fits_eight_minutes_and_names_the_issue_sizes():
    full = SHAPES["full"]
    assert set(full.budgets) == set(PARTS + OPTIONAL_PARTS) and sum(full.budgets[p] for p in PARTS) <= 8 * 60
    assert full.memory_model == "qwen2.5-1.5b" and full.memory_lengths == (8192, 1024)
    assert full.accel_shapes == ("qwen2.5-0.5b", "qwen2.5-1.5b") and full.model == "random:qwen2.5-1.5b"
    assert (full.dtype, full.train_steps, full.lic_conversations) == ("bfloat16", 3, 32)
    assert full.parity_model == EMBEDDED and (full.parity_new_tokens, full.lic_max_new_tokens) == (32, 256)
    tiny = SHAPES["tiny"]
    assert (tiny.model, tiny.parity_model, tiny.dtype) == ("random:tiny", "random:tiny", "float32")


def test_default_out_is_OUT_else_the_device_folder(monkeypatch):
    monkeypatch.setenv("OUT", "/tmp/dev_out")
    assert default_out("NVIDIA H100 80GB HBM3") == Path("/tmp/dev_out")
    monkeypatch.delenv("OUT")
    assert default_out("NVIDIA H100 80GB HBM3") == Path("docs/results/device/nvidia_h100_80gb_hbm3")


def test_a_part_past_its_budget_is_recorded_and_the_rest_run(tmp_path):
    """`train` gets half a second (its process cannot even import the trainer): recorded as timed out,
    with no result; `device` after it still runs and passes; both files are written."""
    record, folder = run_check("tiny", ["train", "device"], tmp_path, budgets={"train": 0.5})
    assert folder == tmp_path
    train, dev = record["parts"]["train"], record["parts"]["device"]
    assert (train["ok"], train["timed_out"], train["budget_s"]) == (False, True, 0.5)
    assert train["error"] == "timed out after 0 s; no result written" and "result" not in train
    assert dev["ok"] is True and dev["result"]["platform"] == "cpu" and dev["result"]["device_count"] >= 1
    on_disk = json.loads((tmp_path / "device_check.json").read_text())
    assert on_disk["parts"].keys() == {"train", "device"} and on_disk["summary"]["parts_ok"] == {
        "train": False, "device": True}
    md = (tmp_path / "device_check.md").read_text()
    assert "| train | NO |" in md and "timed out after 0 s" in md and "| device | yes |" in md


def _fake_record() -> dict:
    accel_row = {"batch": 64, "decode": {"tokens_per_s": 5000.0, "roofline_fraction": 0.52},
                 "score": {"tokens_per_s": 9e4, "mfu": 0.41}, "train": {"skipped": "out of memory: x"}}
    small = {"batch": 16, "decode": {"tokens_per_s": 1500.0, "roofline_fraction": 0.2},
             "score": {"tokens_per_s": 3e4, "mfu": 0.3}, "train": {"tokens_per_s": 2e4, "mfu": 0.36}}
    steps = [{"step": 1, "perf/step_s": 90.0, "perf/compile_s": 60.0, "perf/rollout_s": 20.0},
             {"step": 2, "perf/step_s": 30.0, "perf/compile_s": 0.1, "perf/rollout_s": 15.0, "perf/update_mfu": 0.4}]
    parity = {"tokens_equal": 8, "all_tokens_equal": True, "logprob_max_abs_diff": 0.01, "logprobs_within_tol": True}
    return {"shape": "full", "command": "c", "date": "d", "total_s": 400.0, "parts": {
        "device": {"ok": True, "seconds": 3.0, "budget_s": 30, "result": {"device_kind": "NVIDIA H100 80GB HBM3",
                                                                           "platform": "gpu"}},
        "accel": {"ok": True, "seconds": 100.0, "budget_s": 120,
                  "result": {"shapes": [{"name": "qwen2.5-1.5b", "rows": [small, accel_row]}]}},
        "train": {"ok": True, "seconds": 150.0, "budget_s": 200,
                  "result": {"steps": steps, "steady": {"perf/step_s": 30.0, "perf/rollout_s": 15.0,
                                                        "perf/update_mfu": 0.4, "rollout_share": 0.5}}},
        "lic": {"ok": False, "seconds": 60.0, "budget_s": 60, "error": "timed out after 60 s"},
        "memory": {"ok": True, "seconds": 90.0, "budget_s": 240, "result": {"record": {
            "model": "qwen2.5-1.5b", "backend": "gpu", "remat": True, "step_peak": 30 * 2 ** 30,
            "step_peak_program": "update",
            "programs": {"anchor": {"peak": 2 ** 30}, "update": {"peak": 3 * 2 ** 30}}}}},
        "parity": {"ok": True, "seconds": 20.0, "budget_s": 50,
                   "result": {"dtypes": {"float32": parity, "bfloat16": {**parity, "tokens_equal": 6,
                                                                         "all_tokens_equal": False}}}}}}


def test_summary_and_report_read_the_record_alone():
    s = summary(_fake_record())
    assert s["parts_ok"] == {"device": True, "accel": True, "train": True, "lic": False, "memory": True,
                             "parity": True}
    assert s["memory"] == {"model": "qwen2.5-1.5b", "backend": "gpu", "remat": True, "step_peak_gib": 30.0,
                           "at": "update", "programs_gib": {"anchor": 1.0, "update": 3.0}}
    assert s["accel"] == {"qwen2.5-1.5b/decode": {"batch": 64, "tokens_per_s": 5000.0, "roofline_fraction": 0.52},
                          "qwen2.5-1.5b/score": {"batch": 64, "tokens_per_s": 9e4, "mfu": 0.41},
                          "qwen2.5-1.5b/train": {"batch": 16, "tokens_per_s": 2e4, "mfu": 0.36}}  # 64: skipped
    assert (s["train"]["steps"], s["train"]["first_step_compile_s"], s["train"]["rollout_share"]) == (2, 60.0, 0.5)
    assert s["lic"] == {"conversations": None, "conversations_per_s": None, "tokens_per_s": None}
    assert s["parity"]["bfloat16"]["tokens_equal"] == 6
    md = format_markdown({**_fake_record(), "summary": s})
    assert md.startswith("# Device check (full): NVIDIA H100 80GB HBM3")
    assert "| qwen2.5-1.5b/train | 16 | 20,000 | 0.36 |" in md
    assert "| 30 | 15 | n/a | n/a | n/a | 40.0% | 50.0% | n/a | 60 |" in md
    assert "| lic | NO | 60.0 | 60 | timed out after 60 s |" in md and "LiC evaluation" not in md
    assert "- parity bfloat16: greedy tokens equal the CPU's on 6 of 8 prompts (NO)" in md
    assert ("Whole RLSTA step compiled by XLA:GPU (qwen2.5-1.5b, one device, remat True): step peak 30.00 GiB at "
            "update; program peaks (GiB): anchor 1.00, update 3.00.") in md


def _check_full_tiny_record(r: dict) -> None:
    assert r["schema"] == 1 and r["shape"] == "tiny" and list(r["parts"]) == list(PARTS)
    bad = {k: v.get("error") for k, v in r["parts"].items() if not v["ok"]}
    assert not bad, (bad, {k: v.get("log_tail", "")[-1500:] for k, v in r["parts"].items() if not v["ok"]})
    for part in r["parts"].values():
        assert 0 < part["seconds"] <= part["budget_s"] and "partial" not in part["result"]
    res = {k: v["result"] for k, v in r["parts"].items()}
    assert res["device"]["platform"] == "cpu" and res["device"]["peak_bf16_tflops"] is None
    (shape,) = res["accel"]["shapes"]
    assert shape["name"] == "tiny" and [row["batch"] for row in shape["rows"]] == [2]
    for row in shape["rows"]:
        assert all(row[p]["tokens_per_s"] > 0 for p in ("decode", "score", "train"))
    steps = res["train"]["steps"]
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert all(s[k] > 0 for k in PHASES if k != "perf/compile_s"), s
        assert "perf/update_mfu" not in s  # the CPU has no peak
    assert steps[0]["perf/compile_s"] > steps[-1]["perf/compile_s"]  # step 1 compiles, step 2 is warm
    assert all(s["completion/mean_length"] > 0 for s in steps) and res["train"]["steady"]["perf/step_s"] > 0
    assert 0 < res["train"]["steady"]["rollout_share"] < 1
    lic = res["lic"]
    assert (lic["conversations"], lic["planned"], lic["scenarios"]) == (8, 8, ["full", "sharded"])
    assert lic["conversations_per_s"] > 0 and lic["tokens_per_s"] > 0 and lic["new_tokens"] > 0
    assert (res["parity"]["model"], res["parity"]["prompts"]) == ("random:tiny", 8)
    assert set(res["parity"]["dtypes"]) == {"float32", "bfloat16"}
    for d in res["parity"]["dtypes"].values():  # CPU against CPU: identical
        assert (d["tokens_equal"], d["all_tokens_equal"], d["logprobs_within_tol"]) == (8, True, True)
        assert d["logprob_max_abs_diff"] == 0.0 and d["first_difference"] == [None] * 8


def test_tiny_device_check_writes_every_field(tmp_path):
    """The whole CPU form, as the issue runs it (~1 min on 2 cores: five processes, most of it their imports and
    the trainer's, the evaluation's and parity's programs compiled)."""
    r = subprocess.run(["bash", "tpu/device_check.sh", "--shape", "tiny", "--out", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=900,
                       env={**os.environ, "JAX_PLATFORMS": "cpu", "OUT": ""})
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"wrote {tmp_path}/device_check.json and {tmp_path}/device_check.md" in r.stdout
    record = json.loads((tmp_path / "device_check.json").read_text())
    _check_full_tiny_record(record)
    md = (tmp_path / "device_check.md").read_text()
    assert md == format_markdown(record) + "\n"
    assert "- parity float32: greedy tokens equal the CPU's on 8 of 8 prompts (yes)" in md


@pytest.mark.slow  # ~40 s: the tiny step's five programs compiled in a child process
def test_the_optional_memory_part_compiles_the_whole_step(tmp_path):
    record, _ = run_check("tiny", ["memory"], tmp_path)
    part = record["parts"]["memory"]
    assert part["ok"], part.get("log_tail")
    rec = part["result"]["record"]
    assert (rec["model"], rec["devices"], rec["backend"]) == ("tiny", 1, "cpu")
    assert (rec["shape"]["prompt_len"], rec["shape"]["new_tokens"]) == (64, 16)
    assert set(rec["programs"]) == {"rollout_admit", "rollout_segment", "anchor", "reference", "update"}
    assert record["summary"]["memory"]["step_peak_gib"] == rec["step_peak"] / 2 ** 30 > 0


def test_the_full_form_configs_validate(tmp_path):
    """The device run's trainer and evaluation configs (never run on the CPU: 1.5B) pass their own checks."""
    from jaxrl_mt.benchmarks.device_parts import _lic_config, _train_config
    from jaxrl_mt.evaluate import normalize_config
    from jaxrl_mt.rl.loop import validate_config
    from jaxrl_mt.rl.run_config import typed_config

    c = _train_config(SHAPES["full"], tmp_path)
    assert (c.model, c.rl.steps, c.export, c.rl.group_size, c.rl.max_new_tokens) == (
        "random:qwen2.5-1.5b", 3, False, 8, 1024)
    validate_config(typed_config(c))
    e = normalize_config(_lic_config(SHAPES["full"], tmp_path))
    assert (e.model, e.dtype, e.temperature, e.runs, e.limit, tuple(e.scenarios)) == (
        "random:qwen2.5-1.5b", "bfloat16", 0.0, 1, 16, ("full", "sharded"))


def test_dispatch_and_bad_arguments(capsys):
    from jaxrl_mt.benchmarks.__main__ import main as dispatch

    with pytest.raises(SystemExit) as e:
        dispatch(["device_check", "--parts", "device,nope"])
    assert e.value.code == 2 and "--parts: unknown ['nope']; choose from device, train, accel, parity, lic, memory" \
        in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        dispatch(["device_check", "--budget", "train"])
    assert e.value.code == 2 and "expected PART=SECONDS" in capsys.readouterr().err
