"""The full RLSTA Trainer under two JAX processes on localhost (CPU, 2 fake devices each, one
global mesh 2,2,1, per-process data): 2 steps with a checkpoint, then a second launch of both
processes resumes to step 3. Process 0 alone writes metrics, samples, summary and export."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.test_multihost import collect, spawn_processes

pytestmark = pytest.mark.slow  # two launches of two processes, each compiling the sampler, scorer and step

def launch(tmp: Path, tag: str, workdir: Path, model_dir: Path, steps: int) -> list[dict]:
    """Runs both processes to `steps`; returns their reports (asserting both exit 0)."""
    procs = spawn_processes(lambda pid: ["trainer", str(tmp / f"{tag}{pid}.json"), str(workdir), str(model_dir),
                                         str(steps)])
    logs = collect(procs, timeout=900)
    for pid, log in enumerate(logs):  # every log is kept, also when the other process failed
        (tmp / f"{tag}{pid}.log").write_text(log)
    for pid, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"{tag} process {pid}:\n{log[-6000:]}"
    return [json.loads((tmp / f"{tag}{pid}.json").read_text()) for pid in range(2)]


@pytest.fixture(scope="module")
def runs(tiny_chat_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("mp_trainer")
    wd = tmp / "run"
    first = launch(tmp, "first", wd, tiny_chat_model_dir, 2)
    rows_after_first = (wd / "metrics.jsonl").read_text()
    second = launch(tmp, "second", wd, tiny_chat_model_dir, 3)
    return {"wd": wd, "tmp": tmp, "first": first, "second": second, "rows_after_first": rows_after_first}


def metric_rows(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_both_processes_share_one_mesh_and_split_the_data(runs) -> None:
    for launch_ in ("first", "second"):
        reps = runs[launch_]
        assert [r["process"] for r in reps] == [0, 1]
        for r in reps:
            assert (r["processes"], r["devices"]) == (2, 4)
            assert r["mesh"] == {"data": 2, "fsdp": 2, "tensor": 1}
    p0, p1 = runs["first"]
    assert len(p0["batches"]) == len(p1["batches"]) == 2  # steps 1 and 2
    for b0, b1 in zip(p0["batches"], p1["batches"]):
        assert len(b0) == len(b1) == 2  # rl.batch_size per process
        assert not set(b0) & set(b1)  # per-process data: disjoint items


def test_resume_runs_only_the_missing_step(runs) -> None:
    for r in runs["second"]:
        assert len(r["batches"]) == 1  # step 3 only: steps 1-2 came from the checkpoint
    steps = sorted(p.name for p in (runs["wd"] / "checkpoints").iterdir() if p.name.isdigit())
    assert steps[-1] == "3"
    log0 = (runs["tmp"] / "second0.log").read_text()
    assert "resumed from" in log0 and "at step 2" in log0
    assert "resumed from" not in (runs["tmp"] / "second1.log").read_text()  # process 0 logs


def test_process_zero_alone_writes_the_metrics(runs) -> None:
    first = metric_rows(runs["rows_after_first"])
    train = [r["step"] for r in first if "reward/total" in r]
    assert train == [1, 2]  # one row per step: process 1 wrote no second copy
    rows = metric_rows((runs["wd"] / "metrics.jsonl").read_text())
    train_rows = [r for r in rows if "reward/total" in r]
    assert [r["step"] for r in train_rows] == [1, 2, 3]
    evals = [r["step"] for r in rows if "eval/single_turn_acc_strict" in r]
    assert evals == [0, 2, 3]  # before (launch 1), after (launch 1 at step 2 and launch 2 at step 3)
    for r in train_rows:
        assert math.isfinite(r["train/loss"]) and math.isfinite(r["train/grad_norm"]), r
        assert 0.0 <= r["reward/verifier"] <= 1.0
    for f in ("summary.txt", "curves.png", "samples.md", "config.json", "export/model.safetensors"):
        assert (runs["wd"] / f).exists(), f
    assert [r["summary_keys"] for r in runs["second"]] == [["evals", "export", "metrics"], []]


def test_parameters_are_identical_across_processes(runs) -> None:
    for launch_ in ("first", "second"):
        d0, d1 = (r["digest"] for r in runs[launch_])
        assert d0 == d1
    assert runs["first"][0]["digest"] != runs["second"][0]["digest"]  # step 3 changed the weights
