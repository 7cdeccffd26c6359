"""Two JAX processes on localhost (CPU backend, gloo collectives, a local coordinator): a few GRPO
train steps of a tiny model on a global mesh fed by per-process rows, an orbax checkpoint written
by both processes, a restore, the sampler's slot engine on per-process rows and conversations
keeping their caches in slots across turns (`Sampler.run_turns`, replicated on both processes),
against the same steps and calls in one single-device process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # three JAX processes compile and run a GRPO step (~1 min of CPU)

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("_parallel_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(devices: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COORDINATOR", "JAX_NUM_PROC", "JAX_PROCESS"))}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               PYTHONPATH=str(ROOT), **extra)
    return env


def spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    """The worker script with `args`, output captured."""
    return subprocess.Popen([sys.executable, str(WORKER), *args], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def spawn_processes(args_of: Callable[[int], list[str]], n: int = 2, devices: int = 2) -> list[subprocess.Popen]:
    """`n` workers joined by a local coordinator (process i runs args_of(i)), `devices` CPU devices each."""
    port = free_port()
    return [spawn(args_of(pid), worker_env(devices, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                                           JAX_NUM_PROCESSES=str(n), JAX_PROCESS_ID=str(pid)))
            for pid in range(n)]


def collect(procs: list[subprocess.Popen], timeout: float) -> list[str]:
    """Each process's output once it exits; any still running at the end are killed."""
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return logs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], dict]:
    tmp = tmp_path_factory.mktemp("multihost")
    procs = spawn_processes(lambda pid: ["multihost", str(tmp / f"p{pid}.json"), str(tmp / "ckpt")])
    ref = spawn(["multihost", str(tmp / "ref.json"), str(tmp / "ckpt_ref"), "reference"], worker_env(1))
    logs = collect(procs + [ref], timeout=600)
    for p, log in zip(procs + [ref], logs):
        assert p.returncode == 0, log[-4000:]
    return [json.loads((tmp / f"p{i}.json").read_text()) for i in range(2)], json.loads((tmp / "ref.json").read_text())


def test_two_processes_form_one_global_mesh(runs) -> None:
    procs, ref = runs
    assert [p["process"] for p in procs] == [0, 1]
    for p in procs:
        assert (p["processes"], p["devices"], p["local_devices"]) == (2, 4, 2)
    assert (ref["processes"], ref["devices"]) == (1, 1)


def test_train_steps_match_one_device(runs) -> None:
    procs, ref = runs
    assert procs[0]["losses"] == procs[1]["losses"]  # one global computation, seen by both
    assert len(ref["losses"]) == 3 and len(set(ref["losses"])) == 3
    np.testing.assert_allclose(procs[0]["losses"], ref["losses"], rtol=0, atol=1e-5)
    for name, v in ref["digest"].items():  # sum of squares of every updated parameter
        for p in procs:
            assert abs(p["digest"][name] - v) <= 1e-5 * max(1.0, abs(v)), (name, p["digest"][name], v)


def test_checkpoint_written_by_both_restores_exactly(runs) -> None:
    procs, _ = runs
    for p in procs:
        assert p["steps_on_disk"] == [3]
        assert p["extra"] == {"step": 3, "losses": p["losses"]}
        assert p["restore_diff"] == 0.0  # every local shard of params and AdamW state
        assert p["next_loss_restored"] == p["next_loss_live"]


def test_per_process_row_helpers(runs) -> None:
    procs, _ = runs
    h0, h1 = procs[0]["helpers"], procs[1]["helpers"]
    for h in (h0, h1):
        assert h["agree_max"] == 8 and h["agree_max_many"] == [1, 10]
        assert h["allgather_json"] == [{"p": 0, "s": "xxx"}, {"p": 1, "s": "xxxx"}]
        assert h["broadcast_json"] == "from 0"
        assert h["mean"] == {"a": 2 / 3, "m": 10.0}  # (0 * 1 + 1 * 2) / 3; max of 0, 10
        assert h["mean_weight0_nan"] == {"a": 4.0}
        assert h["rows_multiple"] == 2 and h["spans"] == [True, False]
        assert "different row counts [1, 2]" in h["check_same_rows"]
        assert "different metric names" in h["mean_keys_mismatch"]
        assert h["put_rows_global_shape"] == [8, 2]  # 3 rows per process padded to 4
        assert h["fetch_rows_exact"] and h["fetch_rows_replicated_exact"]
        assert "3 rows per process is not a multiple of 2" in h["put_rows_nopad"]
        assert h["gather_exact"] and h["local_copy_addressable"]
        assert h["score_diff"] <= 1e-5 and h["score_pooled_diff"] <= 1e-5
        assert h["greedy_equal"] and h["greedy_logprob_diff"] <= 1e-5
    assert h0["process_block"] == [[0, 2], [0, 0], [0, 0]] and h1["process_block"] == [[2, 5], [0, 1], [0, 0]]
    assert (h0["score_rows"], h1["score_rows"]) == (3, 5)
    assert (h0["score_empty_rows"], h1["score_empty_rows"]) == (0, 2)
    assert (h0["greedy_rows"], h1["greedy_rows"]) == (2, 3)


@pytest.mark.parametrize("shape", ["4,1,1", "2,2,1"])
def test_sampler_runs_the_slot_engine_over_both_processes(runs, shape: str) -> None:
    """Each process passes its own rows; the slot engine answers the global call (every process's rows
    in process order) on the mesh over both processes: each process's rows are the one-device
    reference's rows of that process (the same row seeds)."""
    procs, ref = runs
    want = ref["sampling"]["reference"]
    for name, rows in (("greedy", (3, 2)), ("sampled", (3, 2)), ("grouped", (6, 4))):
        got = [p["sampling"][shape][name] for p in procs]
        assert tuple(len(g["tokens"]) for g in got) == rows
        assert len({len(t) for t in want[name]["tokens"]}) > 1  # rows end at different steps
        for g, lo in zip(got, (0, rows[0])):
            assert g["tokens"] == want[name]["tokens"][lo:lo + len(g["tokens"])], name
            assert g["finish"] == want[name]["finish"][lo:lo + len(g["tokens"])], name
            for a, b in zip(g["logprobs"], want[name]["logprobs"][lo:]):
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
        mine = [g["stats"].pop("new_tokens") for g in got]  # this process's rows' tokens
        assert sum(mine) == sum(len(t) for t in want[name]["tokens"])
        assert got[0]["stats"] == got[1]["stats"]  # the counters of the global call, on both processes
        assert got[0]["stats"]["segments"] >= 1 and "row_utilisation" in got[0]["stats"]
    assert want["sampled"]["tokens"] != want["greedy"]["tokens"]
    for p in procs:  # slot programs only: no chunked (B, P, N) kernel ran
        assert p["sampling"][shape]["shapes"] == ["admit", "segment"]
    assert procs[0]["sampling"]["4,1,1"]["greedy"]["stats"]["admissions"] > 1  # 4 slots, 5 rows: rows waited


@pytest.mark.parametrize("shape", ["4,1,1", "2,2,1"])
def test_run_turns_on_both_processes_gives_the_one_device_transcripts(runs, shape: str) -> None:
    """Both processes run the same conversations (replicated feeds and hooks) on the mesh over both,
    each conversation's KV cache kept in its slot across turns: every turn's tokens, finish reason
    and context equal the one-device run's (log-probs within 1e-5), on both processes."""
    procs, ref = runs
    want = ref["sampling"]["reference"]["turns"]
    for name in ("greedy", "sampled"):
        assert len(want[name]) == 12  # 3 + 3 + 1 + 2 + 3 turns
        for p in procs:
            got = p["sampling"][shape]["turns"][name]
            assert [g[:3] + g[4:] for g in got] == [w[:3] + w[4:] for w in want[name]], (name, p["process"])
            for g, w in zip(got, want[name]):
                np.testing.assert_allclose(g[3], w[3], rtol=0, atol=1e-5)
        counters = [p["sampling"][shape]["turns"][name + "_counters"] for p in procs]
        assert counters[0] == counters[1] and counters[0]["extensions"] >= 1  # later turns continued kept caches
    assert [w[2] for w in want["greedy"]] != [w[2] for w in want["sampled"]]
    for p in procs:  # different feeds on the two processes: refused on both
        assert "the same arguments on every process" in p["sampling"][shape]["turns"]["refused"]
