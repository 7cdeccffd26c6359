"""Hostile replies through the verifier and the judges that use it (issue 53, item 3).

Before the fix the lenient verifier's alternatives pattern ("12 or 14") was quadratic: on
``"1" * N + " 5"`` it took 5.6 s of CPU at N = 10,000 and 22 s at 20,000 (about 9 minutes at the
100,000-character cap), and so did every reward built on it (RLSTA's, ICPO's, RLAAR's and the
answer statistics). The linear pattern is checked against the old one on random text.
"""

from __future__ import annotations

import random
import re
import time

import pytest

from jaxrl_mt.rewards import alternatives
from jaxrl_mt.rewards.abstain import abstention_reward
from jaxrl_mt.rewards.answer_stats import answer_stats
from jaxrl_mt.rewards.icpo import icpo_reward
from jaxrl_mt.rewards.judge_rules import classify_rule_based, is_answer_attempt
from jaxrl_mt.rewards.verifier import (
    MAX_CHECKED_CHARS,
    extract_answer,
    extract_marked_answer,
    offers_several_candidates,
    verify,
)

N = MAX_CHECKED_CHARS  # the longest reply the verifier reads
QUESTION = "Jonas has 12 marbles and buys 5 more. How many marbles does he have?"

# name -> (reply of at most N characters, strict verdict, lenient verdict) against the gold 5
HOSTILE = {
    "ones then 5": ("1" * (N - 2) + " 5", 1.0, 1.0),
    "ones-and-commas then 5": ("1," * (N // 2 - 1) + " 5", 1.0, 1.0),
    "ones-and-commas": ("1," * (N // 2), 0.0, 0.0),
    "spaces then or 5": ("1" + " " * (N - 5) + "or 5", 1.0, 0.0),  # "1 or 5": two candidates
    "tabs and newlines": ("1" + "\t\n" * (N // 2 - 1) + "5", 1.0, 1.0),
    "spaces only": (" " * N, 0.0, 0.0),
    "huge integer then 5": ("9" * (N - 2) + " 5", 1.0, 1.0),  # 9...9 is not finite: not a number
    "huge integer answer": ("The answer is " + "9" * (N - 16) + " 5", 1.0, 1.0),
    "huge integer ####": ("#### " + "9" * (N - 7) + " 5", 1.0, 1.0),
    "huge boxed integer": ("5 \\boxed{" + "9" * (N - 10) + "}", 1.0, 1.0),
    "many alternatives": ("1 or " * (N // 5), 0.0, 0.0),
    "many descending ranges": ("9-8 " * (N // 4 - 1) + "5", 1.0, 1.0),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_reply_gets_a_verdict_in_under_a_second_of_cpu(name):
    reply, strict, lenient = HOSTILE[name]
    assert len(reply) <= N
    checks = {
        "extract_answer": lambda: extract_answer(reply),
        "extract_marked_answer": lambda: extract_marked_answer(reply),
        "strict": lambda: verify(reply, "5", "strict"),
        "lenient": lambda: verify(reply, "5", "lenient"),
        "offers_several_candidates": lambda: offers_several_candidates(reply),
        "judge_rules": lambda: classify_rule_based(reply, "math", question=QUESTION, user=QUESTION),
        "is_answer_attempt": lambda: is_answer_attempt(reply, "math", question=QUESTION),
        "rlaar": lambda: abstention_reward(reply, solvable=True, gold="5", mode="lenient"),
        "icpo": lambda: icpo_reward("complete", reply, "5", "answer_attempt", mode="lenient"),
        "answer_stats": lambda: answer_stats([reply], ["5"]),
    }
    results = {}
    for what, check in checks.items():
        t0 = time.thread_time()  # this thread's CPU time: a loaded host does not count
        results[what] = check()
        assert time.thread_time() - t0 < 1.0, what
    assert (results["strict"], results["lenient"]) == (strict, lenient)
    assert results["rlaar"] == results["icpo"] == lenient
    assert results["answer_stats"]["answer/lenient_acc"] == lenient


# The pattern before the fix, kept as the reference of its verdicts.
_OLD_NUM_WORD = r"[-\u2212]?\$?\d[\d,]*(?:\.\d+)?"
_OLD_ALTERNATIVES_RE = re.compile(
    _OLD_NUM_WORD + r"(?:\s+[A-Za-z$]+){0,2}\s*(?:,\s*)?\bor\b\s*" + _OLD_NUM_WORD, re.IGNORECASE
)
_OPERATORS = ("=", "+", "*", "/", "\u00d7", "\u00f7")


def _old_offers_range(sentence: str) -> bool:
    for m in alternatives._RANGE_RE.finditer(sentence):
        if sentence[: m.start()].rstrip()[-1:] in _OPERATORS:
            continue
        lo, hi = (m.group("lo"), m.group("hi")) if m.group("lo") else (m.group("blo"), m.group("bhi"))
        if float(lo.replace(",", "")) < float(hi.replace(",", "")):
            return True
    return False


_NOISE = ["1", "23", ",", ",,", ".", ".5", " ", "  ", "\t", "\n", "or", " Or ", "$", "-", "\u2212", "a ", "apples",
          "x", "1,000", "=", "+", "(", ")", "\u2013", "between ", " and ", "\u0663"]
_NUMBERS = ["1", "12", "1,000", ",5", "3.5", "0.", "12,34", "\u0663", "1.2.3"]
_JOINS = [" or ", "or ", " or", ", or ", " ,or ", " apples or ", " big red apples, or ", " $ or ", " \u017fx or ",
          "-", "\u2013", " - ", "--", " and ", " apples and ", "or", " for "]


def _random_text(rng: random.Random) -> str:
    """Noise, or two numbers joined as an alternative / a range might be, between noise."""
    def noise() -> str:
        return "".join(rng.choice(_NOISE) for _ in range(rng.randrange(0, 5)))

    def number() -> str:
        return rng.choice(["", "", "-", "$", "-$", "\u2212"]) + rng.choice(_NUMBERS)

    if rng.random() < 0.3:
        return noise() + noise() + noise()
    return noise() + rng.choice(["", "", "between ", "either "]) + number() + rng.choice(_JOINS) + number() + noise()


def test_alternatives_and_ranges_equal_the_old_scans_on_random_text():
    rng = random.Random(0)
    found = [0, 0]
    for _ in range(20000):
        text = _random_text(rng)
        old = _OLD_ALTERNATIVES_RE.search(text) is not None, _old_offers_range(text)
        assert (alternatives._ALTERNATIVES_RE.search(text) is not None, alternatives._offers_range(text)) == old, text
        found = [f + o for f, o in zip(found, old)]
    assert found[0] > 2000 and found[1] > 100, found  # the random texts reach both scans' matches


def test_offers_alternatives_examples():
    assert alternatives.offers_alternatives("She has 12 apples, or 14 apples")
    assert alternatives.offers_alternatives("either $1,000.50 or -$3")
    assert alternatives.offers_alternatives("It is 12,or 14")
    assert alternatives.offers_alternatives("a ,,5 or 6")
    assert alternatives.offers_alternatives("1 $or 5")  # "$" is a word of the pattern, as before
    assert not alternatives.offers_alternatives("12 for 14")
    assert not alternatives.offers_alternatives("12 or more")
    assert alternatives.final_sentence("First 12 or 14. So 14.\n\n") == "So 14."
    assert alternatives.final_sentence(" \n ") is None
