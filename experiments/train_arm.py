"""Run one training arm and record its wall time, peak memory and the machine load.

    python -m experiments.train_arm --config configs/rlsta.py:experiment [--config.rl.steps=2 ...]

Runs ``python -m jaxrl_mt.train`` with the same arguments in a child process and writes
``<workdir>/run_info.json``: wall seconds, the child's peak resident memory (``getrusage``
``ru_maxrss`` of the children), the 1-minute load average sampled every 30 s (the machine may be
shared), the command, the exit status and the code version (``code``: git commit and changed
files, `provenance.code_version`). The workdir is read from the config file (and a
``--config.workdir=`` override). Exits with the training's status.
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

from experiments.provenance import code_version

__all__ = ["main", "workdir_of"]


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


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    wd = workdir_of(args)
    code = code_version()
    cmd = [sys.executable, "-m", "jaxrl_mt.train", *args]
    loads: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            loads.append(os.getloadavg()[0])
            stop.wait(30)

    t = threading.Thread(target=sample, daemon=True)
    t0 = time.time()
    t.start()
    rc = subprocess.call(cmd)
    stop.set()
    t.join()
    wall = time.time() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
    info = {"wall_s": round(wall, 1), "peak_rss_gb": round(peak_kb / 2**20, 3), "exit_status": rc,
            "load_avg_mean": round(sum(loads) / len(loads), 2) if loads else None, "cpu_count": os.cpu_count(),
            "command": " ".join(["python -m experiments.train_arm", *args]), "code": code,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
    wd.mkdir(parents=True, exist_ok=True)
    prev = wd / "run_info.json"
    if prev.is_file():  # a resumed run: keep the earlier invocations' wall time
        old = json.loads(prev.read_text())
        info["invocations"] = old.get("invocations", [old]) + [dict(info)]
        info["wall_s"] = round(sum(i["wall_s"] for i in info["invocations"]), 1)
        info["peak_rss_gb"] = max(i["peak_rss_gb"] for i in info["invocations"])
    prev.write_text(json.dumps(info, indent=2) + "\n")
    print(f"run_info: {prev}: wall {info['wall_s']:.0f} s, peak RSS {info['peak_rss_gb']:.2f} GB, exit {rc}",
          file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
