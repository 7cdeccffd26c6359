"""`runtime.load_config_file`: configs that extend another load it by path."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxrl_mt.runtime import load_config_file

ROOT = Path(__file__).resolve().parents[1]


def test_configs_extend_rlsta_by_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the current directory does not matter
    grpo = load_config_file(ROOT / "configs" / "grpo.py", "cpu")
    rlsta = load_config_file(ROOT / "configs" / "rlsta.py", "cpu")
    icpo = load_config_file(ROOT / "configs" / "icpo.py", "paper")
    assert (grpo.method, grpo.rl.alpha, rlsta.rl.alpha) == ("grpo", 0.0, 1.0)
    assert grpo.rl.steps == rlsta.rl.steps and grpo.workdir == rlsta.workdir.replace("rlsta", "grpo")
    assert icpo.method == "icpo" and icpo.rl.lr == 1e-6


def test_bad_config_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.py"):
        load_config_file(tmp_path / "nope.py")
    f = tmp_path / "empty.py"
    f.write_text("x = 1\n")
    with pytest.raises(AttributeError, match="has no get_config"):
        load_config_file(f)
