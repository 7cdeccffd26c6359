"""`evaluate` (LiC sharded, greedy, 4 problems) and `sedt_eval` (2 problems) on two JAX processes
on localhost (gloo collectives, 2 CPU devices each: one global mesh of 4) write transcripts
byte-identical to one process's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_multihost import collect, free_port, worker_env

pytestmark = pytest.mark.slow  # six JAX processes compile and run the tiny model (~2-3 min of CPU)

WORKER = Path(__file__).resolve().parents[1] / "_eval_worker.py"


def run_workers(mode: str, model_dir: Path, out: Path, n: int) -> None:
    """`n` processes joined by a local coordinator (n = 1: a plain single-process run) into `out`."""
    port = free_port()
    envs = [worker_env(2, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(n),
                       JAX_PROCESS_ID=str(i)) for i in range(n)] if n > 1 else [worker_env(1)]
    procs = [subprocess.Popen([sys.executable, str(WORKER), mode, str(model_dir), str(out)], env=env,
                              cwd=WORKER.parents[1], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for env in envs]
    for p, log in zip(procs, collect(procs, timeout=600)):
        assert p.returncode == 0, log[-4000:]


@pytest.mark.parametrize("mode, n_records", [("evaluate", 4), ("sedt", 2)])
def test_two_processes_write_the_transcripts_of_one(tiny_chat_model_dir, tmp_path, mode, n_records):
    run_workers(mode, tiny_chat_model_dir, tmp_path / "one", 1)
    run_workers(mode, tiny_chat_model_dir, tmp_path / "two", 2)
    one = (tmp_path / "one" / "transcripts.jsonl").read_bytes()
    two = (tmp_path / "two" / "transcripts.jsonl").read_bytes()
    assert len(one.splitlines()) == n_records
    assert two == one
