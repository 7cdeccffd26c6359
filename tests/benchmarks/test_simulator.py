"""`python -m jaxrl_mt.benchmarks.simulator`: a tiny run of the LiC simulator against plain generation."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_simulator_bench_runs_on_tiny_model(tiny_model, capsys):
    from jaxrl_mt.benchmarks.simulator import main

    out = main(["--model", str(tiny_model.path), "--n", "8", "--turns", "3", "--max_new_tokens", "8",
                "--max_batch", "4"])
    assert 8 * 3 <= out["new_tokens"] <= 8 * 3 * 8  # 8 conversations x 3 turns x 1..8 tokens
    assert out["simulator_s"] > 0 and out["plain_s"] > 0 and out["ratio"] == out["simulator_s"] / out["plain_s"]
    assert "ratio simulator / plain" in capsys.readouterr().out
