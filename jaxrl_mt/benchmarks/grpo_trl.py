"""The TRL side of ``benchmarks grpo``: ``GRPOTrainer`` timed step by step (see `benchmarks.grpo`).

Run in the worker subprocess of `benchmarks.grpo.run_side` ("trl"); per-phase times come from
timers wrapped around ``GRPOTrainer._generate`` and ``_generate_and_score_completions``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from typing import Any, Callable

from jaxrl_mt.benchmarks.grpo_common import LR, MAX_GRAD_NORM, mean_later, peak_rss_mb, summarize


def _timed(fn: Callable[..., Any], sink: list[float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - t0)

    return wrapper


def run_trl(spec: dict[str, Any]) -> dict[str, Any]:
    """Times `spec["steps"]` steps of TRL's GRPOTrainer; returns times, rewards and peak RSS."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    import trl
    from trl import GRPOConfig, GRPOTrainer

    from jaxrl_mt.rewards.verifier import verify

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    G, T = spec["group"], spec["new_tokens"]
    n_rows = len(spec["prompts"]) * G
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(spec["model_path"])
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": p["question"]}], "gold": p["gold"]}
                              for p in spec["prompts"]])

    def verifier_reward(prompts: list, completions: list, gold: list[str], **_: Any) -> list[float]:
        return [verify(c[0]["content"] if isinstance(c, list) else c, g, "lenient") for c, g in zip(completions, gold)]

    out_dir = tempfile.mkdtemp(prefix="bench_grpo_trl_")
    args = GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=n_rows, gradient_accumulation_steps=1, num_generations=G,
        max_completion_length=T, generation_kwargs={"min_new_tokens": T}, beta=spec["beta"], temperature=1.0,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch", weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=MAX_GRAD_NORM, loss_type="grpo",
        num_iterations=1, use_vllm=False, report_to=[], logging_steps=1, max_steps=spec["steps"], bf16=False,
        fp16=False, gradient_checkpointing=spec["remat"] is not False, use_cpu=True, save_strategy="no",
        shuffle_dataset=False,
        seed=0, dataloader_num_workers=0, model_init_kwargs={"dtype": torch.float32}, disable_tqdm=True,
    )
    step_s: list[float] = []
    cpu_s: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            step_s.append(time.perf_counter() - self.t0)
            cpu_s.append(time.process_time() - self.c0)
            print(f"[trl] step {len(step_s)}: {step_s[-1]:.1f}s", file=sys.stderr, flush=True)

    trainer = GRPOTrainer(model=spec["model_path"], reward_funcs=verifier_reward, args=args, train_dataset=data,
                          processing_class=tok, callbacks=[StepTimer()])
    gen_s: list[float] = []
    gen_score_s: list[float] = []
    trainer._generate = _timed(trainer._generate, gen_s)
    trainer._generate_and_score_completions = _timed(trainer._generate_and_score_completions, gen_score_s)
    setup_s = time.perf_counter() - t0
    rss_loaded = peak_rss_mb()
    try:
        trainer.train()
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    if len(step_s) != spec["steps"] or len(gen_s) != spec["steps"]:
        raise RuntimeError(f"TRL ran {len(step_s)} steps / {len(gen_s)} generations, expected {spec['steps']}")
    lengths = [h.get("completions/mean_length") for h in logs]
    if any(L is not None and abs(L - T) > 1e-6 for L in lengths):
        raise RuntimeError(f"TRL completions were not {T} tokens long: mean lengths {lengths}")
    score_s = [a - b for a, b in zip(gen_score_s, gen_s)]
    update_s = [a - b for a, b in zip(step_s, gen_score_s)]
    steps = {"step_s": step_s, "cpu_s": cpu_s, "generate_s": gen_s, "score_s": score_s, "update_s": update_s,
             "reward": [h.get("reward") for h in logs], "loss": [h.get("loss") for h in logs]}
    return {"side": "trl", "setup_s": setup_s, "completion_tokens": T, "rss_after_load_mb": rss_loaded,
            **summarize(step_s, cpu_s),
            "phases_steady_s": {k: mean_later(steps[k]) for k in ("generate_s", "score_s", "update_s")},
            "phases_first_s": {k: steps[k][0] for k in ("generate_s", "score_s", "update_s")},
            "steps": steps, "completion_mean_length": lengths,
            "backend": f"trl {trl.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads",
            "peak_rss_mb": peak_rss_mb()}
