"""The asked quantity of a question and the values of a sentence (judge_rules_asked)."""

from __future__ import annotations

import pytest

from jaxrl_mt.rewards.judge_rules_asked import asked_quantity, fits_asked, main_value, terms, values


def test_asked_quantity_reads_the_asking_sentence():
    a = asked_quantity("Ava has 12 marbles. How many marbles does Ava have at the end of the first day?", None)
    assert a.unit == "marble" and not a.money and not a.total
    assert a.terms == {"marble", "ava", "end", "first", "day"}
    money = asked_quantity("She sells eggs for $2. How much in dollars does she make every day?", None)
    assert money.money and money.unit is None and money.rates == {"day"}
    total = asked_quantity("A robe takes 2 bolts. How many bolts in total does it take?", None)
    assert total.total and total.unit == "bolt"
    # No "?": the instruction is the asking sentence, "the total number of X" names the counted noun.
    calc = asked_quantity("She scores 21 points a game. Calculate the total number of points she has scored.", None)
    assert calc.unit == "point" and calc.total
    assert not asked_quantity(None, "Ava has 3.").known


def test_terms_drop_function_words_and_plurals():
    assert terms("How many glasses does Jonas's friend need?") == {"glasse", "jona", "friend"}


@pytest.mark.parametrize(
    "sentence, expected",
    [
        ("So, she has 3 * 39 = 108 marbles left after the initial 39 marbles.", [108, 39]),
        ("He earns 45 hours * $10 per hour = $450.", [450]),  # operands are not values
        ("Jonas has 90 -", []),  # cut off mid-expression
        ("A 5-year-old tree produces 50 fruits.", [50]),  # a compound modifier is not a value
        ("Selling 20, he keeps 135 - 20, or 115.", [20, 115]),
    ],
)
def test_values_skip_operands_and_modifiers(sentence, expected):
    assert [v.value for v in values(sentence)] == expected


def test_main_value_is_the_result_or_the_count_of_the_asked_noun():
    asked = asked_quantity("How many years will it take?", None)
    sentence = "It costs $3 a year, so it will take 3 years to earn $1.50 per year."
    assert main_value(sentence, values(sentence), asked).text == "3"
    s2 = "So, she has 3 * 39 = 108 marbles left after the initial 39 marbles."
    assert main_value(s2, values(s2), asked).value == 108


@pytest.mark.parametrize(
    "question, sentence, fits",
    [
        ("How many cups of feed does she need?", "She feeds 60 * 3 = 180 chickens.", False),  # another noun
        ("How many cups of feed does she need?", "She needs 24 cups of feed.", True),
        ("How many pencils does Liam have?", "So, Liam has 1 days of pencils.", True),  # "N X of <noun>"
        ("How much are her earnings for this week?", "Her rate is 1.2 * $100 = $120 per hour.", False),  # a rate
        ("How much does she make every day?", "She makes $18 per day.", True),  # the question's own rate
        ("How much does he pay?", "The total is 600 euros.", True),
        ("How much does he pay?", "He buys 16 glasses.", False),  # no money
        ("How many fruits does it produce?", "It produces 180 fewer fruits than the old tree.", False),  # relation
        ("How many more cards does Emma have than Ben?", "Emma has 5 more cards than Ben.", True),
    ],
)
def test_fits_asked(question, sentence, fits):
    asked = asked_quantity(question, None)
    found = values(sentence, asked.unit)
    assert fits_asked(sentence, main_value(sentence, found, asked), asked) is fits
