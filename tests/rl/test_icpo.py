"""ICPO: every branch of the reward, item construction, and the config preset."""

from __future__ import annotations

import pytest

from configs.icpo import get_config
from jaxrl_mt.data import synthetic_tasks
from jaxrl_mt.rewards.judge import NON_ANSWER_TYPES, RESPONSE_TYPES
from jaxrl_mt.rl.histories import load_items
from jaxrl_mt.rl.icpo import COMPLETE, UNDERSPECIFIED, icpo_reward, make_items


def test_complete_prompt_reward_is_the_verifier() -> None:
    assert icpo_reward(COMPLETE, "So the total is 42.", "42", "answer_attempt") == 1.0
    assert icpo_reward(COMPLETE, "So the total is 41.", "42", "answer_attempt") == 0.0
    # On a complete prompt, asking back earns nothing even though it is a non-answer.
    assert icpo_reward(COMPLETE, "How many apples were there?", "42", "clarification") == 0.0
    # strict vs lenient: 42 is among the last three numbers but not the final answer.
    text = "42 apples and 3 pears make 45"
    assert icpo_reward(COMPLETE, text, "42", "answer_attempt", mode="strict") == 0.0
    assert icpo_reward(COMPLETE, text, "42", "answer_attempt", mode="lenient") == 1.0


@pytest.mark.parametrize("rtype", RESPONSE_TYPES)
def test_underspecified_reward_by_type(rtype: str) -> None:
    expected = 1.0 if rtype in NON_ANSWER_TYPES else 0.0
    assert icpo_reward(UNDERSPECIFIED, "whatever", "42", rtype) == expected
    assert {"answer_attempt", "missing"}.isdisjoint(NON_ANSWER_TYPES)


def test_underspecified_correct_number_still_zero() -> None:
    # Committing to an answer on an underspecified prompt is rewarded 0 even if it is the gold.
    assert icpo_reward(UNDERSPECIFIED, "The answer is 42.", "42", "answer_attempt") == 0.0


def test_bad_kind_and_type() -> None:
    with pytest.raises(ValueError, match="unknown ICPO prompt kind 'partial'"):
        icpo_reward("partial", "x", "1", "hedging")
    with pytest.raises(ValueError, match="unknown response type 'shrug'"):
        icpo_reward(UNDERSPECIFIED, "x", "1", "shrug")


def test_make_items_mixes_and_is_seeded() -> None:
    tasks = synthetic_tasks(40, steps=2, seed=3)
    a = make_items(tasks, ratio=0.5, seed=7)
    b = make_items(tasks, ratio=0.5, seed=7)
    assert a == b
    kinds = [it.kind for it in a]
    assert 8 <= kinds.count(UNDERSPECIFIED) <= 32 and kinds.count(COMPLETE) >= 8
    for it, t in zip(a, tasks):
        assert it.history == () and it.anchor_prompt == t.full_prompt and it.answer == t.answer
        if it.kind == COMPLETE:
            assert it.last_user == t.full_prompt
        else:  # at least one condition's text is missing from the prompt
            assert any(c not in it.last_user for c in t.conditions)
    assert all(it.kind == COMPLETE for it in make_items(tasks, ratio=0.0, seed=1))
    assert all(it.kind == UNDERSPECIFIED for it in make_items(tasks, ratio=1.0, seed=1))


def test_presets() -> None:
    paper = get_config("paper")
    assert (paper.rl.lr, paper.rl.batch_size, paper.rl.group_size) == (1e-6, 64, 8)
    cpu = get_config("cpu")
    assert cpu.method == "icpo" and cpu.rl.alpha == 0.0 and cpu.icpo.judge == "rule"


def test_icpo_runs_in_the_one_trainer(tiny_chat_model_dir, tmp_path) -> None:
    """ICPO is data + a reward: the same Trainer runs it, with the icpo recipe and the registered reward."""
    from jaxrl_mt.rl.icpo import ICPOData
    from jaxrl_mt.rl.loop import Trainer

    c = get_config("cpu")
    c.model, c.workdir = str(tiny_chat_model_dir), str(tmp_path / "w")
    c.data.add_source, c.data.limit, c.data.heldout = "synthetic:8:0", 8, 1
    c.rl.steps, c.rl.batch_size, c.rl.group_size, c.rl.max_new_tokens = 1, 2, 2, 4
    c.rl.remat, c.eval.max_new_tokens, c.export = False, 4, False
    t = Trainer(c)
    assert isinstance(t.data, ICPOData) and t.objective.engine.reward_name == "icpo"
    out = t.run()
    row = out["metrics"][0]
    assert {"reward/total", "reward/type_answer_attempt", "train/loss"} <= set(row)
    assert set(out["evals"]) == {"before", "after"} and "eval/type_clarification" in out["evals"]["after"]
    kinds = {it.kind for it in load_items(tmp_path / "w" / "train_items.jsonl")}
    assert kinds <= {COMPLETE, UNDERSPECIFIED} and kinds
