"""Partition rules, multi-host settings, and one-device vs 8-device parity (in a subprocess with
8 fake CPU devices; this process keeps its single device).

The subprocess tests compile a GRPO step, the sampler and the scorer for three meshes (about a
minute of CPU each), so they are marked slow: `pytest tests/test_parallel.py -m slow`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from jax.sharding import AbstractMesh
from ml_collections import ConfigDict

from jaxrl_mt import parallel
from jaxrl_mt.parallel import rules as parallel_rules
from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import KVCache, param_shapes
from jaxrl_mt.rl.optim import make_optimizer

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("_parallel_worker.py")
TOL = 1e-5


def spec(*axes) -> tuple:
    """A spec as a tuple without trailing Nones (P(None, None) and P() mean the same)."""
    t = tuple(axes)
    while t and t[-1] is None:
        t = t[:-1]
    return t


def cfg_of(arch: str) -> ModelConfig:
    return ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=8, attention_bias=arch == "qwen2", qk_norm=arch == "qwen3",
                       tie_word_embeddings=arch == "llama", architecture=arch)


def specs_by_path(cfg: ModelConfig, mesh) -> dict[str, tuple]:
    flat = jax.tree_util.tree_flatten_with_path(param_shapes(cfg), is_leaf=lambda s: isinstance(s, tuple))[0]
    return {parallel_rules._path(kp): spec(*parallel.param_spec(parallel_rules._path(kp), shape, mesh))
            for kp, shape in flat}


# ----------------------------------------------------------------------------- rules (no devices needed)


def test_every_parameter_of_every_family_gets_its_rule() -> None:
    mesh = AbstractMesh((1, 2, 2), parallel.AXES)
    col, row = (None, "fsdp", "tensor"), (None, "tensor", "fsdp")
    want = {"embed": ("tensor", "fsdp"), "lm_head": ("fsdp", "tensor"), "final_norm": (),
            "layers/q": col, "layers/k": col, "layers/v": col, "layers/gate": col, "layers/up": col,
            "layers/o": row, "layers/down": row, "layers/attn_norm": (), "layers/mlp_norm": (),
            "layers/q_bias": (None, "tensor"), "layers/k_bias": (None, "tensor"), "layers/v_bias": (None, "tensor"),
            "layers/q_norm": (), "layers/k_norm": ()}
    seen = set()
    for arch in ("llama", "qwen2", "qwen3"):
        got = specs_by_path(cfg_of(arch), mesh)
        for path, s in got.items():
            assert s == want[path], (arch, path, s)
        seen |= set(got)
    assert seen == set(want)  # tied llama has no lm_head, qwen2 adds biases, qwen3 q/k norms


def test_axes_that_do_not_divide_are_dropped() -> None:
    mesh = AbstractMesh((1, 3, 2), parallel.AXES)
    got = specs_by_path(cfg_of("qwen2"), mesh)
    assert got["embed"] == ("tensor",)  # V=64 % 2 == 0, D=32 % 3 != 0
    assert got["layers/q"] == (None, None, "tensor")
    assert got["layers/down"] == (None, "tensor")  # [L, F, D]: F=64 over tensor, D=32 not over fsdp=3
    assert got["layers/k_bias"] == (None, "tensor")
    batch_only = AbstractMesh((8, 1, 1), parallel.AXES)
    assert specs_by_path(cfg_of("qwen2"), batch_only)["layers/q"] == (None, "fsdp", "tensor")  # size-1 axes kept


def test_optimizer_moments_resolve_to_their_parameter_rule() -> None:
    """AdamW (+ clipping, + MultiSteps accumulation) state paths carry the parameter path."""
    cfg = cfg_of("qwen2")
    mesh = AbstractMesh((2, 2, 2), parallel.AXES)
    shapes = param_shapes(cfg)
    abstract = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s, "float32"), shapes,
                                      is_leaf=lambda s: isinstance(s, tuple))
    pspecs = specs_by_path(cfg, mesh)
    state = jax.eval_shape(make_optimizer(1e-3, max_grad_norm=1.0, grad_accum_steps=2).init, abstract)
    n = 0
    for kp, x in jax.tree_util.tree_flatten_with_path(state)[0]:
        path = parallel_rules._path(kp)
        if x.ndim == 0:
            assert spec(*parallel.param_spec(path, x.shape, mesh)) == ()
            continue
        owner = [p for p in pspecs if path.endswith("/" + p)]
        assert len(owner) == 1, path
        assert spec(*parallel.param_spec(path, x.shape, mesh)) == pspecs[owner[0]], path
        n += 1
    assert n == 3 * len(pspecs)  # mu, nu and MultiSteps' accumulated gradient


def test_cache_rules_shard_rows_and_kv_heads() -> None:
    mesh = AbstractMesh((2, 2, 2), parallel.AXES)
    cache = KVCache(*(jax.ShapeDtypeStruct(s, d) for s, d in
                      (((2, 8, 2, 16, 8), "float32"), ((2, 8, 2, 16, 8), "float32"), ((8, 16), "bool"), ((), "int32"))))
    got = {f: spec(*parallel_rules._fit(parallel.CACHE_RULES[f], getattr(cache, f).shape, mesh)) for f in cache._fields}
    assert got == {"k": (None, ("data", "fsdp"), "tensor"), "v": (None, ("data", "fsdp"), "tensor"),
                   "valid": (("data", "fsdp"),), "index": ()}
    odd = AbstractMesh((1, 3, 2), parallel.AXES)  # 8 rows do not split 3 ways; 2 KV heads split 2 ways
    assert spec(*parallel_rules._fit(parallel.CACHE_RULES["k"], (2, 8, 2, 16, 8), odd)) == (None, None, "tensor")


def test_make_mesh_shapes_and_errors() -> None:
    m = parallel.make_mesh((-1, 1, 1))
    assert dict(m.shape) == {"data": 1, "fsdp": 1, "tensor": 1}
    with pytest.raises(ValueError, match=r"mesh shape \(2, 1, 1\) needs 2 devices, have 1"):
        parallel.make_mesh((2, 1, 1))
    with pytest.raises(ValueError, match="at most one -1"):
        parallel.make_mesh((-1, -1, 1))


def test_mesh_from_spec_and_row_shards() -> None:
    """The one reader of `mesh_shape` (training and evaluation): auto / none / D,F,T, clear errors."""
    auto = parallel.mesh_from_spec("auto")  # one device: a 1-device mesh, not None
    assert auto is not None and auto.shape == {"data": 1, "fsdp": 1, "tensor": 1}
    assert parallel.mesh_from_spec("none") is None
    m = parallel.mesh_from_spec("1,-1,1")
    assert dict(m.shape) == {"data": 1, "fsdp": 1, "tensor": 1} and parallel.row_shards(m) == 1
    assert parallel.row_shards(None) == 1
    assert parallel.row_shards(AbstractMesh((2, 4, 2), parallel.AXES)) == 8  # data x fsdp, not tensor
    for spec, msg in (("2,1,1", r"mesh_shape '2,1,1': mesh shape \(2, 1, 1\) needs 2 devices, have 1"),
                      ("8,1", "needs 3 entries"), ("a,b,c", "'auto', 'none' or 'data,fsdp,tensor'")):
        with pytest.raises(ValueError, match=msg):
            parallel.mesh_from_spec(spec)


# ----------------------------------------------------------------------------- multi-host settings


def test_distributed_settings_from_environment() -> None:
    assert parallel.distributed_settings(None, {}) is None
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
    assert parallel.distributed_settings(None, env) == {"coordinator_address": "10.0.0.1:1234", "num_processes": 4,
                                                        "process_id": 3}
    assert parallel.distributed_settings(None, {**env, "JAX_LOCAL_DEVICE_IDS": "0,1"})["local_device_ids"] == [0, 1]
    assert parallel.distributed_settings(None, {"JAXRL_MT_DISTRIBUTED": "1"}) == {}  # TPU pod / SLURM: auto-detect
    bad = [({**env, "JAX_PROCESS_ID": ""}, "JAX_PROCESS_ID is not set"),
           ({**env, "JAX_NUM_PROCESSES": "two"}, "JAX_NUM_PROCESSES must be an integer, got 'two'"),
           ({**env, "JAX_PROCESS_ID": "4"}, r"process_id 4 not in \[0, 4\)"),
           ({**env, "JAX_LOCAL_DEVICE_IDS": "0;1"}, "JAX_LOCAL_DEVICE_IDS must be comma-separated ints")]
    for e, msg in bad:
        with pytest.raises(ValueError, match=msg):
            parallel.distributed_settings(None, e)


def test_distributed_settings_from_config_take_precedence() -> None:
    c = ConfigDict({"distributed": {"enabled": "auto", "coordinator_address": "head:9999", "num_processes": 2,
                                    "process_id": 1}})
    env = {"JAX_COORDINATOR_ADDRESS": "other:1", "JAX_NUM_PROCESSES": "8", "JAX_PROCESS_ID": "0"}
    assert parallel.distributed_settings(c, env) == {"coordinator_address": "head:9999", "num_processes": 2,
                                                     "process_id": 1}
    off = ConfigDict({"distributed": {"enabled": "off", "coordinator_address": "", "num_processes": 0,
                                      "process_id": 0}})
    assert parallel.distributed_settings(off, env) is None
    on = ConfigDict({"distributed": {"enabled": "on", "coordinator_address": ""}})
    assert parallel.distributed_settings(on, {}) == {}
    half = ConfigDict({"distributed": {"coordinator_address": "head:1", "num_processes": 2, "process_id": None}})
    with pytest.raises(ValueError, match="config.distributed.process_id is not set"):
        parallel.distributed_settings(half, {})
    assert parallel.distributed_settings(ConfigDict({"rl": {"lr": 1.0}}), {}) is None  # configs without the section


def test_single_process_run_does_not_initialize(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAXRL_MT_DISTRIBUTED"):
        monkeypatch.delenv(k, raising=False)
    assert parallel.maybe_initialize_distributed(None) is False
    assert jax.process_count() == 1 and parallel.is_main_process()


def test_log0_prints_on_process_zero(capsys: pytest.CaptureFixture) -> None:
    parallel.log0("hello from 0")
    assert capsys.readouterr().out == "hello from 0\n"


# ----------------------------------------------------------------------------- per-process rows, one process
# (the two-process behaviour is tested in tests/test_multihost.py::test_per_process_row_helpers)


def test_process_helpers_are_identities_on_one_process() -> None:
    import numpy as np

    assert parallel.agree_max(7) == 7 and parallel.agree_max_many([3, 4]) == (3, 4)
    assert parallel.allgather_ints([3, 4]).tolist() == [[3, 4]]
    assert parallel.allgather_json({"a": [1]}) == [{"a": [1]}]
    assert parallel.broadcast_json({"a": 1}) == {"a": 1}
    assert parallel.process_block(5) == (0, 5) and parallel.process_block(0) == (0, 0)
    parallel.check_same_rows(3, "x")  # nothing to compare
    m = {"a": 1.5, "b": float("nan")}
    out = parallel.mean_over_processes(m, weight=0.0, max_keys=("a",))
    assert out is not m and out["a"] == 1.5 and np.isnan(out["b"])
    mesh = parallel.make_mesh((1, 1, 1))
    assert not parallel.spans_processes(mesh) and not parallel.spans_processes(None)
    assert parallel.rows_multiple(mesh) == 1
    assert list(parallel.local_mesh(mesh).devices.flat) == list(mesh.devices.flat)


def test_put_and_fetch_rows_on_one_process_are_shard_batch_and_device_get() -> None:
    import numpy as np

    mesh = parallel.make_mesh((1, 1, 1))
    rows = [np.arange(6, dtype=np.int32).reshape(3, 2), np.array([True, False, True])]
    got, want = parallel.put_rows(mesh, rows, pad=False), parallel.shard_batch(mesh, rows)
    for g, w, a in zip(got, want, rows):
        assert g.sharding == w.sharding and g.shape == a.shape  # no padding on one process
        np.testing.assert_array_equal(np.asarray(g), a)
    back = parallel.fetch_rows({"x": got[0], "s": jax.numpy.float32(2.5)})
    assert isinstance(back["x"], np.ndarray) and back["x"].tolist() == rows[0].tolist() and float(back["s"]) == 2.5
    tree = {"w": jax.numpy.ones((2, 3)), "b": np.zeros(2)}
    host = parallel.gather_to_host(tree)
    assert all(isinstance(x, np.ndarray) for x in host.values()) and host["w"].sum() == 6.0


# ----------------------------------------------------------------------------- 8 devices vs 1


def run_worker(tmp: Path, parts: str) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8",
               PYTHONPATH=str(ROOT))
    out = tmp / f"mesh_{parts}.json"
    r = subprocess.run([sys.executable, str(WORKER), "mesh", str(out), parts], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def mesh_train(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_worker(tmp_path_factory.mktemp("mesh"), "train")


@pytest.fixture(scope="module")
def mesh_infer(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_worker(tmp_path_factory.mktemp("mesh"), "infer")


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["8,1,1", "2,4,1", "2,2,2"])
def test_train_step_under_mesh_matches_one_device(mesh_train: dict, shape: str) -> None:
    r = mesh_train["meshes"][shape]
    assert r["loss_diff"] <= TOL, r
    assert r["grad_norm_rel_diff"] <= TOL, r
    assert r["param_diff"] <= TOL, r
    assert r["param_change"] > 10 * TOL  # the two AdamW steps moved the parameters
    assert r["opt_mismatch"] == [] and r["opt_leaves_checked"] == 30  # 15 params x (mu, nu)
    # (8,1,1) is pure data parallelism; fsdp/tensor split the matrices and their moments
    assert r["n_sharded_params"] == {"8,1,1": 0, "2,4,1": 9, "2,2,2": 12}[shape]
    assert r["n_sharded_opt_leaves"] == 2 * r["n_sharded_params"]


@pytest.mark.slow
def test_pinned_train_step_keeps_the_rules(mesh_train: dict) -> None:
    r = mesh_train["meshes"]["2,2,2"]
    assert r["param_rule_mismatch"] == [] and r["opt_rule_mismatch"] == []
    assert r["pinned_vs_raw_param_diff"] == 0.0 and r["pinned_loss_diff"] == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["8,1,1", "2,4,1", "2,2,2"])
def test_sampling_scoring_and_cache_under_mesh_match_one_device(mesh_infer: dict, shape: str) -> None:
    r = mesh_infer["meshes"][shape]
    assert r["greedy_equal"] and r["greedy_tokens"] > 40, r
    assert r["gen_logprob_diff"] <= TOL and r["score_diff"] <= TOL and r["pooled_diff"] <= TOL, r
    assert r["cached_logit_diff"] <= TOL, r
    assert r["session_equal"], r  # KV caches kept across turns in slots (Sampler.run_turns) under the mesh
    assert r["grouped_equal"], r  # each prompt prefilled once and its cache copied to its rows, under the mesh
    # the slot engine ran on the mesh: its slots split over data x fsdp (widths multiples of the split)
    split = {"8,1,1": 8, "2,4,1": 8, "2,2,2": 4}[shape]
    assert r["slot_widths"] and all(w % split == 0 for w in r["slot_widths"]), r
    assert r["slot_rule_mismatch"] == [] and r["slot_rows_split"], r
    assert r["cache_rule_mismatch"] == [] and r["cache_k_after_equivalent"], r
