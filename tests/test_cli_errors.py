"""Start-up errors of the command-line entry points: one line on stderr, exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_mt.cli_errors import check_writable_dir, flag_error_message

ROOT = Path(__file__).resolve().parents[1]


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    env.pop("JAXRL_MT_TRACEBACK", None)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def _one_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("args, line", [
    (["--config.rl.lrr=1"], "error: --config.rl.lrr=1: no config field 'lrr' (did you mean 'lr'?)"),
    (["--config.rll.lr=1"], "error: --config.rll.lr=1: no config field 'rll' (did you mean 'rl'?)"),
    (["--config.rl.lr=abc"], "error: flag --config.rl.lr=abc: could not convert string to float: 'abc'"),
])
def test_train_config_typos_are_one_line(args, line):
    """Flag parsing fails before anything is imported or written (a 57-line traceback before)."""
    assert _one_line(_run("jaxrl_mt.train", "--config", "configs/rlsta.py:cpu", *args)) == line


def test_sft_has_no_rollout_keys_on_the_command_line():
    """SFT trains on fixed targets: a GRPO rollout key is unknown to its config (issue 52: it had them all)."""
    line = _one_line(_run("jaxrl_mt.train", "--config", "configs/sft.py:cpu", "--config.rl.group_size=4"))
    assert line.startswith("error: --config.rl.group_size=4: no config field 'group_size'"), line


def test_train_missing_config_file_and_unwritable_workdir(tmp_path):
    line = _one_line(_run("jaxrl_mt.train", "--config", "configs/nope.py"))
    assert line == "error: --config: [Errno 2] No such file or directory: 'configs/nope.py'"
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    line = _one_line(_run("jaxrl_mt.train", "--config", "configs/rlsta.py:cpu", f"--config.workdir={blocker}/w"))
    assert line == f"error: workdir '{blocker}/w' is not writable (Not a directory)"


def test_evaluate_config_typo_and_unwritable_workdir(tmp_path):
    line = _one_line(_run("jaxrl_mt.evaluate", "--config", "configs/eval_lic.py:cpu", "--config.runss=3"))
    assert line == "error: --config.runss=3: no config field 'runss' (did you mean 'runs'?)"
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    line = _one_line(_run("jaxrl_mt.evaluate", "--config", "configs/eval_lic.py:cpu", "--config.dataset=synthetic:1",
                          f"--config.workdir={blocker}"))
    assert line == f"error: config field 'workdir': {blocker} is not writable (a file, not a folder)"
    assert blocker.read_text() == "x"


def test_flag_error_message_and_writable_probe(tmp_path):
    assert flag_error_message(KeyError("'x'"), ["--config.a.x=1"]) == "--config.a.x=1: no config field 'x'"
    tb = ValueError("flag --config=c.py:p: Error whilst parsing config file:\n\nTraceback (most recent call last):\n"
                    '  File "c.py", line 3\nValueError: unknown preset')
    assert flag_error_message(tb, []) == ("flag --config=c.py:p: Error whilst parsing config file: "
                                          "ValueError: unknown preset")
    check_writable_dir(tmp_path / "new" / "dir", "out")
    assert (tmp_path / "new" / "dir").is_dir() and not os.listdir(tmp_path / "new" / "dir")  # no probe left
    (tmp_path / "f").write_text("")
    with pytest.raises(OSError, match=r"^out .*/f is not writable \(a file, not a folder\)$"):
        check_writable_dir(tmp_path / "f", "out")
    with pytest.raises(OSError, match=r"^out .*/f/new is not writable \(Not a directory\)$"):
        check_writable_dir(tmp_path / "f" / "new", "out")


def test_unknown_model_and_zero_intervals_are_one_line(tmp_path):
    """Issue 32: before, --config.model=/nonexistent was a 27-line traceback (train; evaluate already gave one
    line), checkpoint.every=0 a 25-line ZeroDivisionError after step 1."""
    line = _one_line(_run("jaxrl_mt.train", "--config", "configs/rlsta.py:cpu", f"--config.workdir={tmp_path / 't'}",
                          "--config.model=/nonexistent"))
    assert line == ("error: unknown model '/nonexistent': expected builtin:NAME (smollm2-135m-instruct), random:NAME "
                    "(qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-7b, tiny), a local HF folder or a hub id")
    line = _one_line(_run("jaxrl_mt.train", "--config", "configs/rlsta.py:cpu", f"--config.workdir={tmp_path / 'z'}",
                          "--config.checkpoint.every=0"))
    assert line == "error: checkpoint.every must be >= 1, got 0"
