"""What both sides of ``benchmarks grpo`` share: the optimizer constants, CPU pinning, peak and
per-phase memory, and the first / steady step summary."""

from __future__ import annotations

import os
import resource
from typing import Sequence

LR = 1e-6  # AdamW learning rate of both sides (constant schedule)
MAX_GRAD_NORM = 1.0  # global-norm clipping of both sides


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class PhaseRss:
    """Samples this process's resident memory (VmRSS) every ``period`` seconds in a thread and keeps
    the largest value seen per phase label (``self.phase``, set by the caller around each phase)."""

    def __init__(self, period: float = 0.05) -> None:
        import threading

        self.phase = "setup"
        self.peak: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period,), daemon=True)
        self._thread.start()

    @staticmethod
    def current_mb() -> float:
        with open("/proc/self/status", encoding="ascii") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return kb / 1024.0

    def _run(self, period: float) -> None:
        while not self._stop.wait(period):
            phase, mb = self.phase, self.current_mb()
            self.peak[phase] = max(self.peak.get(phase, 0.0), mb)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return {k: round(v, 1) for k, v in self.peak.items()}


def pin_cpus(n: int) -> None:
    """Restricts this process to `n` of its CPUs, so XLA's and torch's thread pools both size to `n`."""
    cpus = sorted(os.sched_getaffinity(0))
    if n < len(cpus):
        os.sched_setaffinity(0, cpus[:n])


def summarize(step_s: Sequence[float], cpu_s: Sequence[float]) -> dict[str, float]:
    """First step and mean of the later steps (NaN with a single step), wall and CPU seconds."""
    return {"first_step_s": float(step_s[0]), "steady_step_s": mean_later(step_s),
            "first_step_cpu_s": float(cpu_s[0]), "steady_step_cpu_s": mean_later(cpu_s)}


def mean_later(xs: Sequence[float]) -> float:
    later = list(xs[1:])
    return float(sum(later) / len(later)) if later else float("nan")


# ----------------------------------------------------------------------------- our stack
