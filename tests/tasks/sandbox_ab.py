"""Same-run A/B of the sandbox's per-run cost: the sandbox of a git commit against this tree's.

Usage (from the repository root, as root so that both get their ``full`` mode)::

    PYTHONPATH=$PWD python tests/tasks/sandbox_ab.py --runs 50 --ballast-mb 0
    PYTHONPATH=$PWD python tests/tasks/sandbox_ab.py --runs 50 --ballast-mb 1024

"before" is ``jaxrl_mt/tasks/{sandbox_init,memcap,isolation,sandbox}.py`` at ``--before`` (default:
main before issue 53's IPC/UTS namespaces and whole-run memory bound; ``b1b4386`` is the one before
the PID namespace and the minimal root), loaded from ``git show`` under other module names. Each
round runs one HumanEval-style program (HumanEval/0 with its check) through both, alternating,
so host load hits both alike; ``--ballast-mb`` touches that much memory in this process first (a
large parent makes every ``fork`` dearer). Prints the medians and their ratio.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROGRAM = '''
from typing import List

def has_close_elements(numbers: List[float], threshold: float) -> bool:
    for i, a in enumerate(numbers):
        for j, b in enumerate(numbers):
            if i != j and abs(a - b) < threshold:
                return True
    return False


def check(candidate):
    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True
    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False
    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) == True
    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.8) == False
    assert candidate([1.0, 2.0, 3.0, 4.0, 5.0, 2.0], 0.1) == True
    assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 1.0) == True
    assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 0.5) == False

check(has_close_elements)
'''


_MODULES = ("sandbox_init", "memcap", "isolation", "sandbox")


def _load_before(commit: str, folder: Path):
    """The sandbox module of ``commit``, importing that commit's other sandbox modules."""
    for name in _MODULES:
        r = subprocess.run(["git", "show", f"{commit}:jaxrl_mt/tasks/{name}.py"], capture_output=True, text=True,
                           check=False)
        if r.returncode:
            continue  # not in that commit
        src = r.stdout
        for other in _MODULES:
            src = src.replace(f"from jaxrl_mt.tasks import {other}\n", f"import before_{other} as {other}\n")
            src = src.replace(f"from jaxrl_mt.tasks.{other} import", f"from before_{other} import")
        (folder / f"before_{name}.py").write_text(src)
    sys.path.insert(0, str(folder))
    return importlib.import_module("before_sandbox")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="562155e", help="git commit of the 'before' sandbox")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--ballast-mb", type=int, default=0)
    args = ap.parse_args()
    from jaxrl_mt.tasks import sandbox as after

    ballast = bytearray(args.ballast_mb << 20)
    ballast[::4096] = b"\1" * len(range(0, len(ballast), 4096))
    with tempfile.TemporaryDirectory() as tmp:
        before = _load_before(args.before, Path(tmp))
        sides = {"before": before, "after": after}
        for mod in sides.values():  # the once-per-process probe, outside the timing
            assert mod.run_python(PROGRAM, limits=mod.SandboxLimits(timeout_s=10), allow_exit=False).verdict == "passed"
        times: dict[str, list[float]] = {k: [] for k in sides}
        for _ in range(args.runs):
            for name, mod in sides.items():
                t = time.perf_counter()
                r = mod.run_python(PROGRAM, limits=mod.SandboxLimits(timeout_s=10), allow_exit=False)
                times[name].append(time.perf_counter() - t)
                assert r.verdict == "passed", r
    print(f"parent ballast {args.ballast_mb} MiB, {args.runs} runs each, alternating")
    for name, mod in sides.items():
        v = sorted(times[name])
        print(f"{name:6s} {mod.isolation().label}: median {statistics.median(v) * 1e3:.1f} ms "
              f"(p10 {v[len(v) // 10] * 1e3:.1f}, p90 {v[len(v) * 9 // 10] * 1e3:.1f})")
    print(f"after/before median: {statistics.median(times['after']) / statistics.median(times['before']):.3f}")


if __name__ == "__main__":
    main()
