"""GRPO step, ours against tunix's `GRPOLearner`: the ``--grpo`` part of ``benchmarks tunix``.

Each round runs our side (`benchmarks.grpo`'s worker: the trainer's own rollout and step) and
then tunix's (``tunix_grpo_side.py`` in tunix's venv) as fresh subprocesses, on the same
chat-formatted GSM8K prompts (token ids: our `encode_prompt`), P x G, exactly N new tokens,
temperature 1, beta, AdamW 1e-6 with clipping at 1, fp32. The rewards differ (ours: the trainer's
verifier + anchor; tunix's: a cheap function of the ids): the step's work is the same apart from
the reward itself. Reported: the medians over rounds of the steady step time and of the peak RSS.

``lora_rank`` R > 0 runs both sides with LoRA adapters of rank R, alpha 2R, on every layer's seven
projections (q, k, v, o, gate, up, down), the base weights being the reference: ours through the
grpo worker's ``lora_rank`` (`rl.adapters.Trainable`), tunix's through qwix as its demos do it
(``qwix.LoraProvider`` + ``qwix.apply_lora_to_model``, the actor the LoRA model, the reference the
base model). tunix's side reports the parameter count its trainer's optimizer updates, which must
equal the adapters' count (`adapter_params`, from config.json: L x R x the sum of each
projection's in + out), and that the base weights came out of training bit-identical.

tunix masks every prompt token equal to its pad id, and SmolLM2's pad (2) is its ``<|im_end|>``,
which chat prompts contain: tunix is given a pad id that no prompt holds. tunix's update runs one
prompt's G completions per micro-batch (gradient accumulation over the P prompts, the same
update): with the whole batch in one micro-batch it grew past 18 GB RSS on the CPU and was
OOM-killed, and its `RematConfig.BLOCK` fails under flax 0.12.8 (TraceContextError in the sampler).
"""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path
from typing import Any, Callable

GRPO_SIDE = Path(__file__).with_name("tunix_grpo_side.py")


def grpo_spec(model: str, *, prompts: int, group: int, new_tokens: int, beta: float, steps: int,
              lora_rank: int = 0) -> dict[str, Any]:
    """Our grpo worker's spec (as `benchmarks grpo` builds it; remat auto, all CPUs; LoRA: rank, unmerged)."""
    from jaxrl_mt.benchmarks.grpo import load_prompts
    from jaxrl_mt.models.registry import resolve

    if lora_rank < 0:
        raise ValueError(f"lora_rank must be >= 0, got {lora_rank}")
    return {"model": model, "model_path": str(resolve(model)), "prompts": load_prompts(prompts), "group": group,
            "new_tokens": new_tokens, "beta": beta, "steps": steps, "threads": os.cpu_count() or 1,
            "remat": "auto", "lora_rank": lora_rank, "lora_forward": "unmerged"}


def adapter_params(hf_dir: str | os.PathLike, rank: int) -> int:
    """Parameters of rank-`rank` adapters on every layer's q, k, v, o, gate, up, down (A [in, r] + B [r, out]
    each), by hand from the HF config.json."""
    import json

    c = json.loads((Path(hf_dir) / "config.json").read_text())
    d, ffn = c["hidden_size"], c["intermediate_size"]
    hd = c.get("head_dim") or d // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    in_out = (d + q) + 2 * (d + kv) + (q + d) + 2 * (d + ffn) + (ffn + d)  # q, k + v, o, gate + up, down
    return c["num_hidden_layers"] * rank * in_out


def tunix_grpo_job(spec: dict[str, Any]) -> dict[str, Any]:
    """tunix's job for the same prompts: chat-formatted ids, width a power of 2, a pad id no prompt holds."""
    from jaxrl_mt.chat import encode_prompt
    from jaxrl_mt.models.registry import load_tokenizer

    tok = load_tokenizer(spec["model_path"])
    ids = [list(map(int, encode_prompt(tok, [{"role": "user", "content": p["question"]}]))) for p in spec["prompts"]]
    used = {t for p in ids for t in p}
    pad = next(t for t in range(len(used) + 1) if t not in used)
    return {"hf_dir": spec["model_path"], "prompts": ids, "group": spec["group"], "new_tokens": spec["new_tokens"],
            "prompt_len": 2 ** math.ceil(math.log2(max(map(len, ids)))), "beta": spec["beta"],
            "steps": spec["steps"], "pad_id": pad, "remat": "none", "micro_batch": 1,
            "lora_rank": spec.get("lora_rank", 0)}


def run_grpo(py: Path, run_side: Callable[..., Any], *, model: str, rounds: int, steps: int, new_tokens: int,
             prompts: int = 4, group: int = 4, beta: float = 1e-4, lora_rank: int = 0) -> dict[str, Any]:
    """Alternating rounds of both sides; medians of the steady step and the peak RSS over rounds.

    `run_side` is `benchmarks.tunix.run_side` (passed in: that module imports this one).

    Raises:
      RuntimeError: after a round whose sides trained other parameters than asked (`check_lora`).
    """
    import tempfile

    from jaxrl_mt.benchmarks.grpo import run_side as run_ours_side

    spec = grpo_spec(model, prompts=prompts, group=group, new_tokens=new_tokens, beta=beta, steps=steps,
                     lora_rank=lora_rank)
    job = tunix_grpo_job(spec)
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "tunix": []}
    n_adapters = adapter_params(spec["model_path"], lora_rank) if lora_rank else None
    with tempfile.TemporaryDirectory() as d:
        for i in range(rounds):
            runs["ours"].append(run_ours_side("ours", spec))
            runs["tunix"].append(run_side([str(py), str(GRPO_SIDE)], job, Path(d), f"grpo{i}", logits=False)[0])
            check_lora(lora_rank, n_adapters, runs["ours"][-1], runs["tunix"][-1])  # fails at the first round
    out: dict[str, Any] = {"prompts": prompts, "group": group, "new_tokens": new_tokens, "beta": beta,
                           "steps": steps, "rounds": rounds, "prompt_lens": [len(p) for p in job["prompts"]],
                           "lora_rank": lora_rank, "lora_alpha": 2 * lora_rank if lora_rank else None,
                           "adapter_params": n_adapters}
    for side, rs in runs.items():
        out[side] = {"steady_step_s": statistics.median(r["steady_step_s"] for r in rs),
                     "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in rs),
                     "rounds_steady_step_s": [r["steady_step_s"] for r in rs],
                     "lora_rank": rs[0].get("lora_rank", 0)}
    out["ours"]["phases_steady_s"] = runs["ours"][-1]["phases_steady_s"]
    t = runs["tunix"][-1]
    out["tunix"].update(trainable_params=t["trainable_params"], params=t["params"],
                        base_unchanged=t["base_unchanged"])
    out["ratio_step"] = out["tunix"]["steady_step_s"] / out["ours"]["steady_step_s"]
    out["ratio_rss"] = out["ours"]["peak_rss_mb"] / out["tunix"]["peak_rss_mb"]
    return out


def check_lora(rank: int, n_adapters: int | None, ours: dict[str, Any], tunix: dict[str, Any]) -> None:
    """Raises RuntimeError unless both sides' results ran at LoRA rank `rank` and tunix's optimizer trained
    what that asks for: LoRA, exactly the `n_adapters` adapter parameters, its base weights bit-identical
    after training; full fine-tuning, every parameter."""
    ranks = {"ours": ours.get("lora_rank", 0), "tunix": tunix.get("lora_rank", 0)}
    if set(ranks.values()) != {rank}:
        raise RuntimeError(f"LoRA rank {rank} asked, the sides ran {ranks}")
    want = n_adapters if rank else tunix["params"]
    if tunix["trainable_params"] != want:
        raise RuntimeError(f"tunix's optimizer trains {tunix['trainable_params']} parameters, expected {want} "
                           f"({'the adapters' if rank else 'all'})")
    if rank and not tunix["base_unchanged"]:
        raise RuntimeError("tunix's LoRA training changed the base weights")


def format_grpo(r: dict[str, Any]) -> str:
    """The GRPO lines of the report."""
    o, t = r["ours"], r["tunix"]
    ph = ", ".join(f"{k.removesuffix('_s')} {v:.1f}" for k, v in o["phases_steady_s"].items())
    rank = r.get("lora_rank", 0)
    how = (f"LoRA rank {rank}, alpha {2 * rank}, q/k/v/o/gate/up/down ({r['adapter_params']:,} adapter parameters), "
           "the base as reference" if rank else "full fine-tuning")
    lora = lambda s: f"LoRA rank {s.get('lora_rank', 0)}" if s.get("lora_rank") else "full"  # noqa: E731
    trained = (f"; its optimizer trains {t['trainable_params']:,} of {t['params']:,} parameters, base weights "
               f"{'unchanged' if t['base_unchanged'] else 'changed'}" if "trainable_params" in t else "")
    return "\n".join([
        f"GRPO step ({r['prompts']} x G {r['group']}, {r['new_tokens']} new tokens, beta {r['beta']}, {how}, "
        f"medians of {r['rounds']} rounds, steady = steps 2..{r['steps']}):",
        f"ours   {o['steady_step_s']:.1f} s per step ({ph}), peak RSS {o['peak_rss_mb']:.0f} MB [{lora(o)}]",
        f"tunix  {t['steady_step_s']:.1f} s per step, peak RSS {t['peak_rss_mb']:.0f} MB [{lora(t)}{trained}]",
        f"ratio: ours {r['ratio_step']:.2f}x faster per step, at {r['ratio_rss']:.2f}x tunix's peak RSS"])
