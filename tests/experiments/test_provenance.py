"""code_version: the commit and the changed code files of a real git checkout, None outside one."""

from __future__ import annotations

import subprocess
from pathlib import Path

from jaxrl_mt.experiments.provenance import code_version


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()


def test_commit_and_changed_code_files(tmp_path: Path) -> None:
    assert code_version(tmp_path) is None  # not a checkout
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@example.com")
    _git(tmp_path, "config", "user.name", "t")
    (tmp_path / "jaxrl_mt").mkdir()
    (tmp_path / "configs").mkdir()
    for f in ("jaxrl_mt/a.py", "configs/c.py", "README.md"):
        (tmp_path / f).write_text("x = 1\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "one")
    sha = _git(tmp_path, "rev-parse", "HEAD")
    assert code_version(tmp_path) == {"commit": sha, "dirty": []}
    (tmp_path / "jaxrl_mt" / "a.py").write_text("x = 2\n")
    (tmp_path / "configs" / "c.py").write_text("y = 2\n")
    (tmp_path / "README.md").write_text("docs only\n")  # not code: not listed
    assert code_version(tmp_path) == {"commit": sha, "dirty": ["configs/c.py", "jaxrl_mt/a.py"]}


def test_the_report_names_the_commit_each_run_trained_on() -> None:
    from jaxrl_mt.experiments.markdown import _runs

    code = {"commit": "0123456789abcdef0123", "dirty": ["configs/x.py"]}
    runs = {"rlsta_exp": {"config": {"method": "rlsta"}, "curves": {}, "info": {"wall_s": 60.0, "code": code}},
            "grpo_exp": {"config": {"method": "grpo"}, "curves": {}, "info": {"wall_s": 60.0}}}
    lines = _runs({"runs": runs})
    assert "- rlsta_exp: commit 0123456789ab, changed files configs/x.py" in lines
    assert "- grpo_exp: not recorded" in lines
    assert not any("Code each run" in x for x in _runs({"runs": {"grpo_exp": runs["grpo_exp"]}}))
