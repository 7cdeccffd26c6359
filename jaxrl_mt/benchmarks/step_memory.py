"""Memory of the trainer's whole RLSTA step, compiled: `python -m jaxrl_mt.memory_table --measured --step`.

The step of ``configs/rlsta.py:paper_shapes`` (16 prompts, G = 8, 1,024 new tokens, bf16, one
prompt's group per micro-batch) runs five jitted programs, each compiled here for abstract
shapes only (``jax.ShapeDtypeStruct`` parameters and optimizer state: no weight is allocated,
so a 7B model compiles on a laptop), with the trainer's own functions and shardings:

* ``rollout_admit``: ``sampling.slots.admit_shared``, the slot engine's prefill of 8 prompts into
  the store of the W = 64 decode slots (``Sampler.from_model(max_batch=64, row_multiple=8)``);
* ``rollout_segment``: ``sampling.slots.segment``, up to 16 decode steps of the 64 slots;
* ``anchor``: ``scoring.score_grouped`` under the reference weights, the anchor reward's batch of
  16 rows (2 contexts x 8 completions; padded to the mesh's row shards as ``Scorer`` pads them);
* ``reference``: ``rl.step.completion_logprobs`` under the reference weights, the whole example
  (16 prompts, 128 completions) in one call, as ``rl.rollout.example_logprobs`` runs it;
* ``update``: ``rl.step.make_train_step`` (GRPO loss, backward, AdamW inside optax.MultiSteps,
  parameters and optimizer state donated) on one micro-batch (1 prompt, 8 completions).

For each, ``compile().memory_analysis()`` gives per device the argument, output, alias
(donated) and temp bytes; the program's peak is argument + output - alias + temp. The train
state lives through the whole step: the policy's parameters, the reference's copy and the
optimizer state (AdamW mu and nu, MultiSteps' accumulated gradient). The step's peak is the
largest, over programs, of the program's peak plus the resident state it does not take as an
argument (the rollout: reference + optimizer; the scorers: policy + optimizer; the update: the
reference). Not counted: the host's copies, XLA's fragmentation, the fused decode weights that
the CPU backend alone makes (``fuse_weights`` is off on accelerators).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

PROGRAMS = ("rollout_admit", "rollout_segment", "anchor", "reference", "update")
RESIDENT_OUTSIDE = {  # resident state a program does not take as an argument
    "rollout_admit": ("reference", "optimizer"), "rollout_segment": ("reference", "optimizer"),
    "anchor": ("policy", "optimizer"), "reference": ("policy", "optimizer"), "update": ("reference",)}
GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class StepShape:
    """The step's sizes: `configs/rlsta.py:paper_shapes` by default (checked in tests/benchmarks)."""

    batch_size: int = 16  # rl.batch_size: prompts per step
    group: int = 8  # rl.group_size, G
    new_tokens: int = 1024  # rl.max_new_tokens
    max_batch: int = 64  # rl.max_batch: the sampler's slots
    grad_accum: int = 16  # rl.grad_accum: one prompt's group per micro-batch
    prompt_len: int = 8192  # the prompt bucket (the published prompts reach 8k tokens)
    anchor_len: int = 8192  # the anchor context's bucket (merged user turns: about the prompt)
    beta: float = 1e-4  # rl.beta: > 0, so the reference pass runs
    loss_type: str = "dapo"
    segment_steps: int = 16  # DecodeEngine.segment_steps
    stop_width: int = 1  # E: the carried tokenizer's eos ids
    anchor_rows: int = 16  # the reference Scorer's batch_size: min(16, rows)


def _sds(shape: Sequence[int], dtype: Any, sharding: Any = None) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=sharding)


def _with(tree: Any, shardings: Any) -> Any:
    return jax.tree_util.tree_map(lambda x, s: _sds(x.shape, x.dtype, s), tree, shardings)


def _rows(mesh: Any, shape: Sequence[int], dtype: Any) -> jax.ShapeDtypeStruct:
    """Rows as ``parallel.shard_batch`` places them: split over (data, fsdp) when they divide, else replicated."""
    from jax.sharding import NamedSharding, PartitionSpec

    from jaxrl_mt.parallel import batch_sharding, row_shards

    split = shape[0] % row_shards(mesh) == 0
    return _sds(shape, dtype, batch_sharding(mesh, len(shape)) if split else NamedSharding(mesh, PartitionSpec()))


def device_bytes(tree: Any) -> int:
    """Bytes of one device's shard of every leaf (its sharding's shard shape)."""
    total = 0
    for x in jax.tree_util.tree_leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += math.prod(shape) * jnp.dtype(x.dtype).itemsize
    return int(total)


def train_state(cfg: Any, mesh: Any, s: StepShape) -> tuple[Any, Any, Any]:
    """Abstract (params, opt_state, optimizer) on `mesh` by the partition rules (the trainer's optimizer)."""
    from jaxrl_mt.models.synthetic import synthetic_shapes
    from jaxrl_mt.parallel import opt_state_shardings, param_shardings
    from jaxrl_mt.rl.optim import make_optimizer

    shapes = synthetic_shapes(cfg)
    params = _with(shapes, param_shardings(shapes, mesh))
    optimizer = make_optimizer(3e-7, max_grad_norm=1.0, grad_accum_steps=s.grad_accum)
    opt = jax.eval_shape(optimizer.init, shapes)
    return params, _with(opt, opt_state_shardings(opt, mesh)), optimizer


def _row_consts(n: int, e: int) -> Any:
    from jaxrl_mt.sampling.kernels import Rows
    from jaxrl_mt.sampling.methods import RowParams

    i32 = lambda *shape: np.zeros(shape, np.int32)  # noqa: E731
    rp = RowParams(np.ones(n, np.float32), i32(n), np.ones(n, np.float32))
    return Rows(i32(n), -np.ones((n, e), np.int32), np.full(n, 1, np.int32), rp,
                np.asarray(jax.random.split(jax.random.PRNGKey(0), n)), i32(n))


def rollout_programs(cfg: Any, params: Any, mesh: Any, s: StepShape) -> dict[str, tuple[Any, int]]:
    """The slot engine's two programs of the rollout, lowered, and the slot state's bytes per device."""
    from jaxrl_mt.sampling import SamplingConfig
    from jaxrl_mt.sampling.engine import DecodeEngine
    from jaxrl_mt.sampling.slots import admit_shared, empty_slots, segment, state_shardings

    g, rows = s.group, s.batch_size * s.group
    width = DecodeEngine(cfg, max_batch=s.max_batch, row_multiple=8, mesh=mesh).slot_width(rows, g)
    places = min(s.batch_size, 2 * -(-width // g))  # run_slots' stored prompts
    state = jax.eval_shape(lambda: empty_slots(cfg, width, s.new_tokens, s.new_tokens, s.stop_width,
                                               shared=(places, s.prompt_len)))
    state = _with(state, state_shardings(mesh, state))
    method = SamplingConfig(max_new_tokens=s.new_tokens, temperature=1.0).method()
    units = min(width // g, places)  # prompts of the first admission
    ub = 1 << (units - 1).bit_length()
    slots, stored = np.arange(width, dtype=np.int32), np.arange(ub, dtype=np.int32)
    tokens, mask = np.zeros((ub, s.prompt_len), np.int32), np.ones((ub, s.prompt_len), bool)
    source = np.repeat(np.arange(ub, dtype=np.int32), g)[:width]
    admit = admit_shared.lower(params, cfg, state, slots, stored, tokens, mask, _row_consts(width, s.stop_width),
                               source, method=method, mesh=mesh)
    tables = (np.arange(width, dtype=np.int32) // g, np.arange(width, dtype=np.int32) % g,
              np.arange(places * g, dtype=np.int32).reshape(places, g) % width)
    seg = segment.lower(params, cfg, state, np.int32(8), tables, method=method, steps=s.segment_steps, mesh=mesh)
    nbytes = device_bytes(state)
    return {"rollout_admit": (admit, nbytes), "rollout_segment": (seg, nbytes)}


def _example(mesh: Any, prompts: int, s: StepShape, *, loss: bool) -> Any:
    from jaxrl_mt.rl.example import TrainExample

    n, p, c = prompts * s.group, s.prompt_len, s.new_tokens
    extra = {}
    if loss:
        extra = dict(advantages=_rows(mesh, (n,), jnp.float32), ref_logp=_rows(mesh, (n, c), jnp.float32),
                     num_items=_rows(mesh, (n,), jnp.float32))
    else:
        extra = dict(advantages=_rows(mesh, (n,), jnp.float32))
    return TrainExample(prompt_tokens=_rows(mesh, (prompts, p), jnp.int32), prompt_mask=_rows(mesh, (prompts, p), bool),
                        completion_tokens=_rows(mesh, (n, c), jnp.int32),
                        completion_mask=_rows(mesh, (n, c), bool), group=s.group, **extra)


def scoring_programs(cfg: Any, params: Any, mesh: Any, s: StepShape) -> dict[str, Any]:
    """The anchor reward's grouped scorer batch and the reference pass over the whole example, lowered."""
    from jaxrl_mt.parallel import row_shards
    from jaxrl_mt.rl.step import completion_logprobs
    from jaxrl_mt.scoring import score_grouped

    m = row_shards(mesh)
    ctx = s.anchor_rows // s.group
    bp = -(-(1 << (ctx - 1).bit_length()) // m) * m  # Scorer._score_grouped's padded context rows
    anchor = score_grouped.lower(params, cfg, _rows(mesh, (bp, s.anchor_len), jnp.int32),
                                 _rows(mesh, (bp, s.anchor_len), bool),
                                 _rows(mesh, (bp * s.group, s.new_tokens), jnp.int32),
                                 _rows(mesh, (bp * s.group, s.new_tokens), bool), chunk=128)
    ref = completion_logprobs.lower(params, cfg, _example(mesh, s.batch_size, s, loss=False), temperature=1.0)
    return {"anchor": anchor, "reference": ref}


def update_program(cfg: Any, params: Any, opt: Any, optimizer: Any, mesh: Any, s: StepShape, remat: Any) -> Any:
    """The trainer's jitted train step on one micro-batch, lowered (params and optimizer state donated)."""
    from jaxrl_mt.rl.step import LossConfig, make_train_step

    lc = LossConfig(beta=s.beta, loss_type=s.loss_type, max_completion_length=s.new_tokens, remat=remat)
    step = make_train_step(cfg, optimizer, lc, mesh=mesh, state=(params, opt), donate=True)
    return step.lower(params, opt, _example(mesh, s.batch_size // s.grad_accum, s, loss=True))


def _analysis(lowered: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    ma = lowered.compile().memory_analysis()
    out = {k: int(getattr(ma, f"{k}_size_in_bytes")) for k in ("argument", "output", "alias", "temp")}
    out["peak"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
    out["compile_s"] = round(time.perf_counter() - t0, 1)
    return out


def model_config(name: str, dtype: str = "bfloat16") -> Any:
    """A published architecture (``models.synthetic.ARCHITECTURES``: Qwen2.5's vocabulary) in `dtype`."""
    from jaxrl_mt.models.synthetic import ARCHITECTURES

    return ARCHITECTURES[name].replace(param_dtype=dtype, dtype=dtype)


def planner_remat(cfg: Any, s: StepShape, resident: dict[str, int], capacity_gib: float) -> Any:
    """What ``rl.remat = "auto"`` picks (`rl.step.choose_remat`) for a micro-batch of the step on a device of
    `capacity_gib`: its budget is half the memory free once the two copies of the weights are placed."""
    from jaxrl_mt.rl.step import choose_remat

    free = int(capacity_gib * GIB) - resident["policy"] - resident["reference"]
    return choose_remat(cfg, s.batch_size // s.grad_accum, s.group, s.prompt_len, s.new_tokens, budget=free // 2)


def measure(name: str, devices: int, s: StepShape, *, remat: Any = "planner", capacity_gib: float = 80.0,
            programs: Sequence[str] = PROGRAMS, log: Any = lambda m: None) -> dict[str, Any]:
    """Every program of the step of model `name` on a (1, devices, 1) mesh (FSDP), compiled.

    `remat`: the update's (False, "dots", True), or "planner": the memory planner's choice on a device
    of `capacity_gib` (`planner_remat`). Returns one record: the resident state per device, each
    program's analysis and the step's peak.
    """
    from jaxrl_mt.parallel import make_mesh

    if jax.device_count() < devices:
        raise RuntimeError(f"{devices} devices wanted, {jax.device_count()} present (set XLA_FLAGS="
                           f"--xla_force_host_platform_device_count={devices} before jax starts)")
    cfg = model_config(name)
    mesh = make_mesh((1, devices, 1), jax.devices()[:devices])
    params, opt, optimizer = train_state(cfg, mesh, s)
    resident = {"policy": device_bytes(params), "reference": device_bytes(params), "optimizer": device_bytes(opt)}
    rule = f"planner at {capacity_gib:g} GiB" if remat == "planner" else "given"
    if remat == "planner":
        remat = planner_remat(cfg, s, resident, capacity_gib)
    lowered: dict[str, Any] = {}
    buffers = 0
    if {"rollout_admit", "rollout_segment"} & set(programs):
        ro = rollout_programs(cfg, params, mesh, s)
        lowered.update({k: v[0] for k, v in ro.items()})
        buffers = next(iter(ro.values()))[1]
    if {"anchor", "reference"} & set(programs):
        lowered.update(scoring_programs(cfg, params, mesh, s))
    if "update" in programs:
        lowered["update"] = update_program(cfg, params, opt, optimizer, mesh, s, remat)
    out: dict[str, Any] = {}
    for prog in programs:
        out[prog] = _analysis(lowered.pop(prog))
        out[prog]["step"] = out[prog]["peak"] + sum(resident[r] for r in RESIDENT_OUTSIDE[prog])
        log(f"{name} x{devices} {prog}: peak {out[prog]['peak'] / GIB:.2f} GiB, compiled in {out[prog]['compile_s']} s")
    step = max(out.values(), key=lambda r: r["step"])
    return {"model": name, "devices": devices, "remat": remat, "remat_rule": rule, "backend": jax.default_backend(),
            "attention": cfg.attention, "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "shape": dataclasses.asdict(s), "resident": resident,
            "rollout_buffers": buffers, "programs": out, "step_peak": step["step"],
            "step_peak_program": next(k for k, v in out.items() if v is step)}


def run_subprocess(name: str, devices: int, s: StepShape, remat: Any, programs: Sequence[str], *,
                   capacity_gib: float = 80.0, platform: str = "cpu", timeout: float = 3600) -> dict[str, Any]:
    """`measure` in a fresh process with `devices` host devices (XLA_FLAGS must precede jax's start) on
    `platform` (JAX_PLATFORMS; "" = the machine's default backend: its own compiler, its device count)."""
    env = {**os.environ, "JAX_PLATFORMS": platform,
           "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()}
    cmd = [sys.executable, "-m", "jaxrl_mt.benchmarks.step_memory", "--worker", name, str(devices),
           json.dumps(dataclasses.asdict(s)), json.dumps(remat), ",".join(programs), str(capacity_gib)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"{name} x{devices}: exit {r.returncode}: {r.stderr.strip()[-2000:]}")
    sys.stderr.write(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def _g(n: int) -> str:
    return f"{n / GIB:.2f}"


def format_step(records: Sequence[dict[str, Any]]) -> str:
    """Markdown: one row per (model, devices): resident state, each program's peak, the step's peak (GiB/device)."""
    progs = [p for p in PROGRAMS if records and p in records[0]["programs"]]
    cols = (["model", "devices", "micro-batch", "update remat", "policy", "reference", "AdamW + accum.",
             "slot state"]
            + [f"{p} (temp)" for p in progs] + ["step peak", "at"])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in records:
        res, pr = r["resident"], r["programs"]
        sh = r["shape"]
        cells = [r["model"], f"{r['devices']} ({'FSDP' if r['devices'] > 1 else 'one device'})",
                 f"{sh['batch_size'] // sh['grad_accum']} x {sh['group']}", _remat_name(r["remat"]),
                 _g(res["policy"]), _g(res["reference"]), _g(res["optimizer"]), _g(r["rollout_buffers"])]
        cells += [f"{_g(pr[p]['peak'])} ({_g(pr[p]['temp'])})" for p in progs]
        cells += [f"**{_g(r['step_peak'])}**", r["step_peak_program"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _remat_name(remat: Any) -> str:
    return {False: "none", True: "full", "dots": "dots"}.get(remat, str(remat))


def _remat(text: str) -> Any:
    return {"none": False, "false": False, "full": True, "true": True, "dots": "dots", "planner": "planner"}[
        text.lower()]


def main(argv: Sequence[str] | None = None) -> int:
    """`memory_table --measured --step`: every (model, devices) in a subprocess; prints the table."""
    ap = argparse.ArgumentParser(prog="python -m jaxrl_mt.memory_table --measured --step",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="qwen2.5-1.5b,qwen2.5-7b", help="models.synthetic.ARCHITECTURES names")
    ap.add_argument("--devices", default="1,8", help="FSDP widths: a (1, n, 1) mesh of n host devices each")
    ap.add_argument("--prompt-len", type=int, default=StepShape.prompt_len, help="prompt (and anchor) bucket")
    ap.add_argument("--remat", type=_remat, default="planner",
                    help="the update's remat: planner (rl.remat auto's choice) | none | dots | full")
    ap.add_argument("--capacity-gib", type=float, default=80.0, help="--remat planner: the device's memory")
    ap.add_argument("--platform", default="cpu", help="JAX_PLATFORMS of the compiles ('': the default backend)")
    ap.add_argument("--grad-accum", type=int, default=StepShape.grad_accum, help="micro-batches per step")
    ap.add_argument("--programs", default=",".join(PROGRAMS), help=f"subset of {','.join(PROGRAMS)}")
    ap.add_argument("--json", default=None, help="write the records here")
    ap.add_argument("--markdown", default=None, help="write the table here")
    a = ap.parse_args(argv)
    s = StepShape(prompt_len=a.prompt_len, anchor_len=a.prompt_len, grad_accum=a.grad_accum)
    programs = [p for p in a.programs.split(",") if p]
    records = []
    for name in a.models.split(","):
        for n in (int(x) for x in a.devices.split(",")):
            try:
                records.append(run_subprocess(name, n, s, a.remat, programs, capacity_gib=a.capacity_gib,
                                              platform=a.platform))
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(f"{name} x{n}: not measured: {e}", file=sys.stderr)
    text = format_step(records)
    print(text)
    for path, body in ((a.json, json.dumps(records, indent=1)), (a.markdown, text)):
        if path:
            with open(path, "w", encoding="utf-8") as f:
                f.write(body + "\n")
    return 0 if records else 1


def _worker(args: Sequence[str]) -> int:
    name, devices, shape, remat, programs, capacity = args
    s = StepShape(**json.loads(shape))
    rec = measure(name, int(devices), s, remat=json.loads(remat), capacity_gib=float(capacity),
                  programs=programs.split(","),
                  log=lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps(rec))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(_worker(sys.argv[2:]))
    sys.exit(main())
