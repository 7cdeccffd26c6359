"""One line, exit 2 (issue 53 item 9): a bad ``JAXRL_MT_ATTENTION``, a bad ``lora.targets`` regex, a
damaged filter cache naming file:line, and a damaged copy of it in an arm's workdir refreshed by checksum.

Before: ``JAXRL_MT_ATTENTION=bogus`` was a 29-line traceback after 61 s (read at the first trace),
``--config.lora.targets='('`` a 44-line ``re.error`` traceback, a half-written last line of
``filter_texts.jsonl`` a ``ValueError`` traceback, and exp2 kept the damaged copy in the arm's workdir
after its source was repaired.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from jaxrl_mt.rl.recipe import ConfigError, RecipeEnv
from jaxrl_mt.rl.histories import save_texts, texts_key
from jaxrl_mt.rl.supervised import FILTER_TEXTS, SFTData
from tests.rl.test_histories import _items

ROOT = Path(__file__).resolve().parents[2]


def _train(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), **(env or {})}
    env.pop("JAXRL_MT_TRACEBACK", None)
    return subprocess.run([sys.executable, "-m", "jaxrl_mt.train", "--config", "configs/rlsta.py:cpu",
                           f"--config.workdir={tmp_path / 'w'}", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("args, env, line", [
    ((), {"JAXRL_MT_ATTENTION": "bogus"},
     "error: environment variable JAXRL_MT_ATTENTION='bogus': expected one of auto, einsum, blockwise, pallas, "
     "cudnn"),
    (("--config.lora.rank=4", "--config.lora.targets=("), None,
     "error: lora.targets '(' is not a regular expression (missing ), unterminated subpattern at position 0)"),
])
def test_train_refuses_in_one_line(tmp_path, args, env, line):
    r = _train(tmp_path, *args, env=env)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [line], r.stderr[-3000:]
    assert not (tmp_path / "w" / "config.json").exists()  # refused before anything is written


def test_generate_refuses_a_bad_attention_variable_in_one_line(tmp_path, capsys, monkeypatch):
    from jaxrl_mt.generate import main

    monkeypatch.setenv("JAXRL_MT_ATTENTION", "bogus")
    assert main(["--model", str(tmp_path), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --model: environment variable JAXRL_MT_ATTENTION='bogus': expected one of auto, einsum, "
                   "blockwise, pallas, cudnn"]


def test_a_half_written_filter_cache_is_one_config_error_naming_file_and_line(tmp_path):
    cfg = SimpleNamespace(seed=0, model="tiny", filter=SimpleNamespace(k=2, temperature=1.0),
                          rl=SimpleNamespace(max_new_tokens=5))
    env = RecipeEnv(config=cfg, workdir=tmp_path, is_main=True, multi=False, system=None, sampler=None, mesh=None,
                    log=lambda s: None)
    items = _items(3)
    key = texts_key(items, model="tiny", seed=2, k=2, temperature=1.0, max_new_tokens=5, system=None)
    path = tmp_path / FILTER_TEXTS
    save_texts(path, key, items, [f"s{i}" for i in range(6)], [f"m{i}" for i in range(6)], k=2)
    assert SFTData()._filter_texts(env, items)[0][0] == "s0"  # the intact file is read (no sampler needed)
    path.write_bytes(path.read_bytes()[:-12])  # the last line half-written
    with pytest.raises(ConfigError) as e:
        SFTData()._filter_texts(env, items)
    assert str(e.value).startswith(f"{path}:4: bad filter texts line (JSONDecodeError: ")
    assert len(str(e.value).splitlines()) == 1
    path.write_bytes(path.read_bytes()[:30] + b"\xff\n")  # not UTF-8
    with pytest.raises(ConfigError, match=f"{path}:1: not UTF-8"):
        SFTData()._filter_texts(env, items)


def test_exp2_refreshes_a_damaged_copy_from_its_repaired_source(tmp_path, monkeypatch, capsys):
    from experiments import exp2

    seen = []

    def fake_train_arm(cmd: list[str], cwd: Path) -> int:
        wd = Path(next(a.split("=", 1)[1] for a in cmd if a.startswith("--config.workdir=")))
        seen.append((wd / exp2.FILTER_TEXTS).read_text())
        (wd / "run_info.json").write_text(json.dumps({"exit_status": 0}))
        return 0

    monkeypatch.setattr(subprocess, "call", fake_train_arm)
    data, wd = tmp_path / "data", tmp_path / "runs" / "dpo_full_s0"
    data.mkdir()
    wd.mkdir(parents=True)
    for f in ("histories.jsonl", "train_items.jsonl"):
        (data / f).write_text(f)
    (data / exp2.FILTER_TEXTS).write_text('{"key": {}}\n{"item_id": "p0", "st": ["a"], "mt": ["b"]}\n')  # repaired
    (wd / exp2.FILTER_TEXTS).write_text('{"key": {}}\n{"item_id": "p0", "st": ["a"], "m')  # the damaged copy
    assert exp2.train(["dpo_full_s0"], tmp_path / "runs", tmp_path / "results", data) == 0
    assert seen == [(data / exp2.FILTER_TEXTS).read_text()]
    assert f"exp2: {wd / exp2.FILTER_TEXTS} differed from {data / exp2.FILTER_TEXTS} (checksum): copied again" \
        in capsys.readouterr().err
