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


def test_a_killed_run_stays_on_record_and_is_timed_by_the_resume(tmp_path: Path, monkeypatch) -> None:
    """The entry is written before training starts; a run killed before it ended keeps it, and the next
    invocation times it to the workdir's last write and sums the wall time over both."""
    import json
    import os

    from experiments import train_arm

    wd = tmp_path / "run"
    args = ["--config", str(ROOT / "configs" / "rlsta.py:experiment"), f"--config.workdir={wd}"]
    seen: list[dict] = []

    def killed(cmd: list[str]) -> int:  # the training child: writes a step, then the machine stops
        assert cmd[1:3] == ["-m", "jaxrl_mt.train"] and cmd[3:] == args
        seen.append(json.loads((wd / "run_info.json").read_text()))
        (wd / "metrics.jsonl").write_text("{}\n")
        os.utime(wd / "metrics.jsonl", (seen[0]["started_s"] + 50, seen[0]["started_s"] + 50))
        raise KeyboardInterrupt

    monkeypatch.setattr(train_arm.subprocess, "call", killed)
    with pytest.raises(KeyboardInterrupt):
        train_arm.main(args)
    assert seen[0]["exit_status"] is None and "wall_s" not in seen[0] and seen[0]["started_s"] > 0
    assert json.loads((wd / "run_info.json").read_text()) == seen[0]  # what the kill leaves
    assert not train_arm.merged([seen[0]]).get("invocations")

    monkeypatch.setattr(train_arm.subprocess, "call", lambda cmd: 0)
    assert train_arm.main(args) == 0
    info = json.loads((wd / "run_info.json").read_text())
    first, second = info["invocations"]
    assert first == {**seen[0], "killed": True, "peak_rss_gb": None, "wall_s": 50.0}
    assert second["exit_status"] == 0 and second["peak_rss_gb"] is not None and "killed" not in second
    assert info["wall_s"] == round(50.0 + second["wall_s"], 1) and info["exit_status"] == 0
    assert info["peak_rss_gb"] == second["peak_rss_gb"]

    assert train_arm.main(args) == 0  # a third invocation keeps both, and adds itself
    again = json.loads((wd / "run_info.json").read_text())
    assert again["invocations"][:2] == [first, second] and len(again["invocations"]) == 3


def test_a_damaged_run_info_is_named(tmp_path: Path) -> None:
    from experiments.train_arm import earlier_invocations

    (tmp_path / "run_info.json").write_text('{"wall_s": ')
    with pytest.raises(SystemExit, match=r"run_info\.json: invalid JSON"):
        earlier_invocations(tmp_path)
