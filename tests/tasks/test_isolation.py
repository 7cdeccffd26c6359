"""The sandbox's OS isolation: the mode probe, the degradation notice, the throwaway-uid sweep."""

from __future__ import annotations

import logging
import os
import subprocess
import time

import pytest

import jaxrl_mt.tasks.isolation as iso
from jaxrl_mt.tasks.sandbox import SandboxLimits, run_python


def test_probe_is_cached_and_names_its_mode():
    found = iso.isolation()
    assert iso.isolation() is found
    assert found.mode in ("full", "uid", "none") and os.path.exists(found.python)
    assert (found.notice == "") == (found.mode == "full")
    if os.geteuid() == 0:
        assert found.mode != "none", found.label  # root on Linux gets at least the uid drop


def test_degraded_mode_is_logged_once_and_named_in_every_result(monkeypatch, caplog):
    import sys

    monkeypatch.setattr(iso, "_FOUND", None)
    monkeypatch.setattr(iso, "_find", lambda: iso.Isolation("none", sys.executable, "no namespaces in this test"))
    with caplog.at_level(logging.WARNING, logger="jaxrl_mt.tasks.isolation"):
        iso.isolation()
        iso.isolation()
        r = run_python("print(1)", limits=SandboxLimits(timeout_s=5))
    label = (
        "rlimits-only (degraded): no namespaces in this test; NOT isolated: network, SysV IPC, host Unix sockets, "
        "the calling user's files, host processes and /proc/<parent> (environ, cmdline)"
    )
    assert [rec.getMessage() for rec in caplog.records] == [f"sandbox isolation degraded: {label}"]
    assert r.verdict == "passed" and r.isolation == label


def test_kill_uid_sweeps_a_process_that_left_the_group():
    if os.geteuid() != 0:
        pytest.skip("needs root to start a process under another uid")
    uid = iso.new_uid()
    assert iso._UID_BASE <= uid < iso._UID_BASE + iso._UID_SPAN
    proc = subprocess.Popen(["sleep", "30"], user=uid, group=uid, extra_groups=[], start_new_session=True)
    try:
        time.sleep(0.05)
        assert iso.kill_uid(uid) == 1
        assert proc.wait(timeout=5) == -9
        assert iso.kill_uid(uid) == 0
    finally:
        proc.kill()
        proc.wait()


def test_world_executable_follows_every_directory(tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    exe = private / "tool"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    os.chmod(tmp_path, 0o755)
    assert not iso._world_executable(str(exe))  # the 0700 directory blocks other users
    private.chmod(0o755)
    assert iso._world_executable(str(exe)) == all(
        os.stat(d).st_mode & 0o001 for d in [str(tmp_path), *map(str, tmp_path.parents)]
    )


def test_an_interpreter_outside_the_system_paths_is_bound_into_the_minimal_root(tmp_path, monkeypatch):
    if iso.isolation().mode != "full":
        pytest.skip(f"sandbox isolation here is {iso.isolation().label!r}")
    for d in [tmp_path, *tmp_path.parents]:
        os.chmod(d, os.stat(d).st_mode | 0o005)
    (tmp_path / "bin").mkdir()
    link = tmp_path / "bin" / "python3"
    link.symlink_to(os.path.realpath(iso.isolation().python))
    paths = iso._ro_paths(str(link))
    assert paths == (*iso._SYSTEM_PATHS, str(tmp_path / "bin"))  # its stdlib is under /usr: covered
    assert iso._try_mode("full", str(link), paths) == ""
    prog = "import subprocess as s, sys\nprint(sys.executable, s.run([sys.executable, '-c', 'print(7)']).returncode)"
    results = []
    for ro_paths in (paths, iso._SYSTEM_PATHS):  # with and without its directory in the root
        monkeypatch.setattr(iso, "_FOUND", iso.Isolation("full", str(link), ro_paths=ro_paths))
        results.append(run_python(prog, limits=SandboxLimits(timeout_s=10)))
    assert results[0].verdict == "passed" and results[0].stdout == f"7\n{link} 0\n", results[0]
    assert results[1].verdict == "crashed" and "FileNotFoundError" in results[1].reason, results[1]


def test_the_uid_fallback_still_starts():
    if os.geteuid() != 0:
        pytest.skip("needs root to start a process under another uid")
    assert iso._try_mode("uid", iso.isolation().python) == ""
