"""Op time of one traced greedy call (a jax.profiler perfetto trace) by category.

    python profile_categories.py TRACE_DIR TOKENS

Durations of XLA:CPU thunk events summed over threads (work run on both cores in parallel counts twice,
so the total can exceed the wall time); per-token figures divide by the call's TOKENS (prefill included).
"""

import collections
import glob
import gzip
import json
import sys

SKIP = ("$", "ThunkExecutor", "np.", "while")
CATEGORIES = (("ynn_fusion", "ynn (matmul fusions)"), ("dot", "dot (Eigen)"))


def category(name: str) -> str | None:
    if name.startswith(SKIP) or "Pjit" in name or "Await" in name:
        return None
    for prefix, label in CATEGORIES:
        if name.startswith(prefix):
            return label
    if "dynamic-slice" in name:
        return "dynamic-slice copies"
    if "reduce-window" in name or "broadcast_multiply" in name:
        return "attention mult-reduce"
    return "other fusions"


def main() -> None:
    path = glob.glob(sys.argv[1] + "/plugins/profile/*/perfetto_trace.json.gz")[0]
    tokens = int(sys.argv[2])
    d = json.load(gzip.open(path))
    events = d["traceEvents"] if isinstance(d, dict) else d
    total, count = collections.Counter(), collections.Counter()
    for e in events:
        c = category(e["name"]) if e.get("ph") == "X" else None
        if c is not None:
            total[c] += e.get("dur", 0)
            count[c] += 1
    all_ops = sum(total.values())
    for c, t in total.most_common():
        print(f"{c:28s} {t / 1000:8.1f} ms total, {t / 1000 / tokens:6.2f} ms/token, "
              f"{count[c] / tokens:6.1f} events/token, {100 * t / all_ops:4.1f}%")
    print(f"{'all ops':28s} {all_ops / 1000:8.1f} ms, {all_ops / 1000 / tokens:.2f} ms/token")


main()
