"""The "+ Abstain" evaluation arm: the instruction reaches every conversation, abstentions are non-answers."""

from __future__ import annotations

import json

import pytest

from jaxrl_mt.eval.judging import ABSTAIN_LABEL, Judge, judge_turn
from jaxrl_mt.eval.simulator import EvalError
from jaxrl_mt.evaluate import evaluate
from jaxrl_mt.rewards.abstain import ABSTAIN_INSTRUCTION, with_abstain
from tests.eval.test_evaluate_cli import tiny_config
from tests.eval.test_simulator import counting_sampler


@pytest.mark.parametrize("abstain", [True, False])
def test_the_instruction_reaches_every_prompt_and_is_recorded(abstain, tmp_path, tiny_model):
    cfg = tiny_config(tmp_path, dataset=("synthetic:1",), limit=0, runs=1, scenarios=("full", "sharded"),
                      reuse_cache=False, abstain=abstain)
    sampler = counting_sampler(tiny_model)
    evaluate(cfg, model=tiny_model, sampler=sampler, log=lambda s: None)
    texts = [tiny_model.tokenizer.decode(p) for prompts, _ in sampler.calls for p in prompts]
    assert texts and all((ABSTAIN_INSTRUCTION in t) == abstain for t in texts)
    assert json.loads((tmp_path / "eval_config.json").read_text())["abstain"] is abstain


def test_an_older_workdir_without_the_field_resumes_as_without_abstain(tmp_path, tiny_model):
    cfg = tiny_config(tmp_path, dataset=("synthetic:1",), limit=0, runs=1, scenarios=("full",), reuse_cache=False)
    evaluate(cfg, model=tiny_model, sampler=counting_sampler(tiny_model), log=lambda s: None)
    stored = json.loads((tmp_path / "eval_config.json").read_text())
    del stored["abstain"]  # as written before the field existed
    (tmp_path / "eval_config.json").write_text(json.dumps(stored))
    out = evaluate(cfg, model=tiny_model, sampler=counting_sampler(tiny_model), log=lambda s: None)
    assert out["n_generated"] == 0  # resumed: nothing redone
    cfg.abstain = True
    with pytest.raises(EvalError, match=r"field 'abstain': .* False, this run has True"):
        evaluate(cfg, model=tiny_model, sampler=counting_sampler(tiny_model), log=lambda s: None)
    bad = {**cfg.to_dict(), "abstain": "yes"}  # a plain dict (the locked ConfigDict refuses the type itself)
    with pytest.raises(EvalError, match=r"config field abstain must be bool, got 'yes'"):
        evaluate(bad, model=tiny_model, log=lambda s: None)


def test_an_abstention_is_a_non_answer_and_scores_zero():
    replies = ["I need the price per apple first. \\boxed{abstain}", "The answer is \\boxed{ Abstain }",
               "So the total is 12. \\boxed{12}"]
    labels = [label for label, _ in Judge().judge(replies, ["q"] * 3, ["math"] * 3)]
    assert labels[:2] == [ABSTAIN_LABEL, ABSTAIN_LABEL] and labels[2] == "answer_attempt"
    v = judge_turn(replies[0], "12", labels[0], "strict")
    assert v["answer_attempt"] is False and v["correct"] == 0.0
    assert with_abstain(None) == ABSTAIN_INSTRUCTION and with_abstain("Be brief.").startswith("Be brief.\n\n")
