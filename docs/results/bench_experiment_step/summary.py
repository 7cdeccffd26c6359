"""Summary of run.sh: median per-phase seconds of the steady steps (2..N) of each side, their ratio, peak RSS."""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

KEYS = [("perf/step_s", "step"), ("perf/rollout_s", "rollout (generate)"), ("perf/score_s", "score (ref + anchor)")]


def side(out: Path, name: str) -> dict[str, float]:
    rows = [json.loads(x) for x in (out / f"metrics_{name}.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if "perf/step_s" in r and r["step"] >= 2]  # step 1 compiles
    med = {k: statistics.median(r[k] for r in steps) for k, _ in KEYS}
    med["update (rest)"] = med["perf/step_s"] - med["perf/rollout_s"] - med["perf/score_s"]
    log = (out / f"{name}.log").read_text()
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", log)
    med["peak RSS (GB)"] = int(rss.group(1)) / 1e6 if rss else float("nan")
    med["n"] = len(steps)
    commit = re.search(r"^commit (\w+)", log, re.M)
    med["commit"] = commit.group(1)[:12] if commit else "?"
    return med


def main(out: Path) -> None:
    old, new = side(out, "old"), side(out, "new")
    print(f"Steady steps 2..{old['n'] + 1} (medians, seconds); old {old['commit']}, new {new['commit']}\n")
    print("| phase | old | new | old / new |\n|---|---:|---:|---:|")
    for k, label in [*KEYS, ("update (rest)", "update (rest)"), ("peak RSS (GB)", "peak RSS (GB)")]:
        print(f"| {label} | {old[k]:.2f} | {new[k]:.2f} | {old[k] / new[k]:.2f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
