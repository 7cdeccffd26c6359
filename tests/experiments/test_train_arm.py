"""train_arm: the workdir of a config (preset + override); calibrate's family list parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.calibrate import parse_families
from experiments.train_arm import workdir_of

ROOT = Path(__file__).resolve().parents[2]


def test_workdir_of_presets_and_override() -> None:
    cfg = str(ROOT / "configs")
    assert workdir_of(["--config", f"{cfg}/rlsta.py:experiment"]) == Path("runs/rlsta_exp")
    assert workdir_of(["--config", f"{cfg}/grpo.py:experiment"]) == Path("runs/grpo_exp")
    assert workdir_of([f"--config={cfg}/icpo.py:experiment", "--config.rl.steps=2"]) == Path("runs/icpo_exp")
    assert workdir_of(["--config", f"{cfg}/rlsta.py:experiment", "--config.workdir=/tmp/x"]) == Path("/tmp/x")
    with pytest.raises(SystemExit, match="required"):
        workdir_of(["--config.rl.steps=2"])
    with pytest.raises(SystemExit, match="not found"):
        workdir_of(["--config", "nope.py:x"])


def test_parse_families() -> None:
    assert parse_families("a=family:train:4:1, b=synthetic:3:1") == {"a": "family:train:4:1", "b": "synthetic:3:1"}
    with pytest.raises(SystemExit, match="LABEL=SOURCE_SPEC"):
        parse_families("family:train:4")
