"""Patterns of committing (or not) to a value of the asked quantity, one test each (judge_rules_math).

The replies are shortened from the embedded model's own (tests/rewards/judge_real, tune_v2).
"""

from __future__ import annotations

import pytest

from jaxrl_mt.rewards.judge import classify_rule_based

FIRST_DAY = "Chloe starts with 8 cards. On the first day, Chloe finds 17 cards. " \
            "How many cards does Chloe have at the end of the first day?"
SECOND_DAY = "Jonas starts with 33 beads. On the first day, Jonas loses 3 beads. On the second day, Jonas's " \
             "number of beads becomes 2 times as large. How many beads does Jonas have at the end of the second day?"
EGGS = "Janet's ducks lay 16 eggs per day. She sells the remainder for $2 per egg. " \
       "How much in dollars does she make every day at the farmers' market?"
TREE = "A 5-year-old avocado tree produces 50 fruits, a 6-year-old one 3 times as many. " \
       "How many total fruits can an avocado tree produce during its 10 years of life?"
GLASSES = "One glass costs $5. Kylar wants to buy 16 glasses. How much does he need to pay for them?"


@pytest.mark.parametrize(
    "text, question, user, label",
    [
        # A value of another quantity than the asked one: eggs when dollars are asked; a rate.
        ("She sells 156 * 4 = 624 eggs per day.", EGGS, None, "discussion"),
        ("The number of eggs that can be produced per day is 16.", EGGS, "Janet's ducks lay 16 eggs per day.",
         "discussion"),
        # A part of the total, and a comparison, are not the total.
        ("At age 7, a 7-year-old avocado tree starts producing 7 * 5 = 35 fruits.", TREE, None, "discussion"),
        ("For an 8-year-old tree, it produces 200 - 10 = 180 fewer fruits than a 10-year-old tree.", TREE, None,
         "discussion"),
        # A range of another quantity (per year, not the total) is not hedging.
        ("In general, a mature avocado tree can produce around 100-150 fruits per year.", TREE, None, "discussion"),
        # An event, not the state asked for.
        ("Jonas loses 2 * 3 = 6 beads on the second day.", SECOND_DAY, None, "discussion"),
        # Cut off by the token budget: the fragment got to its value ...
        ("On the first day, he has 27 * 4 = 108 beads.\nThe total number of beads on the second day is 104 + 104 "
         "= 208", SECOND_DAY, None, "answer_attempt"),
        # ... or was still at work: mid-expression, opening the conclusion, after an unreached number.
        ("Jonas has 180 - 60 = 90 beads remaining.\nJonas has 90 - 2 = 90 beads left.\nJonas has 90 - ",
         SECOND_DAY, None, "discussion"),
        ("It costs $3 a year, so it will take 7 years for the tree to grow 7 lemons. So, the",
         "How many years will it take before he starts earning money?", None, "discussion"),
        # An explicit answer restating the question survives work on another day.
        ("So, Chloe has 8 + 17 = 25 cards at the end of the first day.\n\nNow, let's consider the second day. "
         "Chloe starts with 25 cards, and on the third day", FIRST_DAY, None, "answer_attempt"),
        # A value in a concluding clause.
        ("The tree costs $3 a year to water, so it will take 3 years for Carlos to earn $1.50 per year.",
         "Each year it grows 7 lemons. How many years will it take before he starts earning money?", None,
         "answer_attempt"),
        # A remark restating known values after the answer does not displace it; a degenerate loop
        # cut off is no new work.
        ("The total cost of 16 glasses is 16 * 5 = 80 euros. This is a simplified calculation, but we need to "
         "consider the current market rate of 5 euros.\n\nThe total cost of 16 glasses is", GLASSES, None,
         "answer_attempt"),
        # A committed value outranks a refusal phrase; a refusal without one is a refusal.
        ("We cannot split a card, so Chloe has 8 + 17 = 25 cards.", FIRST_DAY, None, "answer_attempt"),
        ("If 17 is not an integer, we cannot provide an exact answer.", FIRST_DAY, None, "refusal"),
        # T = 1 word salad that has left the task.
        ("Correct, that's the bosun's wife...yours. She helps you, your wife. Not my Calif. No abos.",
         FIRST_DAY, "Chloe starts with 8 cards.", "missing"),
    ],
)
def test_commitment_patterns(text, question, user, label):
    assert classify_rule_based(text, question=question, user=user) == label


def test_a_misread_step_stated_directly_still_commits():
    """Guidelines: a value for a misread question is an answer attempt, also when the reply ends on
    another day's value (round 3 dropped the "narrated other step" rule: it fired on 2 problems,
    once right in tuning and once wrong on heldout2)."""
    assert classify_rule_based("Ben has 2 beads left after the first day.", question=SECOND_DAY) == "answer_attempt"
    narrated = "Jonas starts with 33 beads.\nOn the first day, he has 33 - 3 = 30 beads."
    assert classify_rule_based(narrated, question=SECOND_DAY) == "answer_attempt"


@pytest.mark.parametrize(
    "text, question, label",
    [
        # Round 3: a declarative answer in the question's own verb, in any inflection.
        ("Felix will cover 10 miles.", "If Felix drives for 4 hours, how many miles will he cover?", "answer_attempt"),
        ("Marie ordered 20 boxes of pizza.", "How many boxes of pizza did Marie order?", "answer_attempt"),
        # ... but an event verb the question does not ask about stays an event.
        ("Marie paid $50 for the pizza and the meal.",
         "Marie paid a total of $50. How many boxes of pizza did Marie order?", "discussion"),
        # A reply that stops (no final period) on a value after a state verb and an adverb.
        ("The lettuce changed price.\n\nIan's new bill is now $1.25", "How much is his new bill now?",
         "answer_attempt"),
        # A contracted state ("It's") states the value.
        ("It's currently 22,200 shells.", "How many shells does Hiro have at the end of the first day?",
         "answer_attempt"),
        # A `label: value` line counts only when its label or unit names the asked quantity.
        ("Total: 20 books", "How many books does Emma have at the end of the second day?", "answer_attempt"),
        ("Fiesta de la Luna: 12\n\nThis is a special card that is only available for a limited time.",
         "How many cards does Diego have at the end of the first day?", "discussion"),
    ],
)
def test_round3_patterns(text, question, label):
    assert classify_rule_based(text, question=question) == label
