"""`python -m jaxrl_mt.benchmarks grpo`: defaults, and our side's step on a tiny chat model (tokenised inside)."""

from __future__ import annotations

import math
import sys

import pytest

from jaxrl_mt import chat
from jaxrl_mt.benchmarks import grpo


def test_defaults_are_three_steps_and_remat_from_the_estimate():
    a = grpo.parse_args([])
    assert a.steps == 3 and a.remat == "auto"
    assert grpo.parse_args(["--no-remat"]).remat == "off"
    with pytest.raises(SystemExit):
        grpo.parse_args(["--remat", "maybe"])


def test_our_step_tokenises_inside_the_timed_step(tiny_chat_model_dir, monkeypatch):
    calls: list[int] = []
    real = chat.encode_prompt
    counting = lambda *a, **k: calls.append(1) or real(*a, **k)  # noqa: E731
    for mod in list(sys.modules.values()):  # every module that imported the name (order of the test run)
        if mod is not None and getattr(mod, "encode_prompt", None) is real:
            monkeypatch.setattr(mod, "encode_prompt", counting)
    import jaxrl_mt.rl.rollout as ro

    rollouts: list[int] = []
    real_rollout = ro.rollout
    monkeypatch.setattr(ro, "rollout", lambda *a, **k: rollouts.append(1) or real_rollout(*a, **k))
    prompts = grpo.load_prompts(2)
    spec = {"model_path": str(tiny_chat_model_dir), "prompts": prompts, "group": 2, "new_tokens": 4, "beta": 1e-4,
            "steps": 2, "threads": 1, "remat": "auto"}
    r = grpo.run_ours(spec)
    # per step: the 2 policy prompts and the 4 anchor prompts; at setup: the 2 of the memory estimate
    assert len(calls) == 2 * (2 + 4) + 2
    assert len(rollouts) == 2  # the trainer's own rollout and reward, once per step (no copy in the benchmark)
    assert len(r["steps"]["step_s"]) == 2 and math.isfinite(r["steady_step_s"])
    assert r["remat"] is False  # a tiny model's activations fit
    assert all(math.isfinite(x) for x in r["steps"]["loss"])


def test_our_step_with_lora_trains_adapters(tiny_chat_model_dir):
    spec = {"model_path": str(tiny_chat_model_dir), "prompts": grpo.load_prompts(2), "group": 2, "new_tokens": 4,
            "beta": 1e-4, "steps": 2, "threads": 1, "remat": False, "lora_rank": 4}
    r = grpo.run_ours(spec)
    assert r["lora_rank"] == 4 and all(math.isfinite(x) for x in r["steps"]["loss"])
    assert grpo.parse_args(["--lora-rank", "16"]).lora_rank == 16
