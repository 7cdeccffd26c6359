"""A process of the multi-process evaluation test: `evaluate` (LiC sharded, greedy) or `sedt_eval`.

    python tests/_eval_worker.py evaluate MODEL_DIR WORKDIR
    python tests/_eval_worker.py sedt MODEL_DIR OUT

Run with JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID for a multi-process run
(`parallel.maybe_initialize_distributed` reads them), without for the one-process reference.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def eval_config(model_dir: str, workdir: str):
    spec = importlib.util.spec_from_file_location("eval_lic_config", ROOT / "configs" / "eval_lic.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = mod.get_config("cpu")
    cfg.lock()
    for k, v in dict(model=model_dir, dataset=("synthetic:4",), limit=0, scenarios=("sharded",), runs=1,
                     temperature=0.0, max_new_tokens=4, workdir=workdir, bootstrap=10, plots=False,
                     mesh_shape="auto").items():
        setattr(cfg, k, v)
    return cfg


def main(mode: str, model_dir: str, out: str) -> int:
    if mode == "evaluate":
        from jaxrl_mt.evaluate import evaluate

        evaluate(eval_config(model_dir, out), log=lambda s: None)
        return 0
    from jaxrl_mt.eval.sedt_eval import main as sedt_main
    from jaxrl_mt.parallel import maybe_initialize_distributed

    maybe_initialize_distributed()
    return sedt_main(["--problems", "2", "--runs", "1", "--out", out, "--model", model_dir, "--max-new-tokens", "4",
                      "--temperature", "0", "--max-batch", "4", "--block", "2", "--mesh-shape", "auto"])


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
