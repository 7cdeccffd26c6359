"""The device check's parts (`benchmarks.device_check`), each run as its own process:

    python -m jaxrl_mt.benchmarks.device_parts PART SHAPE OUT_JSON WORKDIR

A part writes its result to OUT_JSON as it goes (``"partial": true`` until it ends), so a part
killed at its time budget still leaves what it measured. `SHAPES` holds the sizes of the device
run (`full`) and of its CPU form (`tiny`).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

PARTS = ("device", "train", "accel", "parity", "lic")  # the default run, the most wanted first
OPTIONAL_PARTS = ("memory",)  # asked for by name (--parts): outside the 8-minute budget
EMBEDDED = "builtin:smollm2-135m-instruct"
# the scorer's per-token log-probs, device against CPU: bf16 rounding (~2^-8 relative per operand)
# through 30 layers, and fp32 where the device's matmuls may round their inputs (TF32 on NVIDIA)
LOGPROB_TOL = {"float32": 2e-2, "bfloat16": 2e-1}
PARITY_PROMPTS = ("What is 2 + 3?", "Name a prime number larger than 10.", "Write one sentence about the sea.",
                  "What is the capital of France?", "Count from 1 to 5.", "Say hello in Spanish.",
                  "What is 7 times 8?", "Give a synonym of 'quick'.")
Save = Callable[[dict[str, Any]], None]


@dataclasses.dataclass(frozen=True)
class CheckShape:
    """The sizes of one form of the check (`SHAPES`)."""

    dtype: str  # parameters and compute of accel and lic (the trainer keeps the preset's bf16)
    accel_shapes: tuple[str, ...]  # benchmarks.accel.SHAPES names
    accel_batches: tuple[int, ...]
    accel_prompt_len: int
    accel_new_tokens: int
    accel_repeats: int
    model: str  # the trainer's and the evaluation's model spec
    train_steps: int
    train_overrides: tuple[tuple[str, Any], ...]  # dotted configs/rlsta.py:paper_shapes fields
    lic_conversations: int  # FULL + SHARDED, half each
    lic_max_new_tokens: int
    parity_model: str  # the parity part's model spec
    parity_new_tokens: int
    memory_model: str  # the optional memory part: a models.synthetic.ARCHITECTURES name
    memory_lengths: tuple[int, int]  # its (prompt, new tokens)
    budgets: dict[str, float]  # seconds per part


SHAPES: dict[str, CheckShape] = {
    # one H100 in under 8 minutes (each part's budget includes its process's start and compiles)
    "full": CheckShape(dtype="bfloat16", accel_shapes=("qwen2.5-0.5b", "qwen2.5-1.5b"), accel_batches=(1, 64),
                       accel_prompt_len=128, accel_new_tokens=128, accel_repeats=2, model="random:qwen2.5-1.5b",
                       train_steps=3, train_overrides=(), lic_conversations=32, lic_max_new_tokens=256,
                       parity_model=EMBEDDED, parity_new_tokens=32, memory_model="qwen2.5-1.5b",
                       memory_lengths=(8192, 1024),
                       budgets={"device": 15, "train": 210, "accel": 120, "parity": 55, "lic": 55, "memory": 240}),
    # the CPU form, a test of the suite: the smallest sizes that still run every phase (one MT-Add problem, its
    # history's replies one token each; step 1 compiles, step 2 is warm; one accel batch; parity on random:tiny):
    # under a minute on 2 cores, most of it the processes' imports and XLA's compiles. The trainer's rollout
    # and update programs are those of tests/rl/test_paper_shapes.py's run, which the suite's compilation
    # cache then shares
    "tiny": CheckShape(dtype="float32", accel_shapes=("tiny",), accel_batches=(2,), accel_prompt_len=8,
                       accel_new_tokens=4, accel_repeats=1, model="random:tiny", train_steps=2,
                       train_overrides=(("data.limit", 1), ("data.refine_source", ""), ("history.max_new_tokens", 1),
                                        ("rl.batch_size", 1), ("rl.grad_accum", 1), ("rl.max_new_tokens", 8)),
                       lic_conversations=8, lic_max_new_tokens=4, parity_model="random:tiny", parity_new_tokens=4,
                       memory_model="tiny", memory_lengths=(64, 16),
                       budgets={"device": 60, "train": 300, "accel": 180, "parity": 300, "lic": 300, "memory": 300}),
}


def load_preset(path: str, preset: str) -> Any:
    """`get_config(preset)` of a config file (configs/ is not part of the package: read from the checkout,
    relative to the working directory, else to the package's parent folder: an editable install)."""
    import jaxrl_mt
    from jaxrl_mt.runtime import load_config_file

    found = next((p for p in (Path.cwd() / path, Path(jaxrl_mt.__file__).resolve().parents[1] / path)
                  if p.is_file()), Path(path))
    return load_config_file(found, preset)


def part_device(spec: CheckShape, workdir: Path, save: Save) -> dict[str, Any]:
    """The devices JAX sees, the first one's memory and its dense bf16 peak."""
    import jax

    from jaxrl_mt.models.flops import lookup_peak

    dev = jax.devices()[0]
    stats = dev.memory_stats() if dev.platform != "cpu" else None
    peak = lookup_peak(dev.device_kind)
    return {"device_kind": dev.device_kind, "platform": dev.platform, "device_count": jax.device_count(),
            "jax_version": jax.__version__, "memory_bytes_limit": (stats or {}).get("bytes_limit"),
            "peak_bf16_tflops": None if peak is None else peak.bf16_tflops,
            "peak_hbm_gb_s": None if peak is None else peak.hbm_gb_s}


def part_accel(spec: CheckShape, workdir: Path, save: Save) -> dict[str, Any]:
    """`benchmarks accel` shape by shape, batch by batch (saved after each row)."""
    import gc

    import jax

    from jaxrl_mt.benchmarks import roofline as rf
    from jaxrl_mt.benchmarks.accel import SHAPES as ACCEL_SHAPES
    from jaxrl_mt.benchmarks.accel import ShapeBench, run_shape

    peak = rf.lookup_peak(jax.devices()[0].device_kind)
    out: dict[str, Any] = {"dtype": spec.dtype, "prompt_len": spec.accel_prompt_len,
                           "new_tokens": spec.accel_new_tokens, "remat": True, "shapes": []}
    for name in spec.accel_shapes:
        bench = ShapeBench(ACCEL_SHAPES[name], dtype=spec.dtype, prompt_len=spec.accel_prompt_len,
                           new_tokens=spec.accel_new_tokens, repeats=spec.accel_repeats, remat=True, peak=peak)
        entry = {"name": name, "params": bench.n_params, "rows": []}
        out["shapes"].append(entry)
        for b in spec.accel_batches:
            entry["rows"] += run_shape(bench, [b])
            save({**out, "partial": True})
        del bench
        gc.collect()
    return out


def _train_config(spec: CheckShape, workdir: Path) -> Any:
    c = load_preset("configs/rlsta.py", "paper_shapes")
    c.workdir = str(workdir / "train_run")
    c.model = spec.model
    c.rl.steps = spec.train_steps
    c.export = False  # timing, not weights: no export, no checkpoint (below)
    for key, value in spec.train_overrides:
        section, _, name = key.rpartition(".")
        setattr(c[section] if section else c, name, value)
    return c


def part_train(spec: CheckShape, workdir: Path, save: Save) -> dict[str, Any]:
    """`spec.train_steps` steps of the trainer with the paper_shapes preset: each step's perf/* metrics
    (saved after every step, so a part stopped at its budget keeps the steps it finished)."""
    from jaxrl_mt.rl.loop import Trainer

    c = _train_config(spec, workdir)
    out: dict[str, Any] = {"model": spec.model, "preset": "configs/rlsta.py:paper_shapes",
                           "overrides": dict(spec.train_overrides), "steps": []}
    t0 = time.perf_counter()

    class _Timed(Trainer):  # the step is what is timed: no checkpoint of the weights; each step's metrics kept
        def _checkpoint_hook(self, info: Any) -> None:
            return None

        def _log_hook(self, info: Any) -> None:
            super()._log_hook(info)
            m = info.metrics
            out["steps"].append({"step": info.state.step, **{k: float(v) for k, v in m.items() if k.startswith(
                ("perf/", "completion/")) or k == "train/loss"}})
            out["run_s"] = time.perf_counter() - t0 - out["setup_s"]
            save({**out, "steady": _steady(out["steps"]), "partial": True})

    try:
        trainer = _Timed(c)
        out["setup_s"] = time.perf_counter() - t0
        save({**out, "partial": True})
        trainer.run()
    finally:
        shutil.rmtree(c.workdir, ignore_errors=True)
    return {**out, "steady": _steady(out["steps"])}


def _steady(steps: list[dict[str, Any]]) -> dict[str, float]:
    """Means over the steps after the first (which compiles); the rollout's share of the step."""
    warm = steps[1:] or steps
    keys = sorted({k for s in warm for k in s if k.startswith("perf/")})
    out = {k: float(np.mean([s[k] for s in warm if k in s])) for k in keys}
    if out.get("perf/step_s"):
        out["rollout_share"] = out.get("perf/rollout_s", 0.0) / out["perf/step_s"]
    return out


def _lic_config(spec: CheckShape, workdir: Path) -> Any:
    half = spec.lic_conversations // 2
    c = load_preset("configs/eval_lic.py", "cpu")
    c.model, c.dtype, c.task = spec.model, spec.dtype, "math"
    c.datasets.math = f"synthetic:{half}:0"
    c.limit, c.runs, c.scenarios = half, 1, ("full", "sharded")
    c.temperature, c.max_new_tokens, c.max_batch = 0.0, spec.lic_max_new_tokens, spec.lic_conversations
    c.workdir, c.plots, c.bootstrap = str(workdir / "lic_run"), False, 100
    return c


def part_lic(spec: CheckShape, workdir: Path, save: Save) -> dict[str, Any]:
    """A greedy LiC evaluation of `spec.model`, FULL + SHARDED: conversations/s and new tokens/s."""
    from jaxrl_mt.evaluate import evaluate

    c = _lic_config(spec, workdir)
    try:
        r = evaluate(c, log=lambda s: print(s, file=sys.stderr, flush=True))
    finally:
        shutil.rmtree(c.workdir, ignore_errors=True)
    stats = r["report"].get("this_invocation", {})
    seconds, tokens = float(r["seconds"]), int(stats.get("new_tokens", 0))
    return {"model": spec.model, "dtype": spec.dtype, "scenarios": ["full", "sharded"],
            "conversations": r["n_generated"], "planned": r["n_planned"], "seconds": seconds,
            "new_tokens": tokens, "conversations_per_s": r["n_generated"] / max(seconds, 1e-9),
            "tokens_per_s": tokens / max(seconds, 1e-9), "max_new_tokens": spec.lic_max_new_tokens,
            "decode": stats.get("decode", {})}


def _greedy_and_scores(model: Any, params: Any, prompts: list[list[int]], new_tokens: int,
                       completions: list[list[int]] | None = None) -> tuple[list[list[int]], list[np.ndarray]]:
    """Greedy tokens of `prompts` under `params` (on their device) and the scorer's log-probs of
    `completions` (default: those tokens)."""
    from jaxrl_mt.sampling import Sampler, SamplingConfig
    from jaxrl_mt.scoring import Scorer

    sampler = Sampler(params, model.cfg, model.tokenizer, eos_ids=(), pad_id=model.pad_id)
    res = sampler.generate_ids(prompts, SamplingConfig(max_new_tokens=new_tokens, temperature=0.0),
                               stop_ids=[[] for _ in prompts])
    tokens = [list(map(int, t)) for t in res.tokens]
    scored = Scorer(params, model.cfg, pad_id=model.pad_id, batch_size=len(prompts)).score(
        prompts, tokens if completions is None else completions)
    return tokens, [np.asarray(x, np.float64) for x in scored.logprobs]


def part_parity(spec: CheckShape, workdir: Path, save: Save) -> dict[str, Any]:
    """The embedded model on the default device against JAX's CPU backend, fp32 and bf16."""
    import jax

    from jaxrl_mt.chat import encode_prompt
    from jaxrl_mt.models.registry import load_model

    cpu, dev = jax.devices("cpu")[0], jax.devices()[0]
    out: dict[str, Any] = {"model": spec.parity_model, "device": dev.device_kind, "reference": cpu.device_kind,
                           "prompts": len(PARITY_PROMPTS), "new_tokens": spec.parity_new_tokens, "dtypes": {}}
    for dtype in ("float32", "bfloat16"):
        model = load_model(spec.parity_model, param_dtype=dtype, dtype=dtype)
        prompts = [encode_prompt(model.tokenizer, [{"role": "user", "content": p}]) for p in PARITY_PROMPTS]
        dev_tok, dev_lp = _greedy_and_scores(model, model.params, prompts, spec.parity_new_tokens)
        with jax.default_device(cpu):
            # on a CPU-only host the params stay as made (not committed to the CPU): the same programs as
            # the device's, read from the persistent compilation cache instead of compiled again
            cpu_params = model.params if dev.platform == "cpu" else jax.device_put(model.params, cpu)
            cpu_tok, cpu_lp = _greedy_and_scores(model, cpu_params, prompts, spec.parity_new_tokens,
                                                 completions=dev_tok)  # the device's tokens, scored on the CPU
        same = [a == b for a, b in zip(dev_tok, cpu_tok)]
        first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None) for a, b in zip(dev_tok, cpu_tok)]
        diff = max(float(np.max(np.abs(a - b))) if len(a) else 0.0 for a, b in zip(dev_lp, cpu_lp))
        tol = LOGPROB_TOL[dtype]
        out["dtypes"][dtype] = {"tokens_equal": int(sum(same)), "all_tokens_equal": all(same),
                                "first_difference": first, "logprob_max_abs_diff": diff, "logprob_tol": tol,
                                "logprobs_within_tol": diff <= tol}
        save({**out, "partial": True})
        del model
    return out


def part_memory(spec: CheckShape, workdir: Path, save: Save) -> dict[str, Any]:
    """The whole RLSTA step's compiled memory (`benchmarks.step_memory`) by this backend's own compiler, one
    device, paper_shapes' sizes (docs/scaling.md has XLA:CPU's)."""
    from jaxrl_mt.benchmarks.step_memory import StepShape, measure

    p, c = spec.memory_lengths
    rec = measure(spec.memory_model, 1, StepShape(prompt_len=p, anchor_len=p, new_tokens=c),
                  log=lambda m: print(m, file=sys.stderr, flush=True))
    return {"record": rec}


PART_FNS: dict[str, Callable[[CheckShape, Path, Save], dict[str, Any]]] = {
    "device": part_device, "accel": part_accel, "train": part_train, "lic": part_lic, "parity": part_parity,
    "memory": part_memory}


def run(part: str, shape: str, out: Path, workdir: Path) -> int:
    """Runs one part, writing its result to `out` (partial results on the way); exit status."""
    from jaxrl_mt import runtime

    runtime.setup()  # JAX's persistent compilation cache: a rerun of the check starts warm

    def save(result: dict[str, Any]) -> None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, default=_jsonable), encoding="utf-8")
        tmp.replace(out)

    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    result = PART_FNS[part](SHAPES[shape], workdir, save)
    save({**result, "part_s": round(time.perf_counter() - t0, 2)})
    return 0


def _jsonable(x: Any) -> Any:
    if isinstance(x, (np.integer, np.floating, np.bool_)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])))
