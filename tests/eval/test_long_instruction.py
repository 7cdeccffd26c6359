"""Issue 32, failure 8: an instruction longer than the context ends its own conversation, not the evaluation."""

from __future__ import annotations

import dataclasses

import pytest

from jaxrl_mt.data import synthetic_tasks
from jaxrl_mt.eval.report import build_report
from jaxrl_mt.eval.simulator import STOP_TOO_LONG, Judge, plan_runs, simulate
from jaxrl_mt.sampling import SamplingConfig
from tests.sampler_spy import recording_sampler


@pytest.mark.slow  # 14 s of compiles on 2 loaded cores
def test_a_too_long_first_prompt_is_marked_and_the_others_run(tiny_model) -> None:
    short = synthetic_tasks(1, steps=2)
    long = dataclasses.replace(short[0], task_id="long", full_prompt="word " * 300)  # > 120 tokens once rendered
    runs, _ = plan_runs([*short, long], ["full", "sharded"], 1)
    sampler = recording_sampler(tiny_model, max_batch=8)
    # before: ValueError "prompt of ... exceeds"
    sampler.engine = dataclasses.replace(sampler.engine, cfg=sampler.cfg.replace(max_position_embeddings=120))
    recs = simulate(sampler, runs, SamplingConfig(max_new_tokens=4, temperature=1.0), judge=Judge(),
                    protocol="lic", verifier_mode="strict")
    by_id = {(r["task_id"], r["kind"]): r for r in recs}
    assert len(recs) == len(runs) == 4
    marked = by_id[("long", "full")]
    assert marked["stop_reason"] == STOP_TOO_LONG and marked["n_turns"] == 0 and marked["score"] == 0.0
    others = [r for k, r in by_id.items() if k != ("long", "full")]
    assert all(r["n_turns"] >= 1 and r["stop_reason"] != STOP_TOO_LONG for r in others)
    assert by_id[("long", "sharded")]["n_turns"] >= 1  # the same task's sharded turns fit: they ran
    report = build_report(recs, scenarios=["full", "sharded"], protocol="lic", n_boot=10, seed=0)
    assert report["scenarios"]["full"]["stop_reasons"][STOP_TOO_LONG] == 1
