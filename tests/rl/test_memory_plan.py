"""The memory planner's choices recorded at the first start and reused on resume (issue 53 item 6).

Before: ``rl.remat=auto`` decided from ``available_memory()`` at every start, so a LoRA run killed
and resumed on a host with less free memory trained with ``'dots'`` instead of ``False`` from the
resume on (steps 2-4 differed from the uninterrupted run, KL by 1.2%).
"""

from __future__ import annotations

import json

from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.rl.memory_plan import PLAN_FILE, MemoryPlan
from jaxrl_mt.rl.step import choose_remat

CFG = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                  num_kv_heads=3, head_dim=64)  # the embedded model's shapes (SmolLM2-135M)
ROOMY, TIGHT = 1 << 40, 1 << 28  # free bytes at the first start, at the resume


def _decide(budget: int):
    return lambda: choose_remat(CFG, 4, 6, 256, 64, budget=budget)


def test_a_resume_with_less_free_memory_reuses_the_first_starts_choice(tmp_path):
    assert (_decide(ROOMY)(), _decide(TIGHT)()) == (False, True)  # the planner alone would change its mind
    first: list[str] = []
    assert MemoryPlan(tmp_path, chunk=128, log=first.append).remat(256, "auto", _decide(ROOMY)) is False
    assert json.loads((tmp_path / PLAN_FILE).read_text()) == {
        "buckets": {"256": {"remat": False, "chunk": 128, "source": "auto"}}}
    resumed: list[str] = []
    plan = MemoryPlan(tmp_path, chunk=128, log=resumed.append)
    assert plan.remat(256, "auto", _decide(TIGHT)) is False
    assert resumed == [f"rl.remat auto: prompt bucket 256 -> False, as recorded at the first start "
                       f"({tmp_path / PLAN_FILE})"]
    assert plan.remat(512, "auto", _decide(TIGHT)) is True  # a bucket first seen now is decided (and recorded)
    assert MemoryPlan(tmp_path, chunk=128).recorded(512) is True


def test_an_explicit_override_is_logged_and_recorded(tmp_path):
    MemoryPlan(tmp_path, chunk=128).remat(256, "auto", _decide(ROOMY))
    lines: list[str] = []
    assert MemoryPlan(tmp_path, chunk=128, log=lines.append).remat(256, "dots", _decide(ROOMY)) == "dots"
    assert lines == [f"rl.remat='dots' overrides the recorded plan False for prompt bucket 256 "
                     f"({tmp_path / PLAN_FILE}); recorded"]
    assert MemoryPlan(tmp_path, chunk=128, log=lines.append).remat(256, "auto", _decide(ROOMY)) == "dots"


def test_a_damaged_plan_is_decided_again_with_a_log_line(tmp_path):
    (tmp_path / PLAN_FILE).write_text('{"buckets": {"256": {"remat": fal')
    lines: list[str] = []
    assert MemoryPlan(tmp_path, chunk=128, log=lines.append).remat(256, "auto", _decide(TIGHT)) is True
    assert lines[0].startswith(f"{tmp_path / PLAN_FILE}: unreadable (JSONDecodeError")


def test_the_trainer_reuses_its_recorded_choice_on_resume(tiny_chat_model_dir, tmp_path, monkeypatch):
    """The Trainer itself: the first start records, a start with (nearly) no free memory reuses it."""
    import jaxrl_mt.rl.step as step
    from jaxrl_mt.rl.loop import Trainer
    from tests.rl.test_loop import tiny_config

    c = tiny_config(tiny_chat_model_dir, tmp_path / "w")
    c.rl.remat = "auto"
    logs: list[str] = []
    def remat(t: Trainer, auto: bool = False) -> bool | str:
        return (t._auto_remat if auto else t._remat)(64, t.objective.footprint(64))

    first = remat(Trainer(c, log=logs.append))
    assert first is False and json.loads((tmp_path / "w" / PLAN_FILE).read_text())["buckets"]["64"]["remat"] is False
    monkeypatch.setattr(step, "available_memory", lambda: 1 << 20)  # the resume's host: 1 MiB free
    assert remat(Trainer(c, log=logs.append), auto=True) is True  # what the old code used from the resume on
    assert remat(Trainer(c, log=logs.append)) is False
    assert logs[-1].startswith("rl.remat auto: prompt bucket 64 -> False, as recorded at the first start")
