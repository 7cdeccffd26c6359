"""Reward-honesty statistics: distinct numbers on the final line, strict vs lenient."""

from __future__ import annotations

import math

import pytest

from jaxrl_mt.rewards.answer_stats import answer_stats, distinct_numbers_final_line, final_line


def test_final_line_and_distinct_numbers() -> None:
    assert final_line("a\n\n  b 1  \n\n") == "b 1"
    assert final_line("") == ""
    assert distinct_numbers_final_line("3 + 4 = 7\nIt is 7, or 8, or 7.") == 2
    assert distinct_numbers_final_line("The answer is 1,000 or 1000.") == 1
    assert distinct_numbers_final_line("no numbers") == 0


def test_answer_stats_exposes_gaming_by_listing_numbers() -> None:
    honest = answer_stats(["So the answer is 12."] * 4, ["12"] * 4)
    gamed = answer_stats(["Maybe 11, 12 or 13."] * 4, ["12"] * 4)
    assert honest["answer/distinct_numbers_final_line"] == 1 and honest["answer/lenient_minus_strict"] == 0
    assert gamed["answer/distinct_numbers_final_line"] == 3 and gamed["answer/multi_number_final_line_frac"] == 1
    # The lenient verifier refuses a reply that lists candidates ("11, 12 or 13"), so listing no longer pays.
    assert gamed["answer/strict_acc"] == 0 and gamed["answer/lenient_acc"] == 0
    assert gamed["answer/lenient_minus_strict"] == 0
    # Lenient still credits the gold among the last three numbers when no alternatives are offered.
    loose = answer_stats(["She has 18 apples, then eats 2 and gives away 6."] * 2, ["18"] * 2)
    assert loose["answer/strict_acc"] == 0 and loose["answer/lenient_acc"] == 1
    assert math.isclose(loose["answer/lenient_minus_strict"], 1.0)
    assert answer_stats([], []) == {}
    with pytest.raises(ValueError, match="2 texts but 1"):
        answer_stats(["a", "b"], ["1"])
