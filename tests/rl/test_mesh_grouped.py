"""Always the grouped layout: a 2-step GRPO run under meshes (8,1,1) and (2,2,2) of 8 host devices prompts
once per group, and its losses, KL and rewards equal the one-device run's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEYS = ("train/loss", "train/kl", "train/entropy", "train/grad_norm", "reward/total", "reward/anchor",
        "reward/verifier")


@pytest.mark.slow
def test_grouped_layout_under_every_mesh_matches_one_device(tiny_chat_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8",
               PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "tests.rl._mesh_worker", str(out), str(tiny_chat_model_dir),
                        str(tmp_path / "runs")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    rep = json.loads(out.read_text())
    assert rep["none"]["mesh"] is None
    assert rep["8,1,1"]["mesh"] == {"data": 8, "fsdp": 1, "tensor": 1}
    assert rep["2,2,2"]["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}
    one = rep["none"]["rows"]
    assert sorted(one) == ["1", "2"]
    for spec in ("none", "8,1,1", "2,2,2"):
        assert rep[spec]["grouped"] and rep[spec]["groups"] == [2, 2], spec  # each prompt once for its 2 rows
        rows = rep[spec]["rows"]
        for step in ("1", "2"):
            for k in KEYS:  # 1e-5, relative above magnitude 1 (the entropy, ~6.9: fp32 sums over the
                # vocabulary in another order per mesh differ by ~3e-6 relative)
                tol = 1e-5 * max(1.0, abs(one[step][k]))
                assert abs(rows[step][k] - one[step][k]) <= tol, (spec, step, k, rows[step][k], one[step][k])
    assert one["1"]["train/kl"] >= 0 and one["2"]["train/kl"] > 0  # the policy moved: a real KL term
