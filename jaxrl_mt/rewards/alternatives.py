"""Several candidate answers offered in a reply's final sentence (the lenient verifier's refusal).

Lenient mode accepts a reply when any of its last three numbers is the gold answer, so a reply
that lists candidates ("12 or 14", "either 12 or 14", a range "85-90" or "between 10 and 20")
would game it. ``offers_alternatives`` finds them in one sentence; ``final_sentence`` picks the
sentence the verifier reads.

Every scan here is linear in the text's length. The alternatives pattern starts a number only at
the start of its run of digits and commas, and takes the whole run (possessive quantifiers): the
former pattern tried every start inside a run and every length of it, which was quadratic
(``"1" * 20_000 + " 5"`` took 20 s). A match of the one pattern exists exactly when a match of
the other does: the word, comma or "or" that must follow a number can never follow a shorter
piece of its run (see ``tests/rewards/test_verifier_hostile.py``, which checks the two against
each other on random text).
"""

from __future__ import annotations

import re

__all__ = ["final_sentence", "offers_alternatives"]

_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+|\n+")  # a decimal point is followed by a digit, not a space
# "12 or 14", "12 apples, or 14 apples", "either $5 or $6": a number (the whole run of digits and
# commas it starts, from the run's first character), at most two words, an optional comma, "or",
# and the start of a second number (its sign, "$" and first digit: the rest cannot change a match).
_ALTERNATIVES_RE = re.compile(
    r"(?<![\d,]),*+\d[\d,]*+(?:\.\d++)?+(?:\s+[A-Za-z$]+){0,2}\s*(?:,\s*)?\bor\b\s*[-\u2212]?\$?\d",
    re.IGNORECASE,
)
# A range offered as the answer: "85-90" (no spaces, not inside an equation) or "between 10 and 20".
_RANGE_RE = re.compile(
    r"(?<![\d.,=+*/\u00d7\u00f7(\-\u2212])(?P<lo>\d[\d,]*(?:\.\d+)?)[-\u2013]\$?(?P<hi>\d[\d,]*(?:\.\d+)?)"
    r"(?![\d]|[.,]\d|\s*[=+*/\u00d7\u00f7)\-\u2212])"
    r"|\bbetween\s+\$?(?P<blo>\d[\d,]*(?:\.\d+)?)(?:\s+[A-Za-z]+)?\s+and\s+\$?(?P<bhi>\d[\d,]*(?:\.\d+)?)",
    re.IGNORECASE,
)
_OPERATORS = ("=", "+", "*", "/", "\u00d7", "\u00f7")


def final_sentence(text: str) -> str | None:
    """The last non-blank sentence of ``text`` (split after ``.!?`` + space, and at newlines), or None."""
    sentences = [x for x in _SENTENCE_END_RE.split(text.strip()) if x.strip()]
    return sentences[-1] if sentences else None


def _char_before(sentence: str, pos: int) -> str:
    """The last non-space character before ``pos`` ("" when there is none), without copying the prefix."""
    i = pos - 1
    while i >= 0 and sentence[i].isspace():
        i -= 1
    return sentence[i] if i >= 0 else ""


def _magnitude(text: str) -> float:
    return float(text.replace(",", ""))


def _offers_range(sentence: str) -> bool:
    """Whether a sentence offers a range of values ("85-90 beads", "between 10 and 20"), low < high."""
    for m in _RANGE_RE.finditer(sentence):
        if _char_before(sentence, m.start()) in _OPERATORS:
            continue  # a term of a computation ("x = 3-5")
        lo, hi = (m.group("lo"), m.group("hi")) if m.group("lo") else (m.group("blo"), m.group("bhi"))
        if _magnitude(lo) < _magnitude(hi):
            return True
    return False


def offers_alternatives(sentence: str) -> bool:
    """Whether one sentence offers alternatives ("12 or 14") or a range ("85-90", "between 10 and 20").

    Args:
      sentence: one sentence (``final_sentence`` of a reply).

    Returns:
      True when it lists two candidates joined by "or", or a range whose low end is below its high end
      (and which is not a term of a computation: "x = 3-5", "10-3 = 7").
    """
    return _ALTERNATIVES_RE.search(sentence) is not None or _offers_range(sentence)
