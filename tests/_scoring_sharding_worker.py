"""Subprocess side of tests/test_scoring_sharding.py (not collected by pytest).

``python -m tests._scoring_sharding_worker OUT.json`` with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``
(set by the caller, before jax is imported): for ``random:tiny`` in float32 it compiles the anchor scorer
(`scoring.score_grouped`) and the reference pass (`rl.step.completion_logprobs`) on an FSDP mesh (1, 8, 1) and on
one device for the same global shapes, and writes, per program, the result shapes of the compiled HLO's
all-gathers and the per-device temp bytes; then the `Scorer`'s scores (grouped and flat, rows that do not
divide the mesh) and the reference log-probs on the mesh and without one.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mt.models.synthetic import ARCHITECTURES, init_synthetic
from jaxrl_mt.parallel import batch_sharding, make_mesh, param_shardings, shard_batch, shard_params
from jaxrl_mt.rl.example import TrainExample
from jaxrl_mt.rl.step import completion_logprobs
from jaxrl_mt.scoring import Scorer, score_grouped

P_LEN, C_LEN, G = 48, 24, 4  # distinct lengths: a hidden state's shape [rows, T, D] names its input
CONTEXTS, PROMPTS = 8, 16  # the anchor's contexts (one per device) and the reference pass's prompts
AG_RESULT = re.compile(r"=\s*(\w+)\[([\d,]*)\][^ ]*\s+all-gather\(")


def tiny_cfg() -> Any:
    """`random:tiny`'s architecture in float32 (exact enough for a 1e-5 parity)."""
    return ARCHITECTURES["tiny"].replace(param_dtype="float32", dtype="float32")


def _rows(mesh: Any, shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), sharding=batch_sharding(mesh, len(shape)))


def compiled(cfg: Any, mesh: Any) -> dict[str, Any]:
    """The two scorer programs on `mesh`, compiled for abstract inputs (the rows split over the mesh)."""
    shapes = jax.eval_shape(lambda: init_synthetic(cfg))
    params = jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes,
                                    param_shardings(shapes, mesh))
    n = PROMPTS * G
    anchor = score_grouped.lower(params, cfg, _rows(mesh, (CONTEXTS, P_LEN), jnp.int32),
                                 _rows(mesh, (CONTEXTS, P_LEN), bool), _rows(mesh, (CONTEXTS * G, C_LEN), jnp.int32),
                                 _rows(mesh, (CONTEXTS * G, C_LEN), bool), chunk=16)
    ex = TrainExample(prompt_tokens=_rows(mesh, (PROMPTS, P_LEN), jnp.int32),
                      prompt_mask=_rows(mesh, (PROMPTS, P_LEN), bool),
                      completion_tokens=_rows(mesh, (n, C_LEN), jnp.int32),
                      completion_mask=_rows(mesh, (n, C_LEN), bool), advantages=_rows(mesh, (n,), jnp.float32),
                      group=G)
    reference = completion_logprobs.lower(params, cfg, ex, temperature=1.0, chunk=16)
    return {"anchor": anchor.compile(), "reference": reference.compile()}


def analysis(program: Any) -> dict[str, Any]:
    """A compiled program's all-gather result shapes ([dtype, dims]) and per-device temp bytes."""
    gathers = sorted({(m.group(1), tuple(int(d) for d in m.group(2).split(",") if d))
                      for m in AG_RESULT.finditer(program.as_text())})
    return {"all_gathers": [[t, list(d)] for t, d in gathers],
            "temp": int(program.memory_analysis().temp_size_in_bytes)}


def pairs(rng: np.random.Generator, n_ctx: int, per_ctx: int) -> tuple[list[list[int]], list[list[int]]]:
    """n_ctx random contexts, each repeated per_ctx times (consecutive), with ragged random completions."""
    ctx, comp = [], []
    for _ in range(n_ctx):
        c = rng.integers(2, 500, rng.integers(5, P_LEN)).tolist()
        for _ in range(per_ctx):
            ctx.append(c)
            comp.append(rng.integers(2, 500, rng.integers(3, C_LEN)).tolist())
    return ctx, comp


def example_rows(rng: np.random.Generator, bp: int, g: int) -> list[np.ndarray]:
    """A rollout example's arrays: bp left-padded prompts, bp * g right-padded completions, advantages."""
    prompt_start = rng.integers(0, P_LEN - 4, (bp, 1))
    completion_len = rng.integers(1, C_LEN, (bp * g, 1))
    return [rng.integers(2, 500, (bp, P_LEN)).astype(np.int32), np.arange(P_LEN)[None] >= prompt_start,
            rng.integers(2, 500, (bp * g, C_LEN)).astype(np.int32), np.arange(C_LEN)[None] < completion_len,
            np.zeros(bp * g, np.float32)]


def scores(params: Any, cfg: Any, mesh: Any) -> dict[str, Any]:
    """The Scorer's scores (grouped: 3 contexts x G; flat: 5 distinct contexts) and reference log-probs
    (8 prompts x 2 completions, split over the mesh; 3 x 4, which does not divide it)."""
    rng = np.random.default_rng(0)
    scorer = Scorer(shard_params(params, mesh) if mesh is not None else params, cfg, batch_size=16, mesh=mesh)
    out: dict[str, Any] = {}
    for name, (ctx, comp) in (("grouped", pairs(rng, 3, G)), ("flat", pairs(rng, 5, 1))):
        r = scorer.score(ctx, comp)
        out[name] = {"sum": r.sum.tolist(), "pooled": r.pooled.tolist(),
                     "logprobs": np.concatenate(r.logprobs).tolist()}
    for bp, g in ((8, 2), (3, 4)):
        arrays = example_rows(rng, bp, g)
        placed = shard_batch(mesh, arrays) if mesh is not None else arrays
        ex = TrainExample(*placed, group=g)
        out[f"reference_{bp}x{g}"] = np.asarray(completion_logprobs(scorer.params, cfg, ex, chunk=16)).tolist()
    return out


def main(out: str) -> None:
    """Writes the report (see the module docstring)."""
    assert jax.device_count() == 8, jax.devices()
    cfg = tiny_cfg()
    fsdp, one = make_mesh((1, 8, 1)), make_mesh((1, 1, 1), jax.devices()[:1])
    report: dict[str, Any] = {"hidden_size": cfg.hidden_size,
                              "rows": {"anchor": [[CONTEXTS, P_LEN], [CONTEXTS * G, C_LEN]],
                                       "reference": [[PROMPTS, P_LEN], [PROMPTS * G, C_LEN]]}}
    for name, mesh in (("fsdp8", fsdp), ("one", one)):
        report[name] = {k: analysis(v) for k, v in compiled(cfg, mesh).items()}
    params = init_synthetic(cfg)
    report["scores"] = {"fsdp8": scores(params, cfg, fsdp), "none": scores(params, cfg, None)}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1])
