"""code_version: the commit and the changed code files of a real git checkout, None outside one."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from experiments.provenance import code_version


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()


def test_commit_and_changed_code_files(tmp_path: Path) -> None:
    assert code_version(tmp_path) is None  # not a checkout
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@example.com")
    _git(tmp_path, "config", "user.name", "t")
    (tmp_path / "jaxrl_mt").mkdir()
    (tmp_path / "configs").mkdir()
    (tmp_path / "experiments").mkdir()
    for f in ("jaxrl_mt/a.py", "configs/c.py", "experiments/e.py", "README.md"):
        (tmp_path / f).write_text("x = 1\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "one")
    sha = _git(tmp_path, "rev-parse", "HEAD")
    assert code_version(tmp_path) == {"commit": sha, "dirty": []}
    (tmp_path / "jaxrl_mt" / "a.py").write_text("x = 2\n")
    (tmp_path / "configs" / "c.py").write_text("y = 2\n")
    (tmp_path / "experiments" / "e.py").write_text("z = 2\n")
    (tmp_path / "README.md").write_text("docs only\n")  # not code: not listed
    assert code_version(tmp_path) == {"commit": sha, "dirty": ["configs/c.py", "experiments/e.py", "jaxrl_mt/a.py"]}


def test_the_report_names_the_commit_each_run_trained_on() -> None:
    from experiments.markdown import _runs

    code = {"commit": "0123456789abcdef0123", "dirty": ["configs/x.py"]}
    runs = {"rlsta_exp": {"config": {"method": "rlsta"}, "curves": {}, "info": {"wall_s": 60.0, "code": code}},
            "grpo_exp": {"config": {"method": "grpo"}, "curves": {}, "info": {"wall_s": 60.0}}}
    lines = _runs({"runs": runs})
    assert "- rlsta_exp: commit 0123456789ab, changed files configs/x.py" in lines
    assert "- grpo_exp: not recorded" in lines
    assert not any("Code each run" in x for x in _runs({"runs": {"grpo_exp": runs["grpo_exp"]}}))


def _checkout(root: Path) -> str:
    _git(root, "init", "-q")
    _git(root, "config", "user.email", "t@example.com")
    _git(root, "config", "user.name", "t")
    (root / "jaxrl_mt").mkdir()
    (root / "jaxrl_mt" / "a.py").write_text("x = 1\n")
    _git(root, "add", ".")
    _git(root, "commit", "-qm", "one")
    return _git(root, "rev-parse", "HEAD")


def test_a_resumed_evaluation_keeps_one_entry_per_invocation(tmp_path: Path) -> None:
    from experiments.provenance import read_evaluation_code, record_evaluation

    repo, wd = tmp_path / "repo", tmp_path / "eval"
    repo.mkdir()
    first = _checkout(repo)
    assert read_evaluation_code(wd) == []
    started = record_evaluation(wd, repo)
    from jaxrl_mt.sampling.kernels import ENGINE_VERSION

    assert started == [{"code": {"commit": first, "dirty": []}, "engine": ENGINE_VERSION, "conversations_on_disk": 0,
                        "started": started[0]["started"]}] and started[0]["started"] > 0
    # the first invocation wrote two conversations and a torn third line ending in "}", then was killed
    rec = {"task_id": "t", "kind": "full", "run": 0, "score": 1.0, "turns": [{"assistant": "{x}"}]}
    lines = [json.dumps({"conv_id": c, **rec}) for c in "abc"]
    (wd / "transcripts.jsonl").write_text(lines[0] + "\n" + lines[1] + "\n" + lines[2][:-4])
    t_last = started[0]["started"] + 42.0  # its last write, 42 s after it started
    os.utime(wd / "transcripts.jsonl", (t_last, t_last))
    assert lines[2][:-4].endswith("}")
    (repo / "jaxrl_mt" / "a.py").write_text("x = 2\n")
    _git(repo, "commit", "-qam", "two")
    second = _git(repo, "rev-parse", "HEAD")
    assert second != first
    entries = record_evaluation(wd, repo)
    assert entries == [{**started[0], "seconds_to_last_write": 42.0},  # the killed invocation, timed
                       {"code": {"commit": second, "dirty": []}, "engine": ENGINE_VERSION,
                        "conversations_on_disk": 2, "started": entries[1]["started"]}]
    assert entries[1]["started"] >= started[0]["started"]
    assert read_evaluation_code(wd) == entries
    from experiments.provenance import record_evaluation_time

    timed = record_evaluation_time(wd, 12.34, 1)  # the second invocation's time goes to its own entry
    assert timed == [entries[0], {**entries[1], "seconds": 12.3, "n_generated": 1}] == read_evaluation_code(wd)


def test_a_damaged_code_file_is_named(tmp_path: Path) -> None:
    import pytest

    from experiments.provenance import read_evaluation_code

    (tmp_path / "code.json").write_text('{"commit": "abc"}')
    with pytest.raises(ValueError, match=r"code\.json: expected a list"):
        read_evaluation_code(tmp_path)
    (tmp_path / "code.json").write_text('[{"code": ')
    with pytest.raises(ValueError, match=r"code\.json: invalid JSON"):
        read_evaluation_code(tmp_path)


def test_the_report_names_the_code_of_each_evaluation() -> None:
    from experiments.markdown import _evaluated_on

    a, b = {"commit": "a" * 40, "dirty": []}, {"commit": "b" * 40, "dirty": ["jaxrl_mt/x.py"]}
    report = {"manifest": {"greedy_only": ["abl"]},
              "code": {"base": {"greedy": [{"code": a, "conversations_on_disk": 0}], "lic": []},
                       "abl": {"greedy": [{"code": a, "conversations_on_disk": 0}], "lic": []},
                       "k": {"greedy": [{"code": a, "conversations_on_disk": 0, "seconds_to_last_write": 99.6},
                                        {"code": a, "engine": 2, "conversations_on_disk": 5, "seconds": 10.0,
                                         "n_generated": 2}]},
                       "rl": {"greedy": [{"code": a, "conversations_on_disk": 0},
                                         {"code": b, "conversations_on_disk": 17}],
                              "lic": [{"code": b, "conversations_on_disk": 0, "note": "recorded later"}]}}}
    lines = _evaluated_on(report)
    assert "- base: greedy commit aaaaaaaaaaaa; lic not recorded" in lines
    assert "- abl: greedy commit aaaaaaaaaaaa; lic not run (--greedy-only)" in lines
    assert ("- rl: greedy commit aaaaaaaaaaaa; then commit bbbbbbbbbbbb, changed files jaxrl_mt/x.py "
            "(from conversation 17); lic commit bbbbbbbbbbbb, changed files jaxrl_mt/x.py [1]") in lines
    assert ("- k: greedy commit aaaaaaaaaaaa, killed after 100 s (to its last write); then commit aaaaaaaaaaaa, "
            "decode engine 2 (from conversation 5), 2 conversations in 10 s") in lines
    assert lines[-1] == "[1] recorded later"
    assert _evaluated_on({}) == []


def test_the_training_table_shows_no_group_or_temperature_for_sft_and_dpo() -> None:
    from experiments.markdown import _runs

    conf = {"steps": 19, "batch_size": 4, "group_size": 6, "lr": 1e-5, "alpha": 0.0, "temperature": 0.5}
    runs = {"dpo_full_s0": {"config": {"method": "dpo", **conf}, "curves": {}, "info": {}},
            "grpo_full_s0": {"config": {"method": "grpo", **conf}, "curves": {}, "info": {}}}
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in _runs({"runs": runs}) if line.startswith("| ")
            and line[2:].startswith(("dpo", "grpo"))}
    assert rows["dpo_full_s0"][1:7] == ["dpo", "-", "19", "4", "1e-05", "-"]
    assert rows["grpo_full_s0"][1:7] == ["grpo", "0.0", "19", "4 x 6", "1e-05", "0.5"]
