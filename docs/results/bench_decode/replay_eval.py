"""Re-runs a committed evaluation of exp2 with this tree's code and compares it with the record.

    PYTHONPATH=<tree> python docs/results/bench_decode/replay_eval.py [EVAL_DIR] --out WORKDIR

EVAL_DIR (default: exp2's base greedy evaluation) holds eval_config.json and transcripts.jsonl.gz.
The evaluation runs with the comparison's settings (`experiments.compare`: the same tasks,
scenarios, budget, system prompt, temperature, seed, max_batch 64, reuse_cache off unless
--reuse-cache) into a fresh WORKDIR (--limit N: N instructions per source); the script prints the
wall seconds, the decode counters the evaluation recorded (when the tree records them) and how
many of the assistant replies it produced differ from the committed ones (conversation, turn).
Run it with PYTHONPATH pointing at an old and a new tree, alternating, on an idle host.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DEFAULT = ROOT / "docs/results/exp2/report/models/base/greedy"


def replies(path: Path) -> dict[tuple[str, int], str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return {(r["conv_id"], t["index"]): t["assistant"] for r in map(json.loads, f) for t in r["turns"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("eval_dir", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--limit", type=int, default=0, help="instructions per source (0: all); compares those run")
    ap.add_argument("--reuse-cache", action="store_true",
                    help="keep each conversation's KV cache across turns (the recorded runs did not)")
    a = ap.parse_args()
    from experiments.common import eval_config
    from jaxrl_mt.evaluate import evaluate, load_eval_model

    saved = json.loads((a.eval_dir / "eval_config.json").read_text())
    committed = a.eval_dir / "transcripts.jsonl.gz"
    with gzip.open(committed, "rt", encoding="utf-8") as f:
        recs = [json.loads(line) for line in f]
    kinds, runs = sorted({r["kind"] for r in recs}), 1 + max(r["run"] for r in recs)
    dataset = tuple(saved["dataset"])  # paths relative to the repository root (run from there)
    cfg = eval_config(model=saved["model"], limit=a.limit, max_new_tokens=saved["max_new_tokens"],
                      system_prompt=saved["system_prompt"], max_batch=a.max_batch, workdir=str(a.out), plots=False,
                      seed=saved["seed"], bootstrap=200, reuse_cache=a.reuse_cache, dataset=dataset,
                      scenarios=",".join(kinds), runs=runs, temperature=saved["temperature"],
                      protocol=saved["protocol"], abstain=saved.get("abstain", False))
    model = load_eval_model(saved["model"])
    t0 = time.perf_counter()
    res = evaluate(cfg, model=model, log=lambda s: None)
    wall = time.perf_counter() - t0
    new, old = replies(a.out / "transcripts.jsonl"), replies(committed)
    differ = sorted(k for k in new if new[k] != old.get(k))
    inv = res["report"].get("this_invocation", {}) if res["report"] else {}
    out = {"tree": str(Path(sys.modules["jaxrl_mt"].__file__).parents[1]), "wall_s": wall,
           "evaluate_s": res["seconds"], "replies": len(new), "reuse_cache": a.reuse_cache, "limit": a.limit,
           "differ": len(differ), "first_differ": differ[:10],
           "decode": inv.get("decode")}
    print(json.dumps(out, indent=1))
    (a.out / "replay.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
