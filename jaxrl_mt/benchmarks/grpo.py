"""Wall time and peak memory of one GRPO step: our JAX stack against TRL's ``GRPOTrainer``.

    python -m jaxrl_mt.benchmarks grpo [--model SPEC] [--prompts 4] [--group 4] [--new-tokens 128]
        [--beta 1e-4] [--steps 3] [--threads N] [--remat auto|on|off] [--only ours|trl] [--json OUT]

Both sides run the same configuration: the same chat-formatted GSM8K questions (the shipped
sample), ``G`` generations per prompt, exactly ``--new-tokens`` new tokens per completion (no stop
ids on our side, ``min_new_tokens`` on TRL's), temperature 1, the KL coefficient ``beta`` (so both
do a reference forward), AdamW at lr 1e-6 with global-norm clipping at 1 and a constant schedule,
the "grpo" loss, one optimizer update per step (no gradient accumulation, ``num_iterations = 1``),
fp32. Gradient checkpointing: TRL's default (on) for TRL; ours chosen by `rl.step.choose_remat`
from an estimate of the step's activations against the free memory (``--remat on|off`` forces
both sides; ``--no-remat`` = ``--remat off``).

One step is tokenisation (the chat template, inside the timed step on both sides) -> generation
-> rewards -> advantages -> (reference log-probs) -> loss, backward and the optimizer update.
Ours: the trainer's own rollout (``jaxrl_mt.rl.rollout.rollout``: ``encode_prompt`` ->
``Sampler.generate_ids`` -> the registered ``rlsta`` reward, verifier (lenient) + 1 x anchor (the
reference model's log-probs of each completion under its anchor prompt, here the policy's own
prompt) -> ``group_advantages`` -> a ``TrainExample`` (each prompt once for its G completions)
with the KL term's reference log-probs reused from the reward's pass) -> the jitted
``make_train_step`` step, which donates the train state. Nothing of the step is rebuilt here.
TRL: ``GRPOTrainer`` with a reward function that calls the same verifier (it has no anchor reward).

Each side runs in its own subprocess, so peak RSS (``getrusage(RUSAGE_SELF).ru_maxrss``) is that
side's alone, and each is pinned to ``--threads`` CPUs (default: all), which sizes XLA's thread
pool and torch's ``set_num_threads`` alike. On a machine shared with other jobs, torch's OpenMP
threads spin at every barrier while another process holds a core, so fewer threads than cores can
be much faster there; the driver prints ``uptime`` before and after, and each step's process CPU
time (``time.process_time``) is reported beside its wall time, as the figure that other jobs on
the machine distort least. The first step includes XLA compilation (ours) or torch warm-up (TRL);
steady state is the mean of the later steps (``--steps 3``: two). Per-phase times come from our
own timers and, for TRL, from timers wrapped around ``GRPOTrainer._generate`` and
``_generate_and_score_completions``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from jaxrl_mt.benchmarks.grpo_common import LR, MAX_GRAD_NORM, PhaseRss, mean_later, peak_rss_mb, pin_cpus, summarize

SIDES = ("ours", "trl")
HEAD_CHUNK = 32  # time chunk of the loss's vocabulary projection: 16 x 32 x 49152 fp32 logits at a time


def load_prompts(n: int) -> list[dict[str, str]]:
    """The first `n` questions of the shipped GSM8K sample: ``{"question", "gold"}`` each."""
    from jaxrl_mt.data.loaders import DEFAULT_ASSETS, asset_path, gold_from_gsm8k_answer

    path = asset_path(DEFAULT_ASSETS["gsm8k"])
    rows = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            d = json.loads(line)
            try:
                rows.append({"question": d["question"], "gold": gold_from_gsm8k_answer(d["answer"])})
            except (KeyError, ValueError) as e:
                raise ValueError(f"{path}:{line_no}: bad GSM8K record ({e})") from None
            if len(rows) == n:
                return rows
    raise ValueError(f"{path}: only {len(rows)} questions, --prompts asked for {n}")


def lengthen_prompts(prompts: Sequence[dict[str, str]], model_path: str, tokens: int) -> list[dict[str, str]]:
    """Each prompt with earlier GSM8K questions put before it (a longer context, the question and gold
    unchanged) until its chat prompt has at least ``tokens`` tokens (a multi-turn history's length)."""
    from jaxrl_mt.chat import encode_prompt
    from jaxrl_mt.models.registry import load_tokenizer

    tok = load_tokenizer(model_path)
    pool = [p["question"] for p in load_prompts(64)]
    out = []
    for i, p in enumerate(prompts):
        context: list[str] = []
        question = p["question"]
        while len(encode_prompt(tok, [{"role": "user", "content": question}])) < tokens:
            context.append(pool[(i + 1 + len(context)) % len(pool)])
            question = "Earlier problems, for context:\n" + "\n".join(context) + "\n\nSolve: " + p["question"]
        out.append({**p, "question": question})
    return out


def run_ours(spec: dict[str, Any]) -> dict[str, Any]:
    """Times `spec["steps"]` GRPO steps of our stack; returns times, rewards and peak RSS."""
    import jax
    import numpy as np

    from jaxrl_mt.models.registry import load_model
    from jaxrl_mt.rl.optim import make_optimizer
    from jaxrl_mt.rl.rollout import rollout
    from jaxrl_mt.models.lora import LoraConfig
    from jaxrl_mt.rl.adapters import Trainable
    from jaxrl_mt.rl.step import loss_fn, make_train_step

    t0 = time.perf_counter()
    rss = PhaseRss()
    model = load_model(spec["model_path"])
    G, T = spec["group"], spec["new_tokens"]
    remat = spec["remat"]
    if remat == "auto":  # before the reference copy and the optimizer state exist (see `choose_remat`)
        remat = choose_remat(model, spec["prompts"], G, T)
    rank = int(spec.get("lora_rank", 0))  # LoRA: adapters train, the reference is the base (the trainer's way)
    trainable = (Trainable(model.params, LoraConfig(rank=rank, alpha=2.0 * rank), spec.get("lora_forward", "unmerged"))
                 if rank else Trainable())
    engine = make_engine(model, spec, remat, copy_reference=not rank)
    items = bench_items(spec["prompts"])
    optimizer = make_optimizer(LR, max_grad_norm=MAX_GRAD_NORM)
    params = trainable.initial(model.params, 0)
    opt_state = optimizer.init(params)
    jax.block_until_ready(opt_state)
    setup_s = time.perf_counter() - t0
    rss_loaded = peak_rss_mb()
    steps: dict[str, list[float]] = {k: [] for k in ("step_s", "cpu_s", "generate_s", "score_s", "update_s",
                                                     "generate_cpu_s", "score_cpu_s", "update_cpu_s", "reward",
                                                     "loss")}
    train_step = make_train_step(model.cfg, optimizer, engine.lc, donate=True,
                                 loss=None if not rank else trainable.loss(loss_fn))
    for step in range(spec["steps"]):
        t_step, c_step = time.perf_counter(), time.process_time()
        when = "first" if step == 0 else "steady"
        rss.phase = f"{when} rollout"
        r = rollout(engine, trainable.policy(params), items, step)  # the trainer's rollout and reward
        if int(r.example.completion_mask.sum(1).min()) != T:
            raise RuntimeError(f"completions are shorter than {T} tokens")
        t_roll, c_roll = time.perf_counter(), time.process_time()
        rss.phase = f"{when} update"
        params, opt_state, m = train_step(params, opt_state, trainable.batch(r.example))
        m = jax.device_get(m)
        jax.block_until_ready(params)
        t_end, c_end = time.perf_counter(), time.process_time()
        if not m["finite"]:
            raise RuntimeError(f"step {step}: non-finite loss or gradient (loss={float(m['loss'])})")
        gen, score = r.metrics["perf/rollout_s"], r.metrics["perf/score_s"]
        for k, v in (("step_s", t_end - t_step), ("cpu_s", c_end - c_step), ("generate_s", gen),
                     ("score_s", t_roll - t_step - gen), ("update_s", t_end - t_roll),
                     ("generate_cpu_s", r.metrics["perf/rollout_cpu_s"]),
                     ("score_cpu_s", c_roll - c_step - r.metrics["perf/rollout_cpu_s"]),
                     ("update_cpu_s", c_end - c_roll), ("reward", float(np.mean(r.rewards))),
                     ("loss", float(m["loss"]))):
            steps[k].append(v)
        print(f"[ours] step {step + 1}: {t_end - t_step:.1f}s (generate {gen:.1f}, score {score:.1f}, "
              f"update {t_end - t_roll:.1f}); CPU {c_end - c_step:.1f}s", file=sys.stderr, flush=True)
    return {"side": "ours", "setup_s": setup_s, "prompt_tokens": [int(x) for x in r.example.prompt_mask.sum(1)],
            "completion_tokens": T, "rss_after_load_mb": rss_loaded, "remat": remat, "lora_rank": rank,
            "lora_forward": spec.get("lora_forward", "unmerged") if rank else None,
            **summarize(steps["step_s"], steps["cpu_s"]),
            "phases_steady_s": {k: mean_later(steps[k]) for k in ("generate_s", "score_s", "update_s")},
            "phases_first_s": {k: steps[k][0] for k in ("generate_s", "score_s", "update_s")},
            "phases_steady_cpu_s": {k: mean_later(steps[k]) for k in ("generate_cpu_s", "score_cpu_s",
                                                                       "update_cpu_s")},
            "steps": steps, "backend": f"jax {jax.__version__} {jax.default_backend()}",
            "peak_rss_mb": peak_rss_mb(), "peak_rss_by_phase_mb": rss.stop()}


def bench_items(prompts: Sequence[dict[str, str]]) -> list[Any]:
    """The benchmark's questions as the trainer's single-turn items (the anchor prompt is the question)."""
    from jaxrl_mt.rl.histories import TrainItem

    return [TrainItem(item_id=f"q{i}", task_id=f"q{i}", kind="full", history=(), last_user=p["question"],
                      anchor_prompt=p["question"], merged_user=p["question"], answer=p["gold"])
            for i, p in enumerate(prompts)]


def make_engine(model: Any, spec: dict[str, Any], remat: bool | str, *, copy_reference: bool = True) -> Any:
    """The trainer's RolloutEngine for the benchmark: reward ``rlsta`` (lenient verifier + 1 x anchor), KL beta."""
    import dataclasses

    import jax

    from jaxrl_mt.rewards.registry import RewardEnv, make_reward
    from jaxrl_mt.rl.run_config import RewardSection, typed_config
    from jaxrl_mt.runtime import load_config_file
    from jaxrl_mt.rl.rollout import RolloutEngine
    from jaxrl_mt.rl.step import LossConfig
    from jaxrl_mt.sampling import Sampler
    from jaxrl_mt.scoring import Scorer

    G, T = spec["group"], spec["new_tokens"]
    # the reference is a copy: the train step donates (updates in place) the policy's parameters (LoRA: the
    # base weights themselves, never donated)
    ref_params = jax.tree_util.tree_map(lambda x: x.copy(), model.params) if copy_reference else model.params
    ref_scorer = Scorer(ref_params, model.cfg, pad_id=model.pad_id, batch_size=min(16, len(spec["prompts"]) * G))
    c = typed_config(load_config_file(Path(__file__).resolve().parents[2] / "configs" / "rlsta.py", "cpu"))
    rl = dataclasses.replace(c.rl, verifier_mode="lenient",
                             reward=RewardSection(alpha=1.0, anchor_prompt="full", zero_anchor_for_wrong=False))
    reward = make_reward("rlsta", RewardEnv(dataclasses.replace(c, rl=rl), G, model.tokenizer, None, ref_scorer))
    lc = LossConfig(beta=spec["beta"], loss_type="grpo", temperature=1.0, max_completion_length=T, remat=remat,
                    chunk=HEAD_CHUNK)
    return RolloutEngine(sampler=Sampler.from_model(model), reward_fn=reward, reward_name="rlsta",
                         ref_params=ref_params, ref_cfg=model.cfg, policy_cfg=model.cfg, tokenizer=model.tokenizer,
                         pad_id=model.pad_id, lc=lc, group_size=G, max_new_tokens=T, temperature=1.0,
                         run_to_budget=True)


def choose_remat(model: Any, items: Sequence[dict[str, str]], group: int, new_tokens: int) -> bool | str:
    """The rematerialisation of the grouped step chosen from its activation estimate (`rl.step.choose_remat`)."""
    from jaxrl_mt.chat import encode_prompt
    from jaxrl_mt.rl.step import choose_remat as choose
    from jaxrl_mt.sampling import bucket

    longest = max(len(encode_prompt(model.tokenizer, [{"role": "user", "content": p["question"]}])) for p in items)
    return choose(model.cfg, len(items), group, bucket(longest, 32), bucket(new_tokens, 16), chunk=HEAD_CHUNK)


# ----------------------------------------------------------------------------- driver


def run_side(side: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Runs one side in a fresh Python subprocess and returns its result dict."""
    with tempfile.TemporaryDirectory(prefix="bench_grpo_") as d:
        spec_path, out_path = Path(d) / "spec.json", Path(d) / "result.json"
        spec_path.write_text(json.dumps(spec))
        env = dict(os.environ)
        env.setdefault("JAX_PLATFORMS", "cpu")
        cmd = [sys.executable, "-m", "jaxrl_mt.benchmarks.grpo", "--worker", side, "--spec", str(spec_path),
               "--result", str(out_path)]
        proc = subprocess.run(cmd, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"the {side} worker failed with exit code {proc.returncode}")
        return json.loads(out_path.read_text())


def format_table(results: dict[str, dict[str, Any]]) -> str:
    """A plain-text table of the per-side figures and the ours/TRL ratios."""
    rows = [("first step (s)", "first_step_s"), ("steady step (s)", "steady_step_s"),
            ("first step CPU (s)", "first_step_cpu_s"), ("steady step CPU (s)", "steady_step_cpu_s"),
            ("  generate (s)", ("phases_steady_s", "generate_s")), ("  score (s)", ("phases_steady_s", "score_s")),
            ("  update (s)", ("phases_steady_s", "update_s")), ("setup/load (s)", "setup_s"),
            ("RSS after load (MiB)", "rss_after_load_mb"), ("peak RSS (MiB)", "peak_rss_mb")]

    def get(r: dict[str, Any], key: Any) -> float:
        if isinstance(key, tuple):
            return float(r[key[0]][key[1]])
        return float(r[key])

    sides = [s for s in SIDES if s in results]
    head = f"{'':24s}" + "".join(f"{s:>12s}" for s in sides) + (f"{'ours/trl':>12s}" if len(sides) == 2 else "")
    lines = [head]
    for label, key in rows:
        vals = [get(results[s], key) for s in sides]
        line = f"{label:24s}" + "".join(f"{v:12.2f}" for v in vals)
        if len(sides) == 2:
            line += f"{vals[0] / vals[1]:12.2f}" if vals[1] else f"{'-':>12s}"
        lines.append(line)
    return "\n".join(lines)


def _load() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return ""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m jaxrl_mt.benchmarks.grpo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="builtin:smollm2-135m-instruct", help="model spec (builtin:NAME or HF folder)")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step")
    ap.add_argument("--group", type=int, default=4, help="G, generations per prompt")
    ap.add_argument("--new-tokens", type=int, default=128, help="new tokens per completion (forced)")
    ap.add_argument("--beta", type=float, default=1e-4, help="KL coefficient (> 0: reference forward)")
    ap.add_argument("--steps", type=int, default=3,
                    help="timed steps per side (the first includes compilation; steady = mean of the others)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="CPU threads per side (torch threads; both workers are pinned to this many CPUs)")
    ap.add_argument("--remat", choices=("auto", "on", "off"), default="auto",
                    help="gradient checkpointing: TRL on unless off; ours chosen from a memory estimate unless on/off")
    ap.add_argument("--no-remat", dest="remat", action="store_const", const="off", help="same as --remat off")
    ap.add_argument("--only", choices=SIDES, default=None, help="run one side only")
    ap.add_argument("--lora-rank", type=int, default=0,
                    help="ours trains LoRA adapters of this rank on every projection (0: full fine-tuning); "
                         "compare with a second run without it (--only ours)")
    ap.add_argument("--lora-forward", choices=("unmerged", "merged"), default="unmerged",
                    help="the LoRA loss's forward: x W + s (x A) B, or x (W + s A B)")
    ap.add_argument("--prompt-tokens", type=int, default=0,
                    help="lengthen each prompt with earlier questions to at least this many tokens (0: as is)")
    ap.add_argument("--json", default=None, help="write the results to this JSON file")
    ap.add_argument("--worker", choices=SIDES, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--spec", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    for name in ("prompts", "new_tokens", "steps", "threads"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.group < 2:
        ap.error(f"--group must be >= 2 for group-relative advantages, got {a.group}")
    if a.beta < 0:
        ap.error(f"--beta must be >= 0, got {a.beta}")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    if a.worker:
        spec = json.loads(Path(a.spec).read_text())
        pin_cpus(spec["threads"])  # before jax / torch start their thread pools
        if a.worker == "ours":
            res = run_ours(spec)
        else:
            from jaxrl_mt.benchmarks.grpo_trl import run_trl

            res = run_trl(spec)
        Path(a.result).write_text(json.dumps(res))
        return 0
    from jaxrl_mt.models.registry import resolve

    prompts = load_prompts(a.prompts)
    if a.prompt_tokens:
        prompts = lengthen_prompts(prompts, str(resolve(a.model)), a.prompt_tokens)
    spec = {"model": a.model, "model_path": str(resolve(a.model)), "prompts": prompts,
            "group": a.group, "new_tokens": a.new_tokens, "beta": a.beta, "steps": a.steps,
            "threads": a.threads, "remat": {"auto": "auto", "on": True, "off": False}[a.remat],
            "lora_rank": a.lora_rank, "lora_forward": a.lora_forward}
    load_before = _load()
    results = {side: run_side(side, spec) for side in SIDES if a.only in (None, side)}
    load_after = _load()
    print(f"GRPO step: {a.model}, {a.prompts} prompts x G={a.group}, {a.new_tokens} new tokens, beta={a.beta}, "
          f"{a.steps} steps, {a.threads} threads per side ({os.cpu_count()} CPUs), "
          f"gradient checkpointing: TRL {'off' if a.remat == 'off' else 'on'}, ours {a.remat}")
    print(format_table(results))
    if "peak_rss_by_phase_mb" in results.get("ours", {}):  # sampled VmRSS, the largest per phase
        print("ours, peak RSS by phase (MiB): " + ", ".join(f"{k} {v:.0f}"
                                                           for k, v in results["ours"]["peak_rss_by_phase_mb"].items()))
    print(f"load before: {load_before}\nload after:  {load_after}")
    if a.json:
        out = {"config": {k: v for k, v in spec.items() if k != "prompts"},
               "questions": [p["question"] for p in spec["prompts"]], "results": results,
               "uptime_before": load_before, "uptime_after": load_after}
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
