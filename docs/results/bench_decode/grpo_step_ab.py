"""A whole GRPO step of the trainer at the experiment's shapes: an older tree against this one, alternating.

    python docs/results/bench_decode/grpo_step_ab.py --old /tmp/old_tree [--rounds 3] [--steps 3] [--json OUT]

Each side is `python -m jaxrl_mt.train --config configs/grpo.py:cpu` run from its own tree (the
`--old` checkout, e.g. `git worktree add /tmp/old_tree a7880e9`, main before issue 51, and this
one), in a fresh workdir, with the experiment's shapes: 4 prompts x G 6, 128 new tokens, T = 1,
the embedded model, the rows ending at the model's own EOS. Both sides train on the same items,
written into each workdir before the run (single-turn GSM8K questions of the shipped sample with
exp2's system prompt: no history stage, no held-out evaluation), with the same seed. Step 1
compiles; the steady step is the median of the later steps' `perf/step_s` (from `metrics.jsonl`).
Prints every run's steady step and phase split, the medians per side and the ratio old / new.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(HERE))
PHASES = ("perf/step_s", "perf/rollout_s", "perf/score_s", "perf/update_s")


def write_items(wd: Path, n: int) -> None:
    """`train_items.jsonl` of n single-turn GSM8K items (the recipe reads it instead of making histories)."""
    from jaxrl_mt.data.loaders import load_source
    from jaxrl_mt.rl.histories import save_items
    from jaxrl_mt.rl.icpo import make_items

    items = make_items(load_source("gsm8k:@")[:n], ratio=0.0, seed=0)
    wd.mkdir(parents=True, exist_ok=True)
    save_items(wd / "train_items.jsonl", items, {"n_items": len(items)})


def run(tree: Path, wd: Path, a: argparse.Namespace) -> dict[str, float]:
    """One training run from `tree`; returns the steady step's median phases."""
    from configs.rlsta import EXP2_SYSTEM

    write_items(wd, 16)
    args = [sys.executable, "-m", "jaxrl_mt.train", "--config", "configs/grpo.py:cpu", f"--config.workdir={wd}",
            f"--config.rl.steps={a.steps}", "--config.rl.batch_size=4", "--config.rl.group_size=6",
            "--config.rl.max_new_tokens=128", "--config.rl.max_batch=64", "--config.data.heldout=0",
            f"--config.checkpoint.every={a.steps}", "--config.export=False", f"--config.system_prompt={EXP2_SYSTEM}"]
    env = {**os.environ, "PYTHONPATH": str(tree), "JAX_PLATFORMS": "cpu"}
    r = subprocess.run(args, cwd=tree, env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{tree}: exit {r.returncode}\n{r.stderr[-3000:]}")
    rows = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steady = [x for x in rows if "train/loss" in x and x["step"] > 1]
    return {k: statistics.median(x[k] for x in steady) for k in PHASES if all(k in x for x in steady)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    out: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for k in range(a.rounds):
        for side, tree in (("old", a.old.resolve()), ("new", HERE)):
            wd = Path(tempfile.mkdtemp(prefix=f"grpo_ab_{side}_"))
            try:
                out[side].append(run(tree, wd, a))
            finally:
                shutil.rmtree(wd, ignore_errors=True)
            print(f"round {k + 1} {side}: " + ", ".join(f"{p} {v:.2f}" for p, v in out[side][-1].items()), flush=True)
    med = {s: statistics.median(r["perf/step_s"] for r in out[s]) for s in out}
    ratio = med["old"] / med["new"]
    print(f"steady step median: old {med['old']:.2f} s, new {med['new']:.2f} s, old / new {ratio:.2f}x")
    if a.json:
        a.json.write_text(json.dumps({"runs": out, "median_step_s": med, "ratio": med["old"] / med["new"]}, indent=2))


if __name__ == "__main__":
    main()
