"""Before/after check of the GRPO math: the same fixed batch through the old dict-batch step and the new
TrainExample step must give the same metrics and update.

    python tests/rl/_grpo_before_after.py OLD_TREE OUT.json   # OLD_TREE: `git archive b1b4386 | tar -x -C OLD_TREE`

Each side runs in its own subprocess with its tree first on PYTHONPATH; both layouts (each prompt once for
its G completions, and one prompt per row) and a mu = 2 / dapo / beta > 0 step are compared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13]]
COMPS = [[30, 31, 32], [33, 34, 2], [34, 35, 36, 37, 38], [40]]
G, P, C = 2, 8, 8


def side(kind: str) -> dict:
    import jax
    import numpy as np

    from jaxrl_mt.models.decoder import init_params
    from jaxrl_mt.rl.optim import make_optimizer
    from jaxrl_mt.rl.step import LossConfig, make_train_step
    from tests.models.test_decoder import LLAMA

    params = init_params(LLAMA, jax.random.PRNGKey(1), scale=0.2)
    rng = np.random.default_rng(0)
    adv = rng.normal(size=4).astype(np.float32)
    ref = (np.log(1 / 64) + 0.05 * rng.normal(size=(4, C))).astype(np.float32)
    old = (np.log(1 / 64) + 0.05 * rng.normal(size=(4, C))).astype(np.float32)
    rows = [p for p in PROMPTS for _ in range(G)]
    opt = make_optimizer(1e-4, max_grad_norm=1.0)
    out = {}
    for name, lc in (("grpo", LossConfig(beta=0.04, loss_type="grpo", max_completion_length=C)),
                     ("dapo", LossConfig(beta=0.0, loss_type="dapo", epsilon_high=0.28, max_completion_length=C))):
        for layout in ("grouped", "rows"):
            if kind == "old":
                from jaxrl_mt.rl import step as st

                b = (st.assemble_grouped(PROMPTS, COMPS, 0, P, C) if layout == "grouped"
                     else st.assemble_rollouts(rows, COMPS, 0, P, C))
                b.update(advantages=adv, ref_logp=ref, old_logp=old)
                if name == "dapo":
                    b["num_items"] = st.dapo_num_items(b["completion_mask"], 1)
                fn = make_train_step(LLAMA, opt, lc, 0 if layout == "grouped" else P)
            else:
                from jaxrl_mt.rl.example import assemble_example
                from jaxrl_mt.rl.step import dapo_num_items

                b = (assemble_example(PROMPTS, COMPS, 0, P, C, group=G, advantages=adv) if layout == "grouped"
                     else assemble_example(rows, COMPS, 0, P, C, group=1, advantages=adv))
                b = b.replace(ref_logp=ref, old_logp=old)
                if name == "dapo":
                    b = b.replace(num_items=dapo_num_items(b.completion_mask, 1))
                fn = make_train_step(LLAMA, opt, lc)
            p2, _, m = fn(params, opt.init(params), b)
            out[f"{name}/{layout}"] = {"metrics": {k: float(v) for k, v in jax.device_get(m).items()},
                                       "params": [np.asarray(x, np.float64).ravel()[:64].tolist()
                                                  for x in jax.tree_util.tree_leaves(p2)]}
    return out


def main(old_tree: str, out: str) -> int:
    here = Path(__file__).resolve().parents[2]
    got = {}
    for kind, tree in (("old", old_tree), ("new", str(here))):
        env = dict(os.environ, PYTHONPATH=tree, JAX_PLATFORMS="cpu")
        r = subprocess.run([sys.executable, "-c", f"import json, runpy; side = runpy.run_path({__file__!r})['side']; "
                            f"print(json.dumps(side({kind!r})))"],
                           cwd=tree, env=env, capture_output=True, text=True)
        if r.returncode:
            print(r.stderr[-4000:], file=sys.stderr)
            return 1
        got[kind] = json.loads(r.stdout.strip().splitlines()[-1])
    worst = 0.0
    report = {}
    for key in got["old"]:
        a, b = got["old"][key], got["new"][key]
        dm = max(abs(a["metrics"][k] - b["metrics"][k]) for k in a["metrics"])
        dp = max(abs(x - y) for la, lb in zip(a["params"], b["params"]) for x, y in zip(la, lb))
        report[key] = {"max_metric_diff": dm, "max_param_diff": dp, "loss_old": a["metrics"]["loss"],
                       "loss_new": b["metrics"]["loss"]}
        worst = max(worst, dm, dp)
    Path(out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    print(f"worst difference: {worst:.3g}")
    return 0 if worst <= 1e-6 else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
