"""Experiment 3's gates on the stage-0 model (experiments.exp3.decide), worked out by hand."""

from __future__ import annotations

from experiments.exp3 import CEILING, decide, markdown
from jaxrl_mt.data.loaders import load_source


def _rec(kind: str, t, reply: str, tokens: int, user: str | None = None) -> dict:
    return {"kind": kind, "task_id": t.task_id, "gold": t.answer,
            "turns": [{"user": user or t.full_prompt, "assistant": reply, "new_tokens": tokens,
                       "finish_reason": "stop"}]}


def _records(sharded_tokens: list[int]) -> tuple[list[dict], dict]:
    tasks = load_source("arith:train:4:1:0")  # one problem per operation
    right = [f"The answer is {t.answer}." for t in tasks]
    wrong = "The answer is 1000."
    recs = [_rec("full", t, right[i] if i < 3 else wrong, n) for i, (t, n) in enumerate(zip(tasks, (10, 70, 20, 30)))]
    recs += [_rec("sharded", t, right[i] if i == 0 else wrong, n, user=t.conditions[-1])
             for i, (t, n) in enumerate(zip(tasks, sharded_tokens))]
    recs += [_rec("mt_refine", t, wrong, 5) for t in tasks]
    return recs, {t.task_id: t for t in tasks}


def test_gates_and_budget_by_hand() -> None:
    recs, tasks = _records([10, 10, 10, 100])
    d = decide(recs, tasks)
    assert d["accuracy"]["full"]["mean"] == 0.75 and d["accuracy"]["sharded"]["mean"] == 0.25
    assert d["accuracy"]["mt_refine"]["mean"] == 0.0
    gap = d["full_minus_mt_add"]  # per problem FULL - MT-Add: 0, 1, 1, 0
    assert gap["diff"] == 0.5 and gap["lo"] == 0.0  # 4 problems: a resample of two zeros is likely
    assert d["threshold_met"] and not d["premise_met"]  # the gap is >= 10 points but its CI reaches 0
    plus = sum(t.meta["synthetic_ops"] == ("+",) for t in tasks.values())
    assert d["shortcuts"]["add"]["mean"] == plus / 4 == 0.25  # a one-step sum is "add every number"
    assert d["shortcuts"]["echo"]["mean"] == 0.0  # the last fact never holds the answer
    assert d["shortcuts"]["largest"]["mean"] == 0.0 and d["shortcuts_ok"]  # 25% <= 75% - 25%
    # FULL lengths 10, 70, 20, 30 reach 64 in 25%: 64 fails; MT-Add's 100 reaches 96 in 25%: 96 fails too
    assert d["cuts"]["full"]["cut_at"] == {"64": 0.25, "96": 0.0} and d["budget"] == CEILING
    assert "**not met**" in markdown(d, 4) and f"**{CEILING} tokens**" in markdown(d, 4)


def test_budget_is_the_smallest_that_cuts_at_most_five_percent() -> None:
    recs, tasks = _records([10, 10, 10, 90])
    assert decide(recs, tasks)["budget"] == 96  # FULL: 0% reach 96; MT-Add: 0% reach 96
