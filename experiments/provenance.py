"""Which code produced an experiment's files: the git commit of the checkout (no heavy imports)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CODE_FILE = "code.json"

__all__ = ["CODE_FILE", "code_version", "read_evaluation_code", "record_evaluation", "record_evaluation_time",
           "write_json_atomic"]


def code_version(root: Path = ROOT) -> dict[str, Any] | None:
    """The git commit of the checkout at ``root`` and whether its code differs from it.

    Returns:
      ``{"commit": SHA, "dirty": [changed tracked files under jaxrl_mt/, configs/ and experiments/]}``,
      or None when ``root`` is not a git checkout (or git is missing): an experiment's files then say so
      rather than name a commit that did not produce them.
    """
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        st = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "jaxrl_mt", "configs",
                             "experiments"], cwd=root, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return {"commit": sha.stdout.strip(), "dirty": sorted(line[3:] for line in st.stdout.splitlines() if line)}


def write_json_atomic(path: Path, obj: Any) -> None:
    """Writes ``obj`` as indented JSON to ``path`` through ``<path>.tmp``: a kill leaves the old file or the new."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def _conversations_on_disk(workdir: Path) -> int:
    """Conversations the evaluation's resume will keep from ``workdir/transcripts.jsonl`` (0: none):
    read by its own `TranscriptStore`, which drops (and removes) a last line cut short."""
    from jaxrl_mt.eval.transcripts import TranscriptStore  # json only: no model code

    path = workdir / "transcripts.jsonl"
    return len(TranscriptStore(path).load()) if path.is_file() else 0


def _time_killed(entry: dict[str, Any], transcripts: Path) -> None:
    """Sets ``seconds_to_last_write`` on an invocation's entry that has a start but no time (it was killed)."""
    if "seconds" in entry or "started" not in entry or not transcripts.is_file():
        return
    entry["seconds_to_last_write"] = round(max(0.0, transcripts.stat().st_mtime - entry["started"]), 1)


def record_evaluation(workdir: str | Path, root: Path = ROOT) -> list[dict[str, Any]]:
    """Appends this invocation's code version to ``workdir/code.json`` before an evaluation (re)starts.

    An evaluation resumed by a later invocation (perhaps on a later commit) keeps one entry per
    invocation, each with the number of conversations already on disk when it started, so the
    report can say which code wrote which part.

    An invocation killed before it ended (no ``seconds``) is timed by the next one: from its start to
    the transcript file's last write, as ``seconds_to_last_write`` (a lower bound: the conversation it
    was generating when killed is generated again).

    Returns:
      The list now in the file: ``[{"code": code_version(), "conversations_on_disk": n, "started": epoch
      seconds}, ...]``.
    """
    wd = Path(workdir)
    wd.mkdir(parents=True, exist_ok=True)
    entries = read_evaluation_code(wd)
    if entries:
        _time_killed(entries[-1], wd / "transcripts.jsonl")  # before the resume's load rewrites the file
    from jaxrl_mt.sampling.kernels import ENGINE_VERSION

    entries.append({"code": code_version(root), "engine": ENGINE_VERSION,
                    "conversations_on_disk": _conversations_on_disk(wd), "started": round(time.time(), 1)})
    write_json_atomic(wd / CODE_FILE, entries)
    return entries


def record_evaluation_time(workdir: str | Path, seconds: float, n_generated: int) -> list[dict[str, Any]]:
    """Adds the wall time and the conversations generated to this invocation's ``code.json`` entry
    (the last one, written by :func:`record_evaluation` when it started)."""
    wd = Path(workdir)
    entries = read_evaluation_code(wd)
    if not entries:
        raise ValueError(f"{wd / CODE_FILE}: no entry to add the time to (record_evaluation first)")
    entries[-1].update(seconds=round(float(seconds), 1), n_generated=int(n_generated))
    write_json_atomic(wd / CODE_FILE, entries)
    return entries


def read_evaluation_code(workdir: str | Path) -> list[dict[str, Any]]:
    """The entries of ``workdir/code.json`` ([] when the evaluation recorded none).

    Raises:
      ValueError: the file is not a JSON list of entries (its path is named).
    """
    path = Path(workdir) / CODE_FILE
    if not path.is_file():
        return []
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(entries, list) or not all(isinstance(x, dict) and "code" in x for x in entries):
        raise ValueError(f"{path}: expected a list of {{'code': ..., 'conversations_on_disk': n}} entries")
    return entries
