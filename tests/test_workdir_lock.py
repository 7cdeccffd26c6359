"""The workdir lock (issue 53 item 10), with real processes: before, three trainers ran on one
workdir for two minutes and none was refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_mt.workdir_lock import LOCK_FILE, WorkdirBusy, hold_workdir

ROOT = Path(__file__).resolve().parents[1]
HOLDER = ("import sys, time; from jaxrl_mt.workdir_lock import hold_workdir; "
          "lock = hold_workdir(sys.argv[1], what='trainer'); print('held', flush=True); time.sleep(120)")


def _env() -> dict[str, str]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    env.pop("JAXRL_MT_TRACEBACK", None)
    return env


@pytest.fixture
def holder(tmp_path):
    """Another process holding ``tmp_path / 'wd'``: (workdir, Popen); killed (by its pid) at the end."""
    wd = tmp_path / "wd"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(wd)], env=_env(), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield wd, proc
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def test_a_live_holder_is_named_and_a_dead_ones_lock_taken_over(holder):
    wd, proc = holder
    with pytest.raises(WorkdirBusy) as e:
        hold_workdir(wd, what="evaluation")
    assert f"workdir {wd} is in use by pid {proc.pid} (trainer on " in str(e.value)
    assert len(str(e.value).splitlines()) == 1
    os.kill(proc.pid, signal.SIGKILL)  # kill -9: the file still names it, the flock is gone
    proc.wait()
    lines: list[str] = []
    with hold_workdir(wd, what="evaluation", log=lines.append):
        assert f'"pid": {os.getpid()}' in (wd / LOCK_FILE).read_text()
    assert lines == [f"workdir {wd}: took over the stale lock of pid {proc.pid} (trainer, no longer running)"]
    with hold_workdir(wd, what="evaluation", log=lines.append):  # released cleanly: nothing to take over
        pass
    assert len(lines) == 1 and (wd / LOCK_FILE).read_text() == ""


def test_the_lock_is_reentrant_in_one_process_and_released_last(tmp_path):
    a = hold_workdir(tmp_path, what="trainer")
    b = hold_workdir(tmp_path, what="evaluation")
    a.release()
    a.release()  # idempotent
    assert str(os.getpid()) in (tmp_path / LOCK_FILE).read_text()
    b.release()
    assert (tmp_path / LOCK_FILE).read_text() == ""


@pytest.mark.parametrize("module, args", [
    ("jaxrl_mt.train", ["--config", "configs/rlsta.py:cpu"]),
    ("jaxrl_mt.evaluate", ["--config", "configs/eval_lic.py:cpu", "--config.dataset=synthetic:1"]),
])
def test_a_second_trainer_or_evaluation_is_one_line_exit_2(holder, module, args):
    wd, proc = holder
    r = subprocess.run([sys.executable, "-m", module, *args, f"--config.workdir={wd}"], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith(f"error: workdir {wd} is in use by pid {proc.pid} (trainer on "), lines
    assert proc.poll() is None  # the holder runs on
