"""GRPO steps with tunix's `GRPOLearner` (run as a script in tunix's venv; imports no jaxrl_mt).

    .venv-tunix/bin/python jaxrl_mt/benchmarks/tunix_grpo_side.py --job JOB.json --out OUT.json

The shape of `benchmarks grpo`: P prompts x G generations, exactly N new tokens (EOS -1, so no row
stops), temperature 1, beta (a reference model; full fine-tuning: a second copy of the folder), AdamW
lr 1e-6 with global-norm clipping at 1, one update per step (``num_iterations`` 1, the whole
P*G batch one mini-batch), fp32, tunix's vanilla rollout (its `Sampler`). Prompts are token ids
(`tunix_side.IdsTokenizer`); the reward is a cheap function of the completion ids (not a verifier),
so rewards vary within groups and the update is not a no-op.

LoRA (``lora_rank`` R > 0), as tunix's own GRPO demos and CLI do it: ``qwix.LoraProvider`` over the
seven projections of every layer (`LORA_MODULES`, the regex of tunix's LoRA tests), rank R, alpha
2R, applied with ``qwix.apply_lora_to_model(base, provider, **base.get_model_input())``; the actor
is the LoRA model and the reference the base model itself (no second copy: tunix's `RLCluster`
shares the backbone), and tunix's trainer then optimizes ``nnx.LoRAParam`` only. The result
reports the parameter count of the trainer's optimizer (``trainable_params``: what its
``nnx.Optimizer.wrt`` selects) and whether the actor's base weights are bit-identical after
training (``base_unchanged``; with full fine-tuning they are the trained weights: False after any update).

Step times: tunix's `train` owns the loop, so each step is timed as the gap between successive
fetches of a batch from the dataset iterator (the first gap includes compilation; the last runs to
the end of `train`, so it also holds whatever `train` does after its last step). Peak RSS:
``ru_maxrss`` of this process.

Job fields: ``hf_dir``, ``prompts`` (P id lists), ``group``, ``new_tokens``, ``prompt_len``,
``beta``, ``steps``, ``pad_id``; optional ``lora_rank`` (0: full fine-tuning), ``remat`` (tunix's
`RematConfig`: "none", the default, or "block") and ``micro_batch`` (prompts per micro-batch,
gradient accumulation over the rest). At 4 x G 4 x 128 tokens with neither, tunix 0.1.7 grew
past 18 GB RSS on the CPU (OOM-killed).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

# tunix Llama3 module paths ("layers/3/attn/q_proj", "layers/3/mlp/down_proj", ...): the seven projections
# (the regex of tunix's own LoRA tests, tunix/tests/lora_params_test_base.py)
LORA_MODULES = ".*q_proj|.*k_proj|.*v_proj|.*o_proj|.*gate_proj|.*up_proj|.*down_proj"


def reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """Fraction of even ids in each completion: varies across samples, costs nothing."""
    out = []
    for c in completions:
        ids = [int(t) for t in c.split()]
        out.append(sum(t % 2 == 0 for t in ids) / max(len(ids), 1))
    return out


def with_lora(base: Any, rank: int) -> Any:
    """The base model with qwix LoRA adapters (rank, alpha 2 x rank) on every layer's seven projections,
    as tunix's demos make it (a clone sharing the base's arrays; the adapters' B start at zero)."""
    import qwix
    from flax import nnx

    provider = qwix.LoraProvider(module_path=LORA_MODULES, rank=rank, alpha=2.0 * rank)
    return qwix.apply_lora_to_model(base, provider, rngs=nnx.Rngs(0), **base.get_model_input())


def build(job: dict[str, Any], tmp: str) -> tuple[Any, Any]:
    """(GRPOLearner, its RLCluster) for the job's shape on a 1-device mesh."""
    import jax
    import optax
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout
    from tunix.sft import metrics_logger

    from tunix_side import IdsTokenizer, load  # noqa: E402 (this script's folder is on sys.path)

    remat = job.get("remat", "none")  # tunix's RematConfig name: none | block
    rank = int(job.get("lora_rank", 0))
    if rank:  # tunix's LoRA way: the actor is the LoRA model, the reference the base (shared backbone)
        reference, _ = load(job["hf_dir"], remat=remat)
        actor = with_lora(reference, rank)
    else:
        actor, _ = load(job["hf_dir"], remat=remat)
        reference, _ = load(job["hf_dir"], remat=remat)
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)  # Explicit (the
    # default) fails in tunix 0.1.7's embedding gather (ShardingTypeError)
    n, width, batch = job["new_tokens"], job["prompt_len"], len(job["prompts"]) * job["group"]
    training = rl_cluster_lib.RLTrainingConfig(
        actor_optimizer=optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-6, weight_decay=0.0)),
        eval_every_n_steps=10**9, max_steps=job["steps"], mini_batch_size=len(job["prompts"]),
        train_micro_batch_size=job.get("micro_batch") or len(job["prompts"]),
        metrics_logging_options=metrics_logger.MetricsLoggerOptions(log_dir=tmp),
        checkpoint_root_directory=None)
    rollout = base_rollout.RolloutConfig(max_tokens_to_generate=n, max_prompt_length=width, temperature=1.0,
                                         top_p=None, kv_cache_size=width + n + 8, eos_tokens=[-1])
    roles = rl_cluster_lib.Role
    cluster = rl_cluster_lib.RLCluster(
        actor=actor, reference=reference, tokenizer=IdsTokenizer(job["pad_id"]),
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={roles.ACTOR: mesh, roles.REFERENCE: mesh, roles.ROLLOUT: mesh},
            rollout_engine="vanilla", offload_to_cpu=False, training_config=training, rollout_config=rollout))
    cfg = grpo_learner.GRPOConfig(num_generations=job["group"], num_iterations=1, beta=job["beta"], epsilon=0.2)
    del batch
    return grpo_learner.GRPOLearner(rl_cluster=cluster, algo_config=cfg, reward_fns=reward), cluster


def trainable_params(cluster: Any) -> tuple[int, int]:
    """(parameters the actor's optimizer updates, i.e. its ``wrt`` filter selects; all the actor's parameters)."""
    import jax
    from flax import nnx

    trainer = cluster.actor_trainer
    count = lambda state: sum(int(x.size) for x in jax.tree.leaves(state))  # noqa: E731
    return count(nnx.state(trainer.model, trainer.optimizer.wrt)), count(nnx.state(trainer.model, nnx.Param))


def base_digest(cluster: Any) -> list[str]:
    """A digest per base (non-LoRA) parameter array of the actor, to tell whether training changed them."""
    import hashlib

    import jax
    import numpy as np
    from flax import nnx

    state = nnx.state(cluster.actor_trainer.model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))
    return [hashlib.blake2b(np.ascontiguousarray(np.asarray(x)).data, digest_size=16).hexdigest()
            for x in jax.tree.leaves(state)]


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Builds the learner and runs ``steps`` GRPO steps; step times from the dataset's fetch times."""
    import tempfile

    import numpy as np

    fetched: list[float] = []
    texts = np.array([" ".join(map(str, p)) for p in job["prompts"]])

    def dataset():
        for _ in range(job["steps"] + 2):
            fetched.append(time.perf_counter())
            yield {"prompts": texts}

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        learner, cluster = build(job, tmp)
        build_s = time.perf_counter() - t0
        n_trainable, n_params = trainable_params(cluster)
        before = base_digest(cluster)
        t0 = time.perf_counter()
        learner.train(dataset())
        end = time.perf_counter()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the digests after training
        base_unchanged = base_digest(cluster) == before
    marks = [*fetched[:job["steps"]], end]
    steps = [b - a for a, b in zip(marks, marks[1:])]
    return {"side": "tunix", "build_s": build_s, "train_s": end - t0, "step_s": steps,
            "steady_step_s": float(np.median(steps[1:])) if len(steps) > 1 else None,
            "peak_rss_mb": peak, "lora_rank": int(job.get("lora_rank", 0)), "trainable_params": n_trainable,
            "params": n_params, "base_unchanged": base_unchanged}


def main() -> None:
    """Reads the job file, writes the result file."""
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]  # our tunix.py shadows tunix
    sys.path.append(str(here))  # ... but tunix_side is needed (appended: after site-packages)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    Path(a.out).write_text(json.dumps(run(json.loads(Path(a.job).read_text()))))


if __name__ == "__main__":
    main()
