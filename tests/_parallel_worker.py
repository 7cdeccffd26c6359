"""Subprocess side of tests/test_parallel.py and tests/test_multihost.py (not collected by pytest).

`python tests/_parallel_worker.py mesh OUT.json [train,infer]`: with 8 fake CPU devices, a GRPO train step, the
sampler (one call, and conversations keeping their caches across turns), the scorer and a
cached forward pass under meshes (8,1,1), (2,4,1), (2,2,2) against one
device; writes the measured differences.

`python tests/_parallel_worker.py multihost OUT.json CKPT_DIR [reference]`: one process of a
2-process run (JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID in the environment):
a few train steps on per-process rows of a global batch, an orbax save and a restore; writes
the losses, a parameter digest and the restore check, and the sampler's answers to per-process
rows on global meshes (tests/_multihost_sampling.py). With `reference` (one process, one
device) it runs the same steps and sampler calls on the whole batch, for comparison.

`python tests/_parallel_worker.py trainer OUT.json WORKDIR MODEL_DIR STEPS`: one process of a
2-process run of the full RLSTA `Trainer` (mesh 2,2,1; per-process data) to STEPS (resuming when
WORKDIR holds a checkpoint); writes the steps it ran, the items of its batches and a digest of
the final parameters.

The environment (XLA_FLAGS, JAX_PLATFORMS) must be set by the caller, before jax is imported.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxrl_mt import parallel  # noqa: E402
from jaxrl_mt.parallel import rules as parallel_rules  # noqa: E402
from jaxrl_mt.models.config import ModelConfig  # noqa: E402
from jaxrl_mt.models.decoder import forward, init_cache, init_params, positions_from_mask  # noqa: E402
from jaxrl_mt.rl.optim import make_optimizer  # noqa: E402
from jaxrl_mt.rl.example import TrainExample, assemble_example  # noqa: E402
from jaxrl_mt.rl.step import LossConfig, make_train_step  # noqa: E402

MESHES = ((8, 1, 1), (2, 4, 1), (2, 2, 2))
P_LEN, C_LEN, ROWS = 8, 8, 8


def tiny_cfg() -> ModelConfig:
    """A Qwen2-style model (q/k/v biases, untied head) whose dims divide every test mesh."""
    return ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=8, attention_bias=True, tie_word_embeddings=False,
                       architecture="qwen2", max_position_embeddings=128, eos_token_id=(1,), pad_token_id=0)


def make_batch(seed: int, rows: int = ROWS) -> dict[str, np.ndarray]:
    """A fixed-shape rollout batch with ragged prompts/completions, advantages, old and ref log-probs."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(2, 64, rng.integers(3, P_LEN + 1)).tolist() for _ in range(rows)]
    comps = [rng.integers(2, 64, rng.integers(2, C_LEN + 1)).tolist() for _ in range(rows)]
    b = assemble_example(prompts, comps, 0, P_LEN, C_LEN, group=1,
                         advantages=rng.normal(size=rows).astype(np.float32)).arrays()
    b["old_logp"] = (np.log(1 / 64) + 0.05 * rng.normal(size=(rows, C_LEN))).astype(np.float32)
    b["ref_logp"] = (np.log(1 / 64) + 0.05 * rng.normal(size=(rows, C_LEN))).astype(np.float32)
    return b


def dict_step(fn):
    """The train step on a dict of TrainExample fields (one prompt per row): this worker's batches are dicts."""
    return lambda params, opt_state, b: fn(params, opt_state, TrainExample(**b))


def max_tree_diff(a, b) -> float:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) for x, y in zip(la, lb))


def sharding_mismatches(tree, want) -> list[str]:
    """Leaves of `tree` whose sharding is not equivalent to the one in `want` (same structure)."""
    bad = []
    for (kp, x), w in zip(jax.tree_util.tree_flatten_with_path(tree)[0], jax.tree_util.tree_leaves(want)):
        if not x.sharding.is_equivalent_to(w, x.ndim):
            bad.append(f"{parallel_rules._path(kp)}: {x.sharding.spec} != {w.spec}")
    return bad


def opt_state_follows_params(opt_state, params) -> tuple[int, list[str]]:
    """Counts optimizer-state moments sharded like their parameter; lists the mismatches."""
    pleaves = {parallel_rules._path(kp): x for kp, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    checked, bad = 0, []
    for kp, x in jax.tree_util.tree_flatten_with_path(opt_state)[0]:
        if x.ndim == 0:
            continue  # step counters
        path = parallel_rules._path(kp)
        owner = [p for p in pleaves if path.endswith("/" + p)]
        if len(owner) != 1:
            bad.append(f"{path}: no parameter")
            continue
        checked += 1
        if not x.sharding.is_equivalent_to(pleaves[owner[0]].sharding, x.ndim):
            bad.append(f"{path}: {x.sharding.spec} != {pleaves[owner[0]].sharding.spec}")
    return checked, bad


# ----------------------------------------------------------------------------- mesh parity


def run_mesh(out: Path, parts: set[str]) -> None:
    """Writes {"ref_losses", "meshes": {shape: measurements}}; parts: "train" and/or "infer"."""
    from jaxrl_mt.sampling import Sampler, SamplingConfig
    from jaxrl_mt.sampling.slots import empty_slots, state_shardings
    from jaxrl_mt.scoring import Scorer

    assert jax.device_count() == 8, jax.devices()
    cfg = tiny_cfg()
    params0 = init_params(cfg, jax.random.PRNGKey(0), scale=0.3)
    lc = LossConfig(beta=0.04, chunk=4)
    # AdamW as the trainer builds it. lr 1e-4 (100x the presets' 1e-6): Adam turns float32 noise
    # on near-zero gradients into update noise of up to lr * relative noise; see docs/scaling.md.
    opt = make_optimizer(1e-4, max_grad_norm=1.0, weight_decay=0.01)
    step = dict_step(make_train_step(cfg, opt, lc))
    batches = [make_batch(1), make_batch(2)]

    def train(params, opt_state, mesh, fn=step):
        losses, gnorms = [], []
        for b in batches:
            arrays = parallel.shard_batch(mesh, list(b.values())) if mesh is not None else list(b.values())
            params, opt_state, m = fn(params, opt_state, dict(zip(b, arrays)))
            losses.append(float(m["loss"]))
            gnorms.append(float(m["grad_norm"]))
        return params, opt_state, losses, gnorms

    ref_params, _, ref_losses, ref_gnorms = (train(params0, opt.init(params0), None) if "train" in parts
                                             else (None, None, [], []))
    dev = jax.devices()[0]
    one = jax.device_put(params0, dev)

    rng = np.random.default_rng(3)
    prompts = [rng.integers(2, 64, n).tolist() for n in (5, 9, 3, 12, 7, 4, 10, 6)]
    sc = SamplingConfig(max_new_tokens=10, temperature=0.0)
    ctx = [p[:-2] for p in prompts]
    comp = [p[-2:] + [5, 6, 7] for p in prompts]
    if "infer" in parts:
        ref_gen = Sampler(one, cfg, eos_ids=(1,), pad_id=0).generate_ids(prompts, sc)
        ref_grouped = Sampler(one, cfg, eos_ids=(1,), pad_id=0).generate_ids(
            [p for p in prompts[:3] for _ in range(4)], sc)
        ref_score = Scorer(one, cfg, pad_id=0, batch_size=8).score(ctx, comp)

    # prefill + 3 decode steps through a KV cache, unsharded
    tokens = np.asarray([p[:3] for p in prompts], np.int32)  # [8, 3]
    tmask = np.ones_like(tokens, bool)

    fwd = jax.jit(forward, static_argnames=("cfg", "logits"))

    def cached(params, cache):
        pos = positions_from_mask(jnp.asarray(tmask))
        logits, _, cache = fwd(params, cfg, tokens, pos, tmask, cache, logits="all")
        outs = [logits]
        for t in range(3):
            nxt = jnp.argmax(logits[:, -1], -1).astype(jnp.int32)[:, None]
            logits, _, cache = fwd(params, cfg, nxt, jnp.full((8, 1), 3 + t, jnp.int32), jnp.ones((8, 1), bool),
                                   cache, logits="all")
            outs.append(logits)
        return outs, cache

    ref_cached = cached(one, init_cache(cfg, 8, 8))[0] if "infer" in parts else None

    def session_turns(sampler):
        """Three turns of 8 conversations on the slot engine (`Sampler.run_turns`: each one's KV cache
        kept in its slot across turns; conversation 2 ends after its first turn); the replies' tokens."""
        from jaxrl_mt.sampling.turns import Feed

        got: dict[tuple[int, int], list[int]] = {}

        def advance(replies):
            out = []
            for r in replies:
                turn = sum(1 for c, _ in got if c == r.conv)
                got[r.conv, turn] = r.tokens
                if turn < 2 and not (r.conv == 2 and turn == 0):
                    out.append(Feed(r.conv, [r.tokens[-1]] + prompts[r.conv][:turn + 2], seed=10 * r.conv + turn + 1))
            return out

        first = [Feed(i, p, seed=10 * i, fresh=True) for i, p in enumerate(prompts)]
        sampler.run_turns(first, SamplingConfig(max_new_tokens=6, temperature=0.0), advance)
        return [[c, t, got[c, t]] for c, t in sorted(got)]
    ref_session = session_turns(Sampler(one, cfg, eos_ids=(1,), pad_id=0)) if "infer" in parts else None

    results = {"ref_losses": ref_losses, "meshes": {}}
    for shape in MESHES:
        mesh = parallel.make_mesh(shape)
        r = results["meshes"][",".join(map(str, shape))] = {}
        if "train" in parts:
            params, opt_state = parallel.shard_train_state(params0, opt.init(params0), mesh)
            r["n_sharded_params"] = sum(1 for x in jax.tree_util.tree_leaves(params)
                                        if not x.sharding.is_fully_replicated)
            r["n_sharded_opt_leaves"] = sum(1 for x in jax.tree_util.tree_leaves(opt_state)
                                            if not x.sharding.is_fully_replicated)
            init_bad = opt_state_follows_params(opt_state, params)[1]
            params, opt_state, losses, gnorms = train(params, opt_state, mesh)
            r["opt_leaves_checked"], bad = opt_state_follows_params(opt_state, params)
            r["opt_mismatch"] = init_bad + bad
            r["loss_diff"] = max(abs(a - b) for a, b in zip(losses, ref_losses))
            r["grad_norm_rel_diff"] = max(abs(a - b) / b for a, b in zip(gnorms, ref_gnorms))
            r["param_diff"] = max_tree_diff(params, ref_params)
            r["param_change"] = max_tree_diff(params, params0)
            if shape == MESHES[-1]:  # the pinned step keeps the rules exactly
                pp, po = parallel.shard_train_state(params0, opt.init(params0), mesh)
                fn = parallel.shard_train_step(step, mesh, pp, po)
                pp, po, pl, _ = train(pp, po, mesh, fn)
                r["param_rule_mismatch"] = sharding_mismatches(pp, parallel.param_shardings(params0, mesh))
                r["opt_rule_mismatch"] = sharding_mismatches(po, parallel.opt_state_shardings(po, mesh))
                r["pinned_vs_raw_param_diff"] = max_tree_diff(pp, params)
                r["pinned_loss_diff"] = max(abs(a - b) for a, b in zip(pl, losses))
        if "infer" in parts:
            sharded = parallel.shard_params(params0, mesh)
            on_mesh = Sampler(sharded, cfg, eos_ids=(1,), pad_id=0, mesh=mesh)
            gen = on_mesh.generate_ids(prompts, sc)
            slots = empty_slots(cfg, 8, 16, 8, 1, mesh)
            grouped = Sampler(sharded, cfg, eos_ids=(1,), pad_id=0, mesh=mesh).generate_ids(
                prompts[:3], sc, group_size=4)  # 3 prompts prefilled once, 12 rows (16 with padding)
            score = Scorer(sharded, cfg, pad_id=0, batch_size=8).score(ctx, comp)
            cache = parallel.shard_cache(init_cache(cfg, 8, 8), mesh)
            outs, cache_after = cached(sharded, cache)
            r.update({
                "greedy_equal": ref_gen.tokens == gen.tokens,
                "slot_widths": sorted({x[1] for x in on_mesh.compiled_shapes if x[0] == "segment"}),
                "slot_rule_mismatch": sharding_mismatches(slots, state_shardings(mesh, slots)),
                "slot_rows_split": not slots.tokens.sharding.is_fully_replicated,
                "greedy_tokens": sum(len(t) for t in gen.tokens),
                "grouped_equal": grouped.tokens == ref_grouped.tokens,
                "gen_logprob_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(gen.logprobs, ref_gen.logprobs)),
                "score_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(score.logprobs, ref_score.logprobs)),
                "pooled_diff": float(np.max(np.abs(score.pooled - ref_score.pooled))),
                "cache_specs": {f: str(getattr(cache, f).sharding.spec) for f in cache._fields},
                "cache_rule_mismatch": sharding_mismatches(cache, parallel.cache_shardings(mesh, cache)),
                "cache_k_after_equivalent": cache_after.k.sharding.is_equivalent_to(cache.k.sharding, 5),
                "cached_logit_diff": max_tree_diff(outs, ref_cached),
                "session_equal": session_turns(Sampler(sharded, cfg, eos_ids=(1,), pad_id=0, mesh=mesh)) == ref_session,
            })
    out.write_text(json.dumps(results, indent=1))


# ----------------------------------------------------------------------------- multi-host

STEPS, LOCAL_ROWS = 3, 4


def run_multihost(out: Path, ckpt_dir: Path, reference: bool) -> None:
    from jaxrl_mt.checkpointing import Checkpointer
    from tests._multihost_sampling import sampling_part

    if not reference:
        assert parallel.maybe_initialize_distributed(), "JAX_COORDINATOR_ADDRESS not set"
    nproc, pid = jax.process_count(), jax.process_index()
    cfg = tiny_cfg()
    params0 = init_params(cfg, jax.random.PRNGKey(0), scale=0.3)
    opt = make_optimizer(1e-3, max_grad_norm=1.0)
    mesh = parallel.make_mesh((-1, 1, 1) if reference else (2, 2, 1))
    params, opt_state = parallel.shard_train_state(params0, opt.init(params0), mesh)
    step = parallel.shard_train_step(dict_step(make_train_step(cfg, opt, LossConfig(beta=0.04, chunk=4))), mesh,
                                     params, opt_state)
    losses = []
    for s in range(STEPS):
        full = make_batch(10 + s, rows=LOCAL_ROWS * 2)  # the global batch; each process feeds its rows
        rows = slice(None) if reference else slice(pid * LOCAL_ROWS, (pid + 1) * LOCAL_ROWS)
        arrays = parallel.global_batch(mesh, [v[rows] for v in full.values()])
        assert arrays[0].shape[0] == LOCAL_ROWS * 2, arrays[0].shape
        for a, v in zip(arrays, full.values()):  # each process gets exactly its own rows back
            np.testing.assert_array_equal(parallel.local_rows(a), v[rows])
        params, opt_state, m = step(params, opt_state, dict(zip(full, arrays)))
        losses.append(float(m["loss"]))  # a replicated scalar: readable on every process
    ck = Checkpointer(ckpt_dir, max_to_keep=2)
    ck.save(STEPS, {"params": params, "opt_state": opt_state}, {"step": STEPS, "losses": losses}, force=True)
    ck.wait()
    # restore into freshly initialised, sharded targets
    tp, to = parallel.shard_train_state(init_params(cfg, jax.random.PRNGKey(1), scale=0.3), opt.init(params0), mesh)
    state, extra = ck.restore(target={"params": tp, "opt_state": to})
    ck.close()

    def local_max_diff(a, b) -> float:  # compares the shards this process holds
        d = 0.0
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
            assert x.sharding.is_equivalent_to(y.sharding, x.ndim), (x.sharding, y.sharding)
            for sx, sy in zip(x.addressable_shards, y.addressable_shards):
                d = max(d, float(np.max(np.abs(np.asarray(sx.data, np.float64) - np.asarray(sy.data, np.float64)))))
        return d

    restore_diff = max(local_max_diff(state["params"], params), local_max_diff(state["opt_state"], opt_state))
    # one more step from the restored state equals one more step from the live state
    nxt = make_batch(99, rows=LOCAL_ROWS * 2)
    rows = slice(None) if reference else slice(pid * LOCAL_ROWS, (pid + 1) * LOCAL_ROWS)
    arrays = dict(zip(nxt, parallel.global_batch(mesh, [v[rows] for v in nxt.values()])))
    _, _, m_live = step(params, opt_state, arrays)
    _, _, m_rest = step(state["params"], state["opt_state"], arrays)
    gathered = jax.experimental.multihost_utils.process_allgather(params, tiled=True) if not reference else params
    digest = {parallel_rules._path(kp): float(np.sum(np.asarray(x, np.float64) ** 2))
              for kp, x in jax.tree_util.tree_flatten_with_path(gathered)[0]}
    out.write_text(json.dumps({
        "process": pid, "processes": nproc, "devices": jax.device_count(), "local_devices": jax.local_device_count(),
        "losses": losses, "extra": extra, "restore_diff": restore_diff,
        "next_loss_live": float(m_live["loss"]), "next_loss_restored": float(m_rest["loss"]),
        "digest": digest, "steps_on_disk": Checkpointer(ckpt_dir, read_only=True).all_steps(),
        "helpers": {} if reference else per_process_helpers(cfg, params0, mesh),
        "sampling": sampling_part(cfg, params0, reference),
    }))
    if not reference:
        jax.distributed.shutdown()


def per_process_helpers(cfg: ModelConfig, params0, mesh) -> dict:
    """The per-process-row helpers of jaxrl_mt.parallel, the scorer and the sampler
    under 2 processes; each process feeds a different number of rows."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jaxrl_mt.sampling import Sampler, SamplingConfig
    from jaxrl_mt.scoring import Scorer

    pid = jax.process_index()
    r: dict = {
        "agree_max": parallel.agree_max(5 * pid + 3),
        "agree_max_many": list(parallel.agree_max_many([pid, 10 - pid])),
        "allgather_json": parallel.allgather_json({"p": pid, "s": "x" * (3 + pid)}),
        "broadcast_json": parallel.broadcast_json(f"from {pid}"),
        "mean": parallel.mean_over_processes({"a": float(pid), "m": 10.0 * pid}, weight=pid + 1, max_keys=("m",)),
        "mean_weight0_nan": parallel.mean_over_processes({"a": float("nan") if pid else 4.0}, weight=0 if pid else 1),
        "process_block": [list(parallel.process_block(n)) for n in (5, 1, 0)],
        "rows_multiple": parallel.rows_multiple(mesh),
        "spans": [parallel.spans_processes(mesh), parallel.spans_processes(parallel.local_mesh(mesh))],
    }
    try:
        parallel.check_same_rows(pid + 1, "toy batch")
        r["check_same_rows"] = "no error"
    except ValueError as e:
        r["check_same_rows"] = str(e)
    try:
        parallel.mean_over_processes({"a": 1.0} if pid else {"b": 1.0})
        r["mean_keys_mismatch"] = "no error"
    except ValueError as e:
        r["mean_keys_mismatch"] = str(e)
    mine = np.arange(3 * 2, dtype=np.float32).reshape(3, 2) + 100 * pid  # [3, 2] this process's rows
    (g,) = parallel.put_rows(mesh, [mine])
    r["put_rows_global_shape"] = list(g.shape)
    back = parallel.fetch_rows({"x": g, "y": jax.jit(lambda x: 2 * x, out_shardings=NamedSharding(mesh, P()))(g)})
    r["fetch_rows_exact"] = bool(np.array_equal(back["x"][:3], mine) and np.array_equal(back["x"][3], mine[2]))
    r["fetch_rows_replicated_exact"] = bool(np.array_equal(back["y"][:3], 2 * mine))
    try:
        parallel.put_rows(mesh, [mine], pad=False)
        r["put_rows_nopad"] = "no error"
    except ValueError as e:
        r["put_rows_nopad"] = str(e)
    host = parallel.gather_to_host(parallel.shard_params(params0, mesh))
    r["gather_exact"] = max_tree_diff(host, params0) == 0.0
    local = parallel.local_copy(parallel.shard_params(params0, mesh), mesh)
    r["local_copy_addressable"] = all(x.is_fully_addressable for x in jax.tree_util.tree_leaves(local))

    # scorer: process 0 scores 3 pairs, process 1 five (2 batches of 4 vs 1: an all-padding batch)
    rng = np.random.default_rng(7 + pid)
    n = 3 if pid == 0 else 5
    ctx = [rng.integers(2, 64, rng.integers(2, 9)).tolist() for _ in range(n)]
    comp = [rng.integers(2, 64, rng.integers(1, 6)).tolist() for _ in range(n)]
    sharded = parallel.shard_params(params0, mesh)
    got = Scorer(sharded, cfg, pad_id=0, batch_size=4, mesh=mesh).score(ctx, comp)
    want = Scorer(local, cfg, pad_id=0, batch_size=4).score(ctx, comp)
    r["score_rows"] = len(got.geo_mean)
    r["score_diff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(got.logprobs, want.logprobs))
    r["score_pooled_diff"] = float(np.max(np.abs(got.pooled - want.pooled)))
    empty = Scorer(sharded, cfg, pad_id=0, batch_size=4, mesh=mesh).score(ctx[:2] if pid else [],
                                                                          comp[:2] if pid else [])
    r["score_empty_rows"] = len(empty.geo_mean)

    # sampler (per-process rows): greedy, 2 prompts vs 3, vs a local sampler
    prompts = [rng.integers(2, 64, m).tolist() for m in ((5, 11) if pid == 0 else (3, 7, 20))]
    sc = SamplingConfig(max_new_tokens=6, temperature=0.0)
    g_res = Sampler(sharded, cfg, eos_ids=(1,), pad_id=0, mesh=mesh).generate_ids(prompts, sc)
    l_res = Sampler(local, cfg, eos_ids=(1,), pad_id=0, mesh=parallel.local_mesh(mesh)).generate_ids(prompts, sc)
    r["greedy_equal"] = g_res.tokens == l_res.tokens
    r["greedy_rows"] = len(g_res.tokens)
    r["greedy_logprob_diff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(g_res.logprobs, l_res.logprobs))
    return r


# ----------------------------------------------------------------------------- multi-host trainer


def run_trainer(out: Path, workdir: Path, model_dir: Path, steps: int) -> None:
    import hashlib

    from configs.rlsta import get_config
    from jaxrl_mt.rl import loop
    from jaxrl_mt.rl.loop import Trainer
    from jaxrl_mt.rl.objective import GRPOObjective

    assert parallel.maybe_initialize_distributed(), "JAX_COORDINATOR_ADDRESS not set"
    c = get_config("cpu")
    c.model, c.workdir, c.mesh_shape = str(model_dir), str(workdir), "2,2,1"
    c.data.add_source, c.data.refine_source = "synthetic:12:0", ""
    c.data.limit, c.data.heldout, c.data.max_turns = 0, 2, 4
    c.history.max_new_tokens = 6
    c.rl.steps, c.rl.batch_size, c.rl.group_size = steps, 2, 2
    c.rl.max_new_tokens, c.rl.beta, c.rl.lr, c.rl.remat = 8, 0.04, 1e-3, False
    c.eval.max_new_tokens = 6
    c.checkpoint.every = 1
    c.log.samples_every = 1
    c.export = True
    seen: dict = {"updates": 0, "batches": []}
    rollout, write_outputs = GRPOObjective.batch, loop.write_outputs

    def rollout_spy(self, policy, items, step):  # the objective's batch: the step's rollout
        seen["batches"].append([it.item_id for it in items])
        return rollout(self, policy, items, step)

    def outputs_spy(c, cfg, tok, params, evals, **kw):  # every process: a digest of the final global parameters
        host = parallel.gather_to_host(params)
        h = hashlib.sha256()
        for kp, x in jax.tree_util.tree_flatten_with_path(host)[0]:
            h.update(parallel_rules._path(kp).encode() + np.ascontiguousarray(x).tobytes())
        seen["digest"] = h.hexdigest()
        return write_outputs(c, cfg, tok, params, evals, **kw)

    GRPOObjective.batch, loop.write_outputs = rollout_spy, outputs_spy
    trainer = Trainer(c)
    summary = trainer.run()
    out.write_text(json.dumps({
        "process": jax.process_index(), "processes": jax.process_count(), "devices": jax.device_count(),
        "mesh": dict(trainer.mesh.shape), "batches": seen["batches"],
        "digest": seen["digest"], "summary_keys": sorted(summary),
    }))
    jax.distributed.shutdown()


if __name__ == "__main__":
    import jax.experimental.multihost_utils  # noqa: F401

    mode = sys.argv[1]
    if mode == "mesh":
        run_mesh(Path(sys.argv[2]), set(sys.argv[3].split(",")) if len(sys.argv) > 3 else {"train", "infer"})
    elif mode == "trainer":
        run_trainer(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5]))
    elif mode == "multihost":
        run_multihost(Path(sys.argv[2]), Path(sys.argv[3]), reference=len(sys.argv) > 4 and sys.argv[4] == "reference")
    else:
        raise SystemExit(f"unknown mode {mode!r}")
