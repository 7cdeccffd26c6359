"""Tests of answer extraction and the strict / lenient verifiers (hand-written cases)."""

from __future__ import annotations

import numpy as np
import pytest

from jaxrl_mt.rewards.verifier import (
    extract_answer,
    extract_marked_answer,
    find_numbers,
    format_number,
    parse_number,
    verify,
    verify_batch,
    verify_both,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("42", 42.0),
        ("  42. ", 42.0),
        ("-3", -3.0),
        ("\u22123", -3.0),  # Unicode minus
        ("1,234", 1234.0),
        ("1,234,567.89", 1234567.89),
        ("$18", 18.0),
        ("\\$1,000", 1000.0),
        ("-$5", -5.0),
        ("$-5", -5.0),
        ("50%", 50.0),
        ("12.5\\%", 12.5),
        ("0.75", 0.75),
        (".5", 0.5),
        ("3/4", 0.75),
        ("\\frac{3}{4}", 0.75),
        ("\\dfrac{1}{8}", 0.125),
        ("-\\frac{1}{2}", -0.5),
        ("$\\frac{3}{4}$", 0.75),
        ("\\(7\\)", 7.0),
        (7, 7.0),
        (2.5, 2.5),
    ],
)
def test_parse_number_accepts(text, expected):
    assert parse_number(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "text",
    ["", "abc", "5 apples", "1/0", "\\frac{1}{0}", "1, 2", "3-4", None, True, float("nan")],
)
def test_parse_number_rejects(text):
    assert parse_number(text) is None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("10-3=7", [10, 3, 7]),  # a minus glued to a digit is subtraction
        ("x = -3 and y=-4", [-3, -4]),
        ("1,234,567 and 1,2345", [1234567, 1, 2345]),  # "1,2345" is not thousands-separated
        ("lists 1,2,3", [1, 2, 3]),
        ("3/4 cup and 12/25/2023", [0.75, 12]),  # a date keeps only its first part
        ("CO2 and x2 hold no numbers", []),
        ("Pay $1,000.50 or 5% more.", [1000.5, 5]),
        ("\\frac{ 3 }{ 4 } of 8", [0.75, 8]),
    ],
)
def test_find_numbers(text, expected):
    assert find_numbers(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    "value, expected",
    [(42.0, "42"), (-3.0, "-3"), (-0.0, "0"), (0.75, "0.75"), (1e20, "100000000000000000000"),
     (1 / 3, "0.3333333333333333")],
)
def test_format_number(value, expected):
    assert format_number(value) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        # \boxed wins over everything, the last one counts, nested braces are handled.
        ("The answer is 5. \\boxed{7}", "7"),
        ("\\boxed{3} then \\boxed{4}", "4"),
        ("So \\boxed{\\frac{3}{4}} cup.", "0.75"),
        ("\\boxed{x = \\frac{1}{2}}", "0.5"),
        ("\\boxed{1,000} dollars; #### 5", "1000"),
        ("\\boxed{\\text{none}} so the answer is 9", "9"),  # numberless box: next priority
        # #### beats an earlier answer phrase and the last number.
        ("16 - 3 - 4 = 9, 9 * 2 = 18\n#### 18\nThanks, 99", "18"),
        ("#### $1,234.50", "1234.5"),
        ("The answer is 4.\n#### 5", "5"),
        # A final answer phrase beats an earlier stray #### line (issue 56).
        ("11 + 4 = 15 cars.\n#### 1\nThe answer is 15.", "15"),
        ("#### 1\nThe answer is below.\nThe answer is 15 cars, 15 in all.", "15"),
        ("\\boxed{7}\n#### 1\nThe answer is 15.", "7"),  # a box still outranks both
        ("#### 1\nSo the total is \\boxed{15}.", "15"),  # a final box over an earlier #### line
        ("The answer is 15.\n#### 7", "7"),  # the reverse order: the last marker wins
        ("#### 1\nThe answer is 15.\n#### 7", "7"),
        # Answer phrases: last occurrence, first number on its line, case-insensitive.
        ("The answer is 12. Check: 12 + 3 = 15", "12"),
        ("The answer is 3. Wait, no. The final answer is 4 apples, from 2+2.", "4"),
        ("Final Answer: $18.", "18"),
        ("**Final answer:** -7 degrees", "-7"),
        ("THE ANSWER IS 3/4", "0.75"),
        ("my answer = 64 cm", "64"),
        ("Before I answer: is it 5 per day? 6", "6"),  # "I answer" is a verb, not a marker
        ("The answer is below.\nShe has 8 left.", "8"),  # numberless phrase: next priority
        # Last number.
        ("She has 3 apples and buys 4 more, so 7 apples.", "7"),
        ("It costs \\$2.50 per item, 50% off gives 1.25", "1.25"),
        ("x = -12", "-12"),
        ("\\frac{5}{2} hours", "2.5"),
        ("No numbers at all.", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_marked_answer_ignores_bare_numbers():
    assert extract_marked_answer("She has 7 apples.") is None
    assert extract_marked_answer("So she has 7 apples.\n#### 7") == "7"
    assert extract_marked_answer("Answer:") is None


@pytest.mark.parametrize(
    "text, gold, strict, lenient",
    [
        # Both right.
        ("9 * 2 = 18\n#### 18", "18", 1.0, 1.0),
        ("The answer is $1,000.", "1000", 1.0, 1.0),
        ("\\boxed{\\frac{3}{4}}", "0.75", 1.0, 1.0),
        ("The answer is 0.75", "3/4", 1.0, 1.0),
        ("So 1/3 of the cake.", "\\frac{1}{3}", 1.0, 1.0),
        ("The answer is 18.0000001", "18", 1.0, 1.0),  # within 1e-6 relative
        # Both wrong.
        ("The answer is 17.", "18", 0.0, 0.0),
        ("I need more information.", "18", 0.0, 0.0),
        # Strict right, lenient wrong: the marked answer is not among the last three numbers.
        ("The answer is 12. I used 3 steps, 4 items and 5 boxes.", "12", 1.0, 0.0),
        # Lenient right, strict wrong: the marked answer is wrong, a later number is the gold.
        ("The answer is 5. Check: 5 + 2 = 7", "7", 0.0, 1.0),
        # Lenient right, strict wrong: within 1e-3 absolute but not 1e-6 relative.
        ("The answer is 0.3333", "1/3", 0.0, 1.0),
        ("That is 18.0005 dollars", "18", 0.0, 1.0),
        # Lenient right, strict wrong: the gold is the third-last number.
        ("She has 18 apples, then eats 2 and gives away 6.", "18", 0.0, 1.0),
        # Lenient wrong: the gold is the fourth-last number.
        ("She has 18 apples, then eats 2, gives away 6 and keeps 10.", "18", 0.0, 0.0),
        # Gold given as a GSM8K solution.
        ("#### 72", "48 + 24 = 72\n#### 72", 1.0, 1.0),
        # Negative and percent.
        ("The temperature dropped to -4 degrees.", "-4", 1.0, 1.0),
        ("The discount is 25%.", "25", 1.0, 1.0),
    ],
)
def test_verify_modes(text, gold, strict, lenient):
    assert verify(text, gold) == strict
    assert verify(text, gold, mode="strict") == strict
    assert verify(text, gold, mode="lenient") == lenient
    assert verify_both(text, gold) == {"strict": strict, "lenient": lenient}


def test_verify_rejects_unknown_mode():
    with pytest.raises(ValueError, match="'fuzzy'"):
        verify("42", "42", mode="fuzzy")
    with pytest.raises(ValueError, match="'fuzzy'"):
        verify_batch(["42"], ["42"], mode="fuzzy")


def test_verify_rejects_numberless_gold():
    with pytest.raises(ValueError, match="'seven'"):
        verify("7", "seven")


def test_verify_batch():
    texts = ["#### 18", "The answer is 5. Check: 5 + 2 = 7", "nothing", "\\boxed{3/4}"]
    golds = ["18", "7", "1", 0.75]
    strict = verify_batch(texts, golds, "strict")
    lenient = verify_batch(texts, golds, "lenient")
    assert strict.dtype == np.float32 and strict.shape == (4,)
    np.testing.assert_array_equal(strict, [1, 0, 0, 1])
    np.testing.assert_array_equal(lenient, [1, 1, 0, 1])
    with pytest.raises(ValueError, match="2 texts but 1 gold"):
        verify_batch(["1", "2"], ["1"])


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is 2024-18=2006", "2006"),  # an equation after the marker: its result
        ("The answer is 2024 - 18 = 2006 years.", "2006"),
        ("#### 3 * 4 = 12", "12"),
        ("The answer is 12. Check: 12 = 3 * 4", "12"),  # the equation is in a later sentence
        ("The answer is 12 because 3 + 4 = 7", "12"),  # words before the '=': not the marker's equation
        ("The answer is 3 * 4 = 12 apples, 12 in total", "12"),
        ("The answer is = 5", "5"),
        ("The answer is 2 + 2 = 4 = 4.0", "4"),  # chained: the last result
    ],
)
def test_marker_sentence_with_an_equation_reads_the_result(text, expected):
    assert extract_answer(text) == expected


def test_strict_reads_the_equation_result():
    assert verify("The answer is 2024-18=2006", "2006", "strict") == 1.0
    assert verify("The answer is 2024-18=2006", "2024", "strict") == 0.0


@pytest.mark.parametrize(
    "text, several",
    [
        ("The answer is 12.\n#### 14", True),  # markers disagree
        ("The answer is 12.\n#### 12", False),  # markers agree
        ("\\boxed{12} or maybe \\boxed{14}", True),
        ("She has 12 or 14 marbles.", True),  # alternatives in the final sentence
        ("It is either 12 or 14.", True),
        ("It could be 12 apples, or 14 apples.", True),
        ("First 12 or 14 were counted. So she has 14 marbles.", False),  # alternatives not final
        ("She has 42 - 10 = 32 marbles.", False),  # several numbers of one computation
        ("So the total is 12.", False),
        ("Jonas has approximately 85-90 beads.", True),  # a range offered as the answer
        ("It is between 10 and 20 apples.", True),
        ("The total is 1,000-2,000 dollars.", True),
        ("So it takes 3.5-4.5 hours.", True),
        ("So 10-3 = 7.", False),  # a subtraction, not a range
        ("It is (5-3)*2 = 4.", False),
        ("So x = 3-5", False),
        ("So 90-85 beads.", False),  # high before low: not a range
        ("The answer is 2024-18=2006", False),
    ],
)
def test_offers_several_candidates(text, several):
    from jaxrl_mt.rewards.verifier import offers_several_candidates

    assert offers_several_candidates(text) is several


def test_lenient_refuses_listed_candidates_strict_unchanged():
    # Listing candidates used to win lenient mode (the gold is among the last three numbers).
    assert verify("It is 30 or 31 or 32.", "31", "lenient") == 0.0
    assert verify("It is about 30-32.", "31", "lenient") == 0.0 and verify("It is about 30-32.", "32") == 1.0
    assert verify("The answer is 30.\n#### 31", "31", "lenient") == 0.0
    assert verify("She has 42 - 10 = 32 marbles.", "32", "lenient") == 1.0
    assert verify("The answer is 30.\n#### 31", "31", "strict") == 1.0  # #### outranks the phrase


def test_final_answer_phrase_outranks_an_earlier_hash_line():
    # rlsta_full_s1's greedy FULL reply to family/heldout/1/0/91/parking (docs/results/exp2), verbatim:
    # the strict verifier used to read the stray "#### 1" (issue 56).
    reply = ("If 4 more cars drive in, then the total number of cars in the parking lot is 11 + 4 = 15 cars."
             "\n#### 1\nThe answer is 15.\n\nThe answer is 15.")
    assert extract_answer(reply) == extract_marked_answer(reply) == "15"
    assert verify_both(reply, "15") == {"strict": 1.0, "lenient": 0.0}  # lenient: two markers disagree
    assert verify(reply, "1", "strict") == 0.0
