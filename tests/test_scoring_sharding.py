"""The scorers' activations stay split over the rows on an FSDP mesh (`parallel.constrain_rows` in the decoder).

Without the pin, XLA's partitioner followed the parameters' fsdp-sharded hidden dimension and all-gathered
the hidden states over the rows, so every device ran every row (docs/scaling.md, the step's measured memory).
The jaxpr tests run here on this process's one device with abstract meshes; the compiled-HLO, memory and
parity test runs in a subprocess with 8 host devices (tests/_scoring_sharding_worker.py; about a minute of
CPU, so it is marked slow: `pytest tests/test_scoring_sharding.py -m slow`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import jax.extend.core as jex_core
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P

from jaxrl_mt import parallel
from jaxrl_mt.models.synthetic import ARCHITECTURES, synthetic_shapes
from jaxrl_mt.parallel import constrain_rows
from jaxrl_mt.scoring import score_grouped, token_logprobs

ROOT = Path(__file__).resolve().parents[1]
CFG = ARCHITECTURES["tiny"].replace(param_dtype="float32", dtype="float32")


def on(mesh: Any, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.ShapeDtypeStruct:
    """An abstract array placed (replicated) on `mesh`: its abstract value carries the mesh."""
    return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), sharding=NamedSharding(mesh, P()))


def constraints(jaxpr: Any) -> list[Any]:
    """The sharding of every sharding_constraint in a (closed) jaxpr, nested ones (scan bodies) included."""
    out = []
    for eqn in (jaxpr.jaxpr if isinstance(jaxpr, jex_core.ClosedJaxpr) else jaxpr).eqns:
        if eqn.primitive.name == "sharding_constraint":
            out.append(eqn.params["sharding"])
        for sub in jex_core.jaxprs_in_params(eqn.params):
            out += constraints(sub)
    return out


def test_constrain_rows_pins_rows_only_where_they_split_over_several_devices() -> None:
    mesh = AbstractMesh((2, 4, 1), parallel.AXES)
    got = constraints(jax.make_jaxpr(lambda x: constrain_rows(x) * 2)(on(mesh, (8, 5, 16))))
    assert len(got) == 1 and got[0].mesh == mesh
    assert got[0].spec == P(("data", "fsdp"), P.UNCONSTRAINED, P.UNCONSTRAINED)  # rows only; the rest is free
    for x in (on(mesh, (6, 5, 16)),  # 6 rows do not divide data x fsdp = 8: replicated, as shard_batch places them
              on(AbstractMesh((1, 1, 1), parallel.AXES), (8, 5, 16)),  # a one-device mesh
              on(AbstractMesh((1, 1, 8), parallel.AXES), (8, 5, 16)),  # tensor only: rows are not split
              jax.ShapeDtypeStruct((8, 5, 16), jnp.float32)):  # no mesh
        assert constraints(jax.make_jaxpr(lambda x: constrain_rows(x) * 2)(x)) == [], x
    concrete = jnp.ones((8, 3))
    assert constrain_rows(concrete) is concrete  # outside a trace: the identity


def scorer_jaxprs(mesh: Any) -> dict[str, Any]:
    """The jaxprs of the anchor scorer and of the flat scorer's forward with the parameters on `mesh`."""
    params = jax.tree_util.tree_map(lambda s: on(mesh, s.shape, s.dtype), synthetic_shapes(CFG))
    rows = lambda n, t, dt: on(mesh, (n, t), dt)  # noqa: E731
    grouped = jax.make_jaxpr(lambda p, *a: score_grouped(p, CFG, *a, chunk=16))(
        params, rows(8, 48, jnp.int32), rows(8, 48, bool), rows(32, 24, jnp.int32), rows(32, 24, bool))
    flat = jax.make_jaxpr(lambda p, t, m: token_logprobs(p, CFG, t, m, chunk=16)[0])(
        params, rows(16, 40, jnp.int32), rows(16, 40, bool))
    return {"grouped": grouped, "flat": flat}


def test_the_forward_pins_rows_on_an_fsdp_mesh_and_is_unchanged_on_one_device() -> None:
    fsdp = scorer_jaxprs(AbstractMesh((1, 8, 1), parallel.AXES))
    for name, jaxpr in fsdp.items():
        got = constraints(jaxpr)
        # two per layer input and output (the prompts' and the completions' in the grouped layout)
        assert len(got) >= 2, (name, got)
        assert all(s.spec[0] == ("data", "fsdp") for s in got), name
    for mesh in (AbstractMesh((1, 1, 1), parallel.AXES), None):  # one device: the program of before, bit for bit
        if mesh is None:
            jaxprs = {"flat": jax.make_jaxpr(lambda p, t, m: token_logprobs(p, CFG, t, m, chunk=16)[0])(
                synthetic_shapes(CFG), jnp.zeros((16, 40), jnp.int32), jnp.ones((16, 40), bool))}
        else:
            jaxprs = scorer_jaxprs(mesh)
        for name, jaxpr in jaxprs.items():
            assert constraints(jaxpr) == [], (mesh, name)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("scoring_sharding") / "report.json"
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8",
               PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "tests._scoring_sharding_worker", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_no_hidden_state_is_gathered_over_the_rows_and_temp_memory_divides(report: dict) -> None:
    for prog in ("anchor", "reference"):
        full_rows = {tuple(r) for r in report["rows"][prog]}  # (all rows, T) of the prompts and the completions
        gathers = report["fsdp8"][prog]["all_gathers"]
        assert gathers, prog  # the weights are gathered (FSDP), layer by layer
        rows_gathered = [(t, d) for t, d in gathers if t in ("f32", "bf16") and tuple(d[:2]) in full_rows]
        assert rows_gathered == [], (prog, rows_gathered)  # before: f32[8,48,64], f32[32,24,64], ...
        one, fsdp = report["one"][prog]["temp"], report["fsdp8"][prog]["temp"]
        # before the pin: 1.4x (anchor) and 1.5x (reference) less per device than one device; with it 5.0x, 6.6x
        assert fsdp * 4 <= one, (prog, one, fsdp)


@pytest.mark.slow
def test_scores_on_the_fsdp_mesh_equal_one_device(report: dict) -> None:
    mesh, none = report["scores"]["fsdp8"], report["scores"]["none"]
    assert set(mesh) == {"grouped", "flat", "reference_8x2", "reference_3x4"}
    for name in ("grouped", "flat"):  # 12 and 5 rows: padded to the mesh's 8 row shards by the Scorer
        for key in ("sum", "pooled", "logprobs"):
            a, b = np.asarray(mesh[name][key]), np.asarray(none[name][key])
            assert a.shape == b.shape and a.size, (name, key)
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=f"{name} {key}")
    for name in ("reference_8x2", "reference_3x4"):  # rows split over the mesh; rows that do not divide it
        a, b = np.asarray(mesh[name]), np.asarray(none[name])
        assert a.shape == b.shape and np.abs(b).max() > 1.0, name  # real log-probs, not zeros
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=name)
