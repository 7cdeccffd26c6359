"""experiments.exp3_analysis: the two echo rules, the per-operation breakdown and RLAAR's training shares on
records whose values are worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments import exp3_analysis as E


def _rec(task: str, kind: str, gold: str, user: str, reply: str) -> dict:
    return {"task_id": task, "kind": kind, "gold": gold, "run": 0,
            "turns": [{"user": user, "assistant": reply, "new_tokens": 8, "finish_reason": "stop"}]}


PROBLEMS = [
    {"task_id": "a", "answer": "21", "full_prompt": "There are 3 boxes of 7 pens. How many pens?",
     "metadata": {"synthetic_ops": ["*"]}},
    {"task_id": "b", "answer": "9", "full_prompt": "14 cars park. 5 leave. How many cars are left?",
     "metadata": {"synthetic_ops": ["-"]}},
    {"task_id": "c", "answer": "19", "full_prompt": "12 tulips, then 7 more. How many tulips?",
     "metadata": {"synthetic_ops": ["+"]}},
]


def test_answer_echo_reads_the_strict_answer_against_the_message_s_numbers() -> None:
    assert E.answer_echo("Then 5 cars leave.", "The answer is 5.")
    assert not E.answer_echo("Then 5 cars leave.", "14 - 5 = 9. The answer is 9.")
    assert E.answer_echo("Then 5 cars leave.", "Then 5 cars leave.")  # no marker: the strict reading's last number
    assert not E.answer_echo("Then 5 cars leave.", "I am not sure.")  # no answer at all
    assert E.answer_echo("Then 2.5 kg more.", "The answer is 2.5.") and not E.answer_echo("Then 25 more.", "It is 2.5")


def test_breakdown_groups_problems_by_operation_and_step_count() -> None:
    recs = {"m": [_rec("a", "full", "21", "q", "The answer is 21."), _rec("b", "full", "9", "q", "The answer is 8."),
                  _rec("c", "full", "19", "q", "The answer is 19.")]}
    b = E.breakdown(recs, PROBLEMS)["m"]
    assert set(b) == {"op *", "op -", "op +", "steps 1"}
    assert (b["op *"]["full"]["mean"], b["op -"]["full"]["mean"], b["op +"]["full"]["mean"]) == (1.0, 0.0, 1.0)
    assert b["steps 1"]["full"]["mean"] == 2 / 3 and b["steps 1"]["full"]["n"] == 3


def test_echo_rates_and_their_paired_differences() -> None:
    base = [_rec("a", "sharded", "21", "Each box has 7 pens.", "Each box has 7 pens."),  # restates, answer 7
            _rec("b", "sharded", "9", "Then 5 leave.", "14 - 5 = 9. The answer is 9."),  # neither
            _rec("c", "sharded", "19", "Then 7 more.", "The answer is 19.")]  # neither
    arm = [_rec("a", "sharded", "21", "Each box has 7 pens.", "3 * 7 = 21. The answer is 21."),
           _rec("b", "sharded", "9", "Then 5 leave.", "The answer is 5."),  # answer echo, not a restatement
           _rec("c", "sharded", "19", "Then 7 more.", "The answer is 19.")]
    e = E.echo_rates({"base": base, "arm": arm})
    assert e["base"]["sharded"]["restates"]["rate"]["mean"] == 1 / 3
    assert e["base"]["sharded"]["answer"]["rate"]["mean"] == 1 / 3  # "Each box has 7 pens." answers 7
    assert e["arm"]["sharded"]["restates"]["rate"]["mean"] == 0.0
    assert e["arm"]["sharded"]["answer"]["rate"]["mean"] == 1 / 3
    assert e["arm"]["sharded"]["restates"]["minus base"]["diff"] == pytest.approx(-1 / 3)
    assert e["arm"]["sharded"]["answer"]["minus base"]["diff"] == 0.0
    assert "minus base" not in e["base"]["sharded"]["answer"] and "mt_refine" in e["arm"]


def test_shortcut_rows_and_rlaar_training(tmp_path: Path) -> None:
    base = [_rec("b", "sharded", "9", "5 leave.", "x")]
    s = E.shortcuts(PROBLEMS, base)
    assert s["add"]["mean"] == 1 / 3 and s["largest"]["mean"] == 0.0  # c: 12 + 7 = 19; a: 10, 7; b: 19, 14
    assert s["last"]["mean"] == 0.0 and s["echo_mt_add"]["n"] == 1
    m = tmp_path / "metrics.jsonl"
    rows = [{"kind": "train", "curriculum/unsolvable_frac": 0.0},
            {"kind": "train", "curriculum/unsolvable_frac": 0.5, "reward/unsolvable_abstain": 0.0},
            {"kind": "train", "curriculum/unsolvable_frac": 0.5, "reward/unsolvable_abstain": 0.25},
            {"kind": "eval", "reward/unsolvable_abstain": 1.0}]
    m.write_text("\n".join(map(json.dumps, rows)) + "\n")
    r = E.rlaar_training(m)
    assert (r["steps"], r["steps_with_unsolvable"], r["steps_unsolvable_abstain_above_0"]) == (3, 2, 1)
    assert r["mean_unsolvable_abstain"] == 0.25 / 3 and r["mean_unsolvable_frac"] == 1 / 3
