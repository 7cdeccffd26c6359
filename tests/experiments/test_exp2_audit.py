"""The audit's numbers of the first comparison (issue 56): shortcut rules and RLAAR's training reward."""

from __future__ import annotations

import json

from experiments import exp2_audit as E


def test_rule_answers():
    prompt = "A garden has 6 roses. For a bouquet, 5 of the roses are picked. How many roses are left?"
    assert E.rule_answers(prompt) == {"add": 11.0, "last": 5.0, "first": 6.0, "largest": 6.0}
    assert E.rule_answers("How many roses are left?") == dict.fromkeys(E.RULES)


def test_shortcut_scores_on_two_problems():
    problems = [
        {"task_id": "a", "full_prompt": "Tom has 3 apples. He buys 4 more. How many?", "answer": "7"},
        {"task_id": "b", "full_prompt": "Tom has 9 apples. He eats 4. How many?", "answer": "5"},
    ]
    sc = E.shortcut_scores(problems, {"a": "He buys 4 more.", "b": "He eats 4. The answer is 5."})
    assert sc["add"] == {"a": 1.0, "b": 0.0}
    assert sc["last"] == {"a": 0.0, "b": 0.0} and sc["largest"] == {"a": 0.0, "b": 0.0}
    assert sc["echo_full"] == {"a": 0.0, "b": 0.0}
    assert sc["echo_mt_add"] == {"a": 0.0, "b": 1.0}


def test_add_every_number_on_the_committed_heldout_set():
    problems = [json.loads(x) for x in E.HELDOUT.read_text().splitlines() if x.strip()]
    add = E.shortcut_scores(problems, {})["add"]
    all_plus = {p["task_id"] for p in problems if set(p["metadata"]["synthetic_ops"]) == {"+"}}
    assert len(problems) == 320 and sum(add.values()) == len(all_plus) == 140  # 43.75% FULL
    assert {t for t, v in add.items() if v} == all_plus


def test_rlaar_never_rewarded_an_abstention_in_training():
    t = E.rlaar_training(E.REPORT / "runs" / "rlaar_full_s0" / "metrics.jsonl")
    assert t["steps"] == 36 and t["steps_with_unsolvable"] == 32
    assert t["steps_abstain_reward_above_0"] == t["steps_unsolvable_abstain_above_0"] == 0


def test_legacy_value_is_the_extractor_before_issue_56():
    stray = "11 + 4 = 15 cars.\n#### 1\nThe answer is 15."
    assert E.legacy_value(stray) == 1.0 and E.extract_answer(stray) == "15"
    assert E.legacy_value("The answer is 4.\n#### 5") == 5.0  # #### ranked first either way
    assert E.legacy_value("#### 1\n\\boxed{15}") == 15.0 and E.legacy_value("no marker, 3 then 4") == 4.0
    assert E.legacy_verify(stray, "1") == 1.0 and E.legacy_verify(stray, "15") == 0.0


def test_the_fix_moves_the_audited_reply_of_rlsta_full_s1():
    recs = E.load_records(E.REPORT / "models" / "rlsta_full_s1" / "greedy")
    r = next(r for r in recs if r["task_id"] == "family/heldout/1/0/91/parking" and r["kind"] == "full")
    reply = r["turns"][-1]["assistant"]
    assert (E.legacy_verify(reply, r["gold"]), E.verify(reply, r["gold"])) == (0.0, 1.0)
    old, new = E._legacy_kind_scores(recs)["full"], E.kind_scores(recs, "strict")["full"]
    assert round(100 * sum(old.values()) / 320, 1) == 11.9 and round(100 * sum(new.values()) / 320, 1) == 13.1
