"""Pure analysis functions of transcript records: scores, paired bootstrap, LiC ratio, inertia, types."""

from __future__ import annotations

import math

import pytest

from experiments import analysis as A


def rec(task: str, kind: str, gold: str, replies: list[str], labels: list[str] | None = None, run: int = 0) -> dict:
    labels = labels or ["answer_attempt"] * len(replies)
    return {"conv_id": f"{task}|{kind}|{run}", "task_id": task, "kind": kind, "run": run, "gold": gold,
            "turns": [{"assistant": r, "label": lab, "answer_attempt": lab == "answer_attempt"}
                      for r, lab in zip(replies, labels)]}


def test_last_reply_scores_uses_the_last_reply_and_averages_runs() -> None:
    recs = [rec("a", "sharded", "5", ["5", "7"]), rec("a", "sharded", "5", ["7", "so 5"], run=1),
            rec("b", "sharded", "3", ["3"]), rec("b", "full", "3", ["1 2 3 4"])]
    assert A.last_reply_scores(recs, "sharded") == {"a": 0.5, "b": 1.0}
    assert A.last_reply_scores(recs, "full", "strict") == {"b": 0.0}
    assert A.last_reply_scores(recs, "full", "lenient") == {"b": 1.0}  # 3 is among the last three numbers
    assert A.last_reply_scores(recs, "sharded", keep=lambda t: t == "b") == {"b": 1.0}


def test_bootstrap_paired_and_ratio() -> None:
    a = {str(i): 0.0 for i in range(50)}
    b = {str(i): 1.0 if i < 30 else 0.0 for i in range(50)}
    p = A.bootstrap_paired(a, b, n_boot=500)
    assert p["n"] == 50 and math.isclose(p["diff"], 0.6) and p["excludes_zero"] and 0.4 < p["lo"] < 0.6 < p["hi"]
    same = A.bootstrap_paired(b, b, n_boot=200)
    assert same["diff"] == 0 and not same["excludes_zero"]
    # paired: only common problems count
    assert A.bootstrap_paired({"x": 0.0}, {"y": 1.0})["n"] == 0
    r = A.bootstrap_ratio({"1": 0.5, "2": 0.0}, {"1": 1.0, "2": 1.0}, n_boot=200)
    assert math.isclose(r["ratio"], 0.25) and r["lo"] <= 0.25 <= r["hi"]
    assert math.isnan(A.bootstrap_ratio({"1": 1.0}, {"1": 0.0})["ratio"])
    m = A.bootstrap_mean({"1": 1.0, "2": 0.0, "3": 1.0}, n_boot=100)
    assert math.isclose(m["mean"], 2 / 3) and m["n"] == 3 and 0 <= m["lo"] <= m["hi"] <= 1


def test_inertia_counts_repeats_of_an_earlier_wrong_number() -> None:
    recs = [
        rec("a", "sharded", "12", ["It is 7.", "Still 7.", "The answer is 7."]),  # repeats the wrong 7
        rec("b", "sharded", "12", ["It is 7.", "Now 12."]),  # corrects itself
        rec("c", "sharded", "12", ["It is 12.", "12"]),  # no earlier wrong answer: not eligible
        rec("d", "mt_refine", "12", ["It is 9.", "I am not sure."]),  # no final answer: not eligible
        rec("e", "mt_refine", "12", ["It is 9.", "It is 4."]),  # a new wrong number
    ]
    got = A.inertia(recs)
    assert (got["n_eligible"], got["n_repeat"]) == (3, 1)
    assert got["repeat_flags"] == [1, 0, 0]
    assert math.isclose(got["share"], 1 / 3) and math.isclose(got["last_correct_share"], 1 / 3)
    assert A.inertia(recs, ("mt_refine",))["n_eligible"] == 1


def test_response_types_first_answer_and_family() -> None:
    recs = [rec("family/heldout/1/0/3/jar", "sharded", "1", ["?", "1"], ["clarification", "answer_attempt"]),
            rec("gsm8k/test/2", "sharded", "1", ["hm", "x"], ["discussion", "discussion"])]
    assert A.response_types_per_turn(recs, "sharded") == {1: {"clarification": 1, "discussion": 1},
                                                          2: {"answer_attempt": 1, "discussion": 1}}
    assert A.first_answer_turns(recs, "sharded") == [2, None]
    assert A.family_of(recs[0]["task_id"]) == "heldout1" and A.family_of("gsm8k/test/2") == "gsm8k"


def _ended(r: dict, n: int | None, reason: str) -> dict:
    """`r` with its last turn's length and finish reason (none recorded when `n` is None)."""
    if n is not None:
        r["turns"][-1].update(new_tokens=n, finish_reason=reason)
    return r


def test_final_reply_lengths_per_task_from_the_last_turn() -> None:
    recs = [_ended(rec("a", "full", "5", ["x"]), 64, "length"),
            _ended(rec("a", "full", "5", ["y"], run=1), 10, "stop"),
            _ended(rec("b", "full", "3", ["1", "z"]), 20, "stop"),
            _ended(rec("c", "full", "3", ["q"]), None, ""),  # no length recorded: skipped
            _ended(rec("d", "sharded", "3", ["q"]), 64, "length")]
    recs[0]["turns"][-1]["user"] = "x or y?"  # its reply "x" only restates it
    recs[1]["turns"][-1]["user"] = "z"
    out = A.final_reply_lengths(recs, "full")
    assert out == {"tokens": {"a": 37.0, "b": 20.0}, "cut": {"a": 0.5, "b": 0.0}, "echo": {"a": 0.5, "b": 0.0}}
    assert A.final_reply_lengths(recs, "sharded") == {"tokens": {"d": 64.0}, "cut": {"d": 1.0}, "echo": {"d": 0.0}}


def test_restates_user_on_real_final_turns() -> None:
    """Final turns of the held-out evaluation (docs/results/rlsta_cpu, greedy): the merged-anchor
    run's replies that repeat the user's shard, and answers that reuse its words but add a value."""
    echo = [("Later, 5 more cars drive in.", "Later, 5 more cars drive in."),  # rlsta_merged
            ("The kids eat 2 cookies from the jar.", "The kids ate 2 cookies from the jar."),  # 6 of 7 words
            ("Sven wins 6 points in the next round.", "Sven wins 6 points in the next round.")]
    not_echo = [("How many roses are in the garden at the end?",  # rlsta_merged, turn 1: 8 of 10 words, but
                 "There are 100 roses in the garden at the end."),  # it states a number the user did not
                ("What is Sven's final score?", "Sven's final score is 100."),
                ("Later, 5 more cars drive in.",  # rlsta_exp
                 "If 5 more cars drive in, then the total number of cars in the parking lot will be 90 cars (the "
                 "original number of cars) + 5 more cars (the new number of cars) = 105 cars."),
                ("2 people leave during the break.", "Two people left during the break."),  # 4 of 6: missed
                ("Later, 5 more cars drive in.", "")]
    assert all(A.restates_user(u, r) for u, r in echo)
    assert not any(A.restates_user(u, r) for u, r in not_echo)
    assert A.restates_user("2 people leave during the break.", "Two people left during the break.", share=0.6)


def test_uncut_scores_keep_the_conversations_the_budget_did_not_cut() -> None:
    recs = [_ended(rec("a", "full", "5", ["5"]), 3, "stop"),  # uncut, right
            _ended(rec("a", "full", "5", ["5"], run=1), 64, "length"),  # cut: left out although right
            _ended(rec("b", "full", "4", ["1 2 4 3"]), 9, "stop"),  # uncut: wrong (strict), right (lenient)
            _ended(rec("c", "full", "7", ["7"]), 64, "length"),  # every run cut: c is absent
            _ended(rec("d", "full", "7", ["7"]), None, ""),  # no length recorded: skipped, as by the cut share
            _ended(rec("e", "sharded", "7", ["7"]), 5, "stop")]
    assert A.uncut_scores(recs, "full") == {"a": 1.0, "b": 0.0}
    assert A.uncut_scores(recs, "full", "lenient") == {"a": 1.0, "b": 1.0}
    assert A.uncut_scores(recs, "sharded") == {"e": 1.0}
    cut = A.final_reply_lengths(recs, "full")["cut"]
    assert cut == {"a": 0.5, "b": 0.0, "c": 1.0}  # the uncut tasks are those not always cut
    assert {t for t, v in cut.items() if v < 1} == set(A.uncut_scores(recs, "full"))


def test_pass_at_k_and_pass_hat_k_unbiased_estimators() -> None:
    assert math.isclose(A.pass_at_k(4, 2, 2), 5 / 6) and math.isclose(A.pass_hat_k(4, 2, 2), 1 / 6)
    assert A.pass_at_k(4, 2, 1) == A.pass_hat_k(4, 2, 1) == 0.5  # k = 1: both are the accuracy c / n
    assert A.pass_at_k(4, 3, 2) == 1.0 and math.isclose(A.pass_hat_k(4, 3, 2), 3 / 6)  # C(1, 2) = 0; C(3, 2) = 3
    assert A.pass_at_k(4, 0, 4) == 0.0 and A.pass_at_k(4, 1, 4) == 1.0
    assert A.pass_hat_k(4, 4, 4) == 1.0 and A.pass_hat_k(4, 3, 4) == 0.0


def test_pass_k_scores_count_right_last_replies_per_problem() -> None:
    recs = [rec("a", "full", "5", [r], run=i) for i, r in enumerate(["5", "so 5", "7", "It is 6."])]  # 2 of 4
    recs += [rec("b", "full", "3", ["3"]), rec("b", "full", "3", ["9"], run=1),  # 1 of 2
             rec("c", "sharded", "3", ["3"])]
    got = A.pass_k_scores(recs, "full")
    assert sorted(got["pass@k"]) == sorted(got["pass^k"]) == [1, 2, 3, 4]
    assert got["pass@k"][1] == got["pass^k"][1] == {"a": 0.5, "b": 0.5} == A.last_reply_scores(recs, "full")
    assert got["pass@k"][2] == pytest.approx({"a": 5 / 6, "b": 1.0})
    assert got["pass^k"][2] == pytest.approx({"a": 1 / 6, "b": 0.0})
    assert got["pass@k"][3] == {"a": 1.0} and got["pass^k"][3] == {"a": 0.0}  # b has 2 runs: absent at k > 2
    assert got["pass@k"][4] == {"a": 1.0} and got["pass^k"][4] == {"a": 0.0}
    assert A.pass_k_scores(recs, "sharded") == {"pass@k": {1: {"c": 1.0}}, "pass^k": {1: {"c": 1.0}}}
    assert A.pass_k_scores(recs, "mt_refine") == {"pass@k": {}, "pass^k": {}}


def test_early_turn_shares_count_the_turns_before_the_last_per_problem() -> None:
    recs = [
        # p0 run 0: of 3 early turns, a clarification and a hedge are non-answers, one answer attempt
        rec("p0", "sharded", "5", ["?", "if a then 5", "5", "The answer is 5."],
            ["clarification", "hedging", "answer_attempt", "answer_attempt"]),
        # p0 run 1: 1 early turn, missing (neither a non-answer nor an answer attempt)
        rec("p0", "sharded", "5", ["", "The answer is 5."], ["missing", "answer_attempt"], run=1),
        rec("p1", "sharded", "5", ["Hmm.", "The answer is 5."], ["discussion", "refusal"]),  # last turn not counted
        rec("p2", "sharded", "5", ["The answer is 5."], ["clarification"]),  # one turn: skipped
        rec("p1", "full", "5", ["?", "x"], ["clarification", "clarification"]),  # another kind
    ]
    out = A.early_turn_shares(recs, "sharded")
    assert out["non_answer"] == pytest.approx({"p0": (2 / 3 + 0) / 2, "p1": 1.0})
    assert out["answer"] == pytest.approx({"p0": (1 / 3 + 0) / 2, "p1": 0.0})
