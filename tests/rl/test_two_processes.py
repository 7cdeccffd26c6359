"""SFT, DPO and RLAAR on two local JAX processes equal one process (issue 52: one process is not special).

Each method trains 3 steps of the ``Trainer`` on the mesh 2,2,1 twice (``tests/rl/_two_process_worker.py``):
two processes of 2 CPU devices each (``rl.batch_size`` 2 per process, each drawing grain's shard of
the items), and one process of 4 devices whose data iterator yields both shards' batches
concatenated, so every step's global batch (every process's rows, in process order) is the same.
Same rows, same mesh, the same compiled programs: the final parameters are bit-identical
(measured), and every logged metric agrees within 1e-5 relative or absolute: the cross-process
collectives (gloo) add partial sums in another order than one process does (measured: at most
2.5e-7 relative for SFT; DPO's step-0 margin, 0 on one process, is -1.0e-6 on two).

SFT and DPO start from cached rows (the tiny random model solves nothing), and SFT runs the held-out
probe before and after training. RLAAR prepares its histories in the one-process run and the
two-process run reads them (the same items); its rollouts sample on both (row seeds are global row
indices: ``rl.rollout``). SFT's data stage from nothing (histories and the filter's samples, split
over the processes) writes byte-identical caches on one and on two processes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.rl._three_steps import sup_rows
from tests.test_multihost import collect, free_port, worker_env

pytestmark = pytest.mark.slow  # 4 x (one process + two processes of the Trainer): 23 min on 2 loaded cores

ROOT = Path(__file__).resolve().parents[2]
CACHES = ("histories.jsonl", "heldout.jsonl")


def spawn(method: str, wd: Path, model: Path, out: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.rl._two_process_worker", method, str(wd), str(model),
                             str(out)], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(procs: list[subprocess.Popen], names: list[str], tmp: Path) -> None:
    logs = collect(procs, timeout=1200)
    for name, log in zip(names, logs):
        (tmp / f"{name}.log").write_text(log)
    for name, p, log in zip(names, procs, logs):
        assert p.returncode == 0, f"{name}:\n{log[-6000:]}"


@pytest.fixture(scope="module", params=["sft", "dpo", "rlaar"])
def runs(request: pytest.FixtureRequest, tiny_chat_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    method = request.param
    tmp = tmp_path_factory.mktemp(f"two_{method}")
    one, two = tmp / "one", tmp / "two"
    for wd in (one, two):
        wd.mkdir()
        if method != "rlaar":
            from jaxrl_mt.rl.supervised import _write_rows

            _write_rows(wd / "train_rows.jsonl", sup_rows(method, 8))
            _write_rows(wd / "val_rows.jsonl", sup_rows(method, 11)[8:])
    first = [spawn(method, one, tiny_chat_model_dir, tmp / "one.json", worker_env(4))]
    if method == "rlaar":  # the histories of the one-process run, read by both processes
        finish(first, ["one"], tmp)
        for name in CACHES:
            shutil.copy(one / name, two / name)
    port = free_port()
    pair = [spawn(method, two, tiny_chat_model_dir, tmp / f"two{pid}.json",
                  worker_env(2, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                             JAX_PROCESS_ID=str(pid))) for pid in range(2)]
    finish(pair if method == "rlaar" else first + pair, ["two0", "two1"] if method == "rlaar" else
           ["one", "two0", "two1"], tmp)
    rows = lambda wd: [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines() if x.strip()]  # noqa: E731
    rep = lambda name: json.loads((tmp / f"{name}.json").read_text())  # noqa: E731
    return {"method": method, "one": rep("one"), "two": [rep("two0"), rep("two1")], "rows_one": rows(one),
            "rows_two": rows(two), "params_one": dict(np.load(tmp / "one.npz")),
            "params_two": dict(np.load(tmp / "two0.npz"))}


def test_each_process_draws_its_rows_of_the_one_process_batches(runs) -> None:
    one, (p0, p1) = runs["one"], runs["two"]
    assert (one["processes"], one["devices"]) == (1, 4)
    assert [(p["process"], p["processes"], p["devices"]) for p in (p0, p1)] == [(0, 2, 4), (1, 2, 4)]
    assert one["mesh"] == p0["mesh"] == p1["mesh"] == {"data": 2, "fsdp": 2, "tensor": 1}
    assert len(one["items"]) == 3
    for step, (b0, b1) in enumerate(zip(p0["items"], p1["items"])):
        assert len(b0) == len(b1) == 2 and not set(b0) & set(b1)  # per-process data: disjoint rows
        assert one["items"][step] == b0 + b1  # the global batch: process 0's rows, then process 1's


def test_every_metric_equals_one_process(runs) -> None:
    a, b = runs["rows_one"], runs["rows_two"]
    assert [(r["step"], r["kind"]) for r in a] == [(r["step"], r["kind"]) for r in b]
    train = [r for r in a if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert len({r["train/loss"] for r in train}) == 3  # the steps trained
    if runs["method"] == "sft":
        assert [r["step"] for r in a if r["kind"] == "probe"] == [0, 3]
    if runs["method"] == "rlaar":
        assert {"curriculum/shards", "reward/total", "eval/abstain_rate"} <= {k for r in a for k in r}
    for x, y in zip(a, b):
        assert set(x) == set(y)
        keys = [k for k in x if k not in ("step", "kind") and not k.startswith("perf/")]
        np.testing.assert_allclose([y[k] for k in keys], [x[k] for k in keys], rtol=1e-5, atol=1e-5,
                                   err_msg=f"step {x['step']} {x['kind']}: {keys}")


def test_histories_and_the_filter_samples_split_over_two_processes_equal_one_process(
        tiny_chat_model_dir: Path, tmp_path: Path) -> None:
    """SFT's data stage from nothing: the histories (a row seed per conversation) and the filter's samples
    (row seeds of the call over every history: ``rl.histories.single_and_multi_texts``), each process
    sampling its block on a copy of the policy, gathered, are byte-identical to one process's."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    port = free_port()
    procs = [spawn("sft-prepare", one, tiny_chat_model_dir, tmp_path / "one.json", worker_env(4))] + [
        spawn("sft-prepare", two, tiny_chat_model_dir, tmp_path / f"two{pid}.json",
              worker_env(2, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                         JAX_PROCESS_ID=str(pid))) for pid in range(2)]
    finish(procs, ["one", "two0", "two1"], tmp_path)
    for name in ("histories.jsonl", "filter_texts.jsonl"):
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    texts = [json.loads(x) for x in (one / "filter_texts.jsonl").read_text().splitlines()[1:]]
    assert len(texts) == len((one / "histories.jsonl").read_text().splitlines()) >= 4  # k + k texts per history
    assert len({t for x in texts for t in x["st"] + x["mt"]}) > len(texts)  # sampled, not all alike


def test_final_parameters_are_bit_identical(runs, tiny_model) -> None:
    import jax

    from jaxrl_mt.parallel.rules import _path

    one, two = runs["params_one"], runs["params_two"]
    assert sorted(one) == sorted(two)
    for k in one:
        np.testing.assert_array_equal(one[k], two[k], err_msg=k)
    initial = {_path(kp): np.asarray(x) for kp, x in jax.tree_util.tree_flatten_with_path(tiny_model.params)[0]}
    assert sorted(initial) == sorted(one)
    assert any(not np.array_equal(initial[k], one[k]) for k in one)  # trained, not the initial weights
