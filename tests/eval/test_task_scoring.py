"""Per-domain scoring of LiC replies on real task records: HumanEval, the LiC database and actions samples.

Replies go through the simulator's real scoring path (``TurnScorer`` -> judge -> task verifier,
sandbox and SQLite included) on runs planned by ``plan_runs``; only the model is left out (a
tiny random model never writes working code, so the replies here are written by hand).
"""

from __future__ import annotations

import json

import pytest

from jaxrl_mt.conversations import ConversationRun, TurnRecord
from jaxrl_mt.data.loaders import load_source
from jaxrl_mt.data.records import ShardedTask
from jaxrl_mt.eval.simulator import Judge, TurnScorer, plan_runs, transcript_record
from jaxrl_mt.eval.task_scoring import conversation_system, score_task_turns, task_turn
from jaxrl_mt.tasks import get_task, lic_extra
from jaxrl_mt.tasks.actions import ActionsTask, reference_calls
from jaxrl_mt.tasks.calls import Call, render_python


@pytest.fixture(scope="module")
def records() -> dict[str, ShardedTask]:
    return {"code": load_source("humaneval:@:1")[0], "database": load_source("lic:@:database")[0],
            "actions": load_source("lic:@:actions")[0], "math": load_source("synthetic:1:0")[0]}


WRONG_CODE = "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"
CLARIFY = "Could you tell me what the threshold means?"


def replies(records) -> dict[str, tuple[str, str]]:
    """(correct reply, wrong reply) per non-math task, from the records' references."""
    code = records["code"]
    ref_sql = lic_extra(records["database"])["reference_sql"]
    # Dropping the HAVING filter returns every battle instead of those with more than 10 killed.
    wrong_sql = ref_sql.split(" HAVING ")[0]
    calls = reference_calls(lic_extra(records["actions"])["reference_answer"])
    perturbed = [Call(calls[0].name, {**calls[0].arguments, "radius": 7}), *calls[1:]]
    return {"code": (f"Here it is:\n```python\n{code.answer}\n```", WRONG_CODE),
            "database": (f"```sql\n{ref_sql}\n```", f"```sql\n{wrong_sql}\n```"),
            "actions": (render_python(calls), render_python(perturbed))}


def _runs(task: ShardedTask, kind: str = "sharded", n: int = 2) -> list[ConversationRun]:
    runs, skipped = plan_runs([task], [kind], n, system=lambda t: conversation_system(t, None))
    assert not skipped
    return runs


def _answer(runs, texts) -> None:
    for r, text in zip(runs, texts):
        r.turns.append(TurnRecord(index=len(r.turns), user=r.user_turns[len(r.turns)], assistant=text, tokens=[1],
                                  logprobs=[0.0], finish_reason="stop", prompt_tokens=10))


@pytest.mark.parametrize("domain, status_ok, status_bad", [("code", "passed", "failed"),
                                                           ("database", "correct", "wrong"),
                                                           ("actions", "correct", "wrong")])
def test_turn_scorer_scores_real_records(records, domain, status_ok, status_bad):
    task = records[domain]
    good, bad = replies(records)[domain]
    runs = _runs(task)
    out: list[dict] = []
    scorer = TurnScorer(runs, Judge(), protocol="lic", verifier_mode="strict", sink=out.extend)
    _answer(runs, [bad, good])
    scorer(runs)
    wrong, right = runs[0].turns[0].info, runs[1].turns[0].info
    assert (right["label"], right["answer_attempt"], right["correct"], right["correct_strict"],
            right["status"]) == ("answer_attempt", True, 1.0, 1.0, status_ok)
    assert (wrong["label"], wrong["answer_attempt"], wrong["correct"], wrong["correct_strict"],
            wrong["status"]) == ("answer_attempt", True, 0.0, 0.0, status_bad)
    assert wrong["reason"] and right["extracted"] and wrong["extracted"] != right["extracted"]
    # lic protocol: the correct answer ends its conversation, the wrong one goes on.
    assert (runs[1].done, runs[1].stop_reason, runs[0].done) == (True, "correct_answer", False)
    assert [r["conv_id"] for r in out] == [runs[1].conv_id]
    rec = out[0]
    assert (rec["domain"], rec["score"], rec["scored_turn"]) == (domain, 1.0, 1)
    assert rec["turns"][0]["status"] == status_ok and "task" not in rec
    # The task record (HumanEval tests, schema, specs) stays out of the transcript line.
    line = json.dumps(rec)
    assert len(line) < 2 * len(good) + 2 * len(task.full_prompt) + 1500
    assert "def check(" not in line and "CREATE TABLE" not in line


def test_answer_attempt_comes_from_the_task_with_the_rule_judge(records):
    code = records["code"]
    plug = get_task("code")
    info = task_turn(CLARIFY, code, plug, "clarification", llm_label=False)
    assert (info["label"], info["answer_attempt"], info["status"], info["correct"]) == (
        "clarification", False, "rejected", 0.0)
    # A reply the rule judge calls an answer but the task finds nothing to run in.
    info = task_turn("The function returns True when two numbers are close.", code, plug, "answer_attempt",
                     llm_label=False)
    assert (info["label"], info["answer_attempt"], info["extracted"]) == ("discussion", False, None)
    # An LLM judge's label decides the attempt; the verifier still scores the reply.
    good = replies(records)["code"][0]
    info = task_turn(good, code, plug, "clarification", llm_label=True)
    assert (info["label"], info["answer_attempt"], info["correct"], info["status"]) == (
        "clarification", False, 1.0, "passed")


def test_mixed_batch_keeps_math_on_the_numeric_verifier(records):
    runs = _runs(records["math"], "full", 1) + _runs(records["code"], "full", 1)
    assert runs[0].system is None and runs[1].system == get_task("code").system_prompt
    gold = records["math"].answer
    _answer(runs, [f"The answer is {gold}.", replies(records)["code"][0]])
    TurnScorer(runs, Judge(), protocol="lic", verifier_mode="strict")(runs)
    m, c = runs[0].turns[0].info, runs[1].turns[0].info
    assert set(m) == {"label", "answer_attempt", "extracted", "correct", "correct_strict"}
    assert (m["extracted"], m["correct"]) == (gold, 1.0)
    assert (c["status"], c["correct"]) == ("passed", 1.0)


def test_system_prompts_carry_schema_and_specs(records):
    db, act = records["database"], records["actions"]
    assert "CREATE TABLE" in conversation_system(db, None)
    assert lic_extra(act)["function"][0]["name"] in conversation_system(act, None)
    assert conversation_system(db, "Be brief.") == "Be brief."
    assert conversation_system(records["math"], None) is None


def test_score_task_turns_pool_matches_serial(records):
    tasks, texts = [], []
    for d, (good, bad) in replies(records).items():
        tasks += [records[d], records[d]]
        texts += [good, bad]
    labels = ["answer_attempt"] * len(texts)
    serial = score_task_turns(texts, tasks, labels, llm_label=False, workers=1)
    pooled = score_task_turns(texts, tasks, labels, llm_label=False, workers=4)
    assert [i["correct"] for i in serial] == [1.0, 0.0] * 3
    assert [{k: v for k, v in i.items() if k != "reason"} for i in pooled] == \
           [{k: v for k, v in i.items() if k != "reason"} for i in serial]
    with pytest.raises(ValueError, match="is a math task"):
        score_task_turns(["4"], [records["math"]], ["answer_attempt"], llm_label=False)
    with pytest.raises(ValueError, match=r"expected the task record \(ConversationRun.meta\['task'\]"):
        score_task_turns(["x"], [None], ["answer_attempt"], llm_label=False)
    with pytest.raises(ValueError, match="2 texts, 1 tasks"):
        score_task_turns(["a", "b"], [records["code"]], ["x"], llm_label=False)


def test_transcript_record_of_a_code_conversation(records):
    runs = _runs(records["code"], "sharded", 1)
    run = runs[0]
    scorer = TurnScorer(runs, Judge(), protocol="lic", verifier_mode="strict")
    for text in (CLARIFY, WRONG_CODE):
        _answer(runs, [text])
        scorer(runs)
    rec = transcript_record(run, "lic")
    assert [t["status"] for t in rec["turns"]] == ["rejected", "failed"]
    assert [t["answer_attempt"] for t in rec["turns"]] == [False, True]
    assert (rec["score"], rec["scored_turn"], rec["first_answer_turn"]) == (0.0, 2, 2)
    assert "AssertionError" in rec["turns"][1]["reason"] or "test" in rec["turns"][1]["reason"]


class _BrittleActions(ActionsTask):
    """The real actions task, with a checker bug on one kind of reply (issue 32: a checker that
    raises must cost only its turn)."""

    def verify(self, reply, task):
        if "BOOM" in reply:
            raise RecursionError("maximum recursion depth exceeded\n  (a 70-line traceback)")
        return super().verify(reply, task)


@pytest.mark.parametrize("workers", [1, 4])
def test_a_checker_that_raises_gives_that_turn_an_error_verdict(records, workers, caplog):
    act = records["actions"]
    good, bad = replies(records)["actions"]
    texts = [good, "BOOM", bad, "[[" * 600]
    got = score_task_turns(texts, [act] * 4, ["answer_attempt"] * 4, llm_label=False,
                           plugins={"actions": _BrittleActions()}, workers=workers)
    assert [g["status"] for g in got] == ["correct", "checker_error", "wrong", "no_answer"]
    assert [g["correct"] for g in got] == [1.0, 0.0, 0.0, 0.0]
    err = got[1]
    assert (err["label"], err["answer_attempt"], err["extracted"]) == ("discussion", False, None)
    assert err["reason"] == "the checker raised RecursionError: maximum recursion depth exceeded (a 70-line traceback)"
    assert any("checker raised" in r.getMessage() and act.task_id in r.getMessage() for r in caplog.records)
    llm = score_task_turns(["BOOM"], [act], ["answer_attempt"], llm_label=True, plugins={"actions": _BrittleActions()})
    assert (llm[0]["label"], llm[0]["answer_attempt"], llm[0]["status"]) == ("answer_attempt", True, "checker_error")
