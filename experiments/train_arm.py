"""Run one training arm and record its wall time, peak memory and the machine load.

    python -m experiments.train_arm --config configs/rlsta.py:experiment [--config.rl.steps=2 ...]

Runs ``python -m jaxrl_mt.train`` with the same arguments in a child process and writes
``<workdir>/run_info.json``: wall seconds, the child's peak resident memory (``getrusage``
``ru_maxrss`` of the children), the 1-minute load average sampled every 30 s (the machine may be
shared), the command, the exit status and the code version (``code``: git commit and changed
files, `provenance.code_version`). The workdir is read from the config file (and a
``--config.workdir=`` override). Exits with the training's status.

The entry is written when the run starts (exit status None) and completed when it ends, so a run
killed before it ended (a machine stopped, a session over) is still on record: the invocation that
resumes it times it to the workdir's last write and keeps it under ``invocations``.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from experiments.provenance import code_version, write_json_atomic

__all__ = ["earlier_invocations", "main", "merged", "workdir_of"]


def workdir_of(args: list[str]) -> Path:
    """The training workdir named by ``--config FILE[:preset]`` and an optional ``--config.workdir=``."""
    for a in args:
        if a.startswith("--config.workdir="):
            return Path(a.split("=", 1)[1])
    spec = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"), None)
    spec = spec or next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), None)
    if spec is None:
        raise SystemExit("train_arm: --config FILE[:preset] is required")
    import importlib.util

    file, _, preset = spec.partition(":")
    mod_spec = importlib.util.spec_from_file_location("_train_arm_config", file)
    if mod_spec is None or not Path(file).is_file():
        raise SystemExit(f"train_arm: config file {file!r} not found")
    sys.path.insert(0, str(Path(file).resolve().parent))
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)  # type: ignore[union-attr]
    c = mod.get_config(preset) if preset else mod.get_config()
    return Path(c.workdir)


def _last_write(wd: Path) -> float | None:
    """The newest modification time of a file under ``wd`` other than ``run_info.json`` (None: no file)."""
    times = [p.stat().st_mtime for p in wd.rglob("*") if p.is_file() and p.name != "run_info.json"]
    return max(times) if times else None


def earlier_invocations(wd: Path) -> list[dict[str, Any]]:
    """The invocations ``wd/run_info.json`` records ([] when none), an invocation killed before it ended
    (its entry written at the start: exit status None, no wall time) timed to the workdir's last write.

    The time to the last write is a lower bound of what the killed invocation spent (it ran on until the
    kill, and the next invocation redoes its steps since the last checkpoint); its peak memory is unknown
    (None).
    """
    prev = wd / "run_info.json"
    if not prev.is_file():
        return []
    try:
        old = json.loads(prev.read_text())
    except json.JSONDecodeError as e:
        raise SystemExit(f"train_arm: {prev}: invalid JSON ({e.msg} at line {e.lineno})") from None
    invs = [dict(i) for i in old.get("invocations", [old])]
    last = invs[-1]
    if "wall_s" not in last and last.get("started_s") is not None:
        end = _last_write(wd)
        last.update(killed=True, peak_rss_gb=None,
                    wall_s=round(max(0.0, end - last["started_s"]), 1) if end else 0.0)
    return invs


def merged(invs: list[dict[str, Any]]) -> dict[str, Any]:
    """``run_info.json``'s content for invocations ``invs`` (oldest first): the last one's fields, and for a
    resumed run every invocation under ``invocations`` with the wall time summed and the largest peak memory."""
    if len(invs) == 1:
        return dict(invs[0])
    walls = [i["wall_s"] for i in invs if i.get("wall_s") is not None]
    rss = [i["peak_rss_gb"] for i in invs if i.get("peak_rss_gb") is not None]
    return {**invs[-1], "invocations": invs, "wall_s": round(sum(walls), 1) if walls else None,
            "peak_rss_gb": max(rss) if rss else None}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    wd = workdir_of(args)
    wd.mkdir(parents=True, exist_ok=True)
    earlier = earlier_invocations(wd)
    t0 = time.time()
    start = {"command": " ".join(["python -m experiments.train_arm", *args]), "code": code_version(),
             "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "started_s": round(t0, 1), "exit_status": None}
    write_json_atomic(wd / "run_info.json", merged([*earlier, start]))  # a kill leaves this (the resume times it)
    loads: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            loads.append(os.getloadavg()[0])
            stop.wait(30)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    rc = subprocess.call([sys.executable, "-m", "jaxrl_mt.train", *args])
    stop.set()
    t.join()
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
    info = {"wall_s": round(time.time() - t0, 1), "peak_rss_gb": round(peak_kb / 2**20, 3), "exit_status": rc,
            "load_avg_mean": round(sum(loads) / len(loads), 2) if loads else None, "cpu_count": os.cpu_count(),
            **{k: start[k] for k in ("command", "code", "started", "started_s")},
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
    info = merged([*earlier, info])
    write_json_atomic(wd / "run_info.json", info)
    print(f"run_info: {wd / 'run_info.json'}: wall {info['wall_s']:.0f} s, peak RSS {info['peak_rss_gb']:.2f} GB, "
          f"exit {rc}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
