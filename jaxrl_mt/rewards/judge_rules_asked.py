"""The asked quantity of a math question, and the values a reply states (for the rule-based judge).

``judge_rules_math`` decides whether a reply's conclusion commits to a value; this module gives
it what it reads: which quantity the question asks for (:class:`Asked`: its counted noun, whether
it is money, a total, a rate, a difference) and the values of a sentence (:class:`Value`: a
number that is not an operand of an unevaluated expression nor part of a compound modifier such
as "a 5-year-old tree"), with :func:`fits_asked`, whether a value is one of the asked quantity.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jaxrl_mt.rewards.verifier import find_numbers

__all__ = ["Asked", "Value", "asked_quantity", "counted_nouns", "fits_asked", "is_question", "main_value", "sentences",
           "stem", "talks_about", "terms", "values"]

SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+|\n+")
WORD_RE = re.compile(r"[\w']+")

_STOPWORDS = frozenset("""
a an the of in on at to for from by with and or but is are was were be been do does did has have
had how many much what which who whom whose when where why will would can could should shall may
might it its he she they them their his her him i you we our your this that these those there
then than now left after before each every all total number amount more less need needs
""".split())

# The question's asking sentence: ends with "?", or (an instruction) names the work to do.
_ASK_CUE_RE = re.compile(r"\b(?:how\s+(?:many|much|far|long|old|fast)|what\s+(?:is|was|are|were|will)|calculate"
                         r"|find|determine|compute|work\s+out)\b", re.IGNORECASE)
_COUNTED_RE = re.compile(  # the counted noun: "How many (more) X", "the (total) number of X"
    r"\bhow\s+many\s+(?:(?:more|fewer|less|total|extra|additional|different)\s+)?([a-z]+)"
    r"|\bnumber\s+of\s+([a-z]+)", re.IGNORECASE)
_AUX = frozenset("do does did is are was were will would can could has have had should".split())
_MONEY_ASK_RE = re.compile(  # the question asks for an amount of money
    r"\b(?:dollars?|money|cost|costs|spend|spent|pay|paid|earn|earns|earned|earnings|profit|price|worth|"
    r"salary|wage|wages|income|revenue|savings|charge|charged)\b|[$\u00a3\u20ac]", re.IGNORECASE)
_TOTAL_RE = re.compile(  # a total, or a sum over several parts
    r"\b(?:total|in\s+all|altogether|together|combined|overall|sum|everything|whole)\b", re.IGNORECASE)
_COMPARE_ASK_RE = re.compile(r"\b(?:more|less|fewer|difference|than|times)\b", re.IGNORECASE)
_TIME_UNITS = "second|minute|hour|day|night|week|month|year"
_RATE_RE = re.compile(  # "per X", "each X", "every X", "a week": the denominator of a rate
    r"\b(?:per|each|every)\s+([a-z]+)|\ban?\s+(" + _TIME_UNITS + r")\b", re.IGNORECASE)

# A number token, with a currency sign and a percent sign when written ("$1,500", "12.5%", "1/2").
_TOKEN_RE = re.compile(r"(?<![A-Za-z\d/.,])[$\u00a3\u20ac]?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+(?![\d/]))?(?:\s?%)?")
_OP_BEFORE_RE = re.compile(r"(?:[*/+\u00d7\u00f7^]|\s[-\u2212]|\b(?:x|times|plus|minus|by))\s*$", re.IGNORECASE)
_OP_AFTER_RE = re.compile(  # "3 * 4", "45 hours * $10", "48 - 2", "3 times 4"
    r"^\s*(?:[A-Za-z]+\s*)?(?:[*/+\u00d7\u00f7^]|[-\u2212](?:\s|$)|\b(?:x|plus|minus|divided|multiplied)\b"
    r"|\btimes\s+[$\d])", re.IGNORECASE)
_RESULT_BEFORE_RE = re.compile(  # the value is the result of a computation: "= 31", "gives 9", "which is 12"
    r"(?:=|\bgives?|\bgiving|\bequals?|\bwhich\s+is|\bwe\s+get|\bto\s+get|\bresults?\s+in|\bcomes?\s+to"
    r"|\d\s*,\s*or)\s*$",  # "135 - 20, or 115"
    re.IGNORECASE)
_RELATION_AFTER_RE = re.compile(  # "12 more cards", "200 fruits fewer than", "3 times as many": a change or
    r"^\s*(?:[A-Za-z-]+\s+)?(?:more|less|fewer|times|extra|additional)\b", re.IGNORECASE)  # a comparison
_PER_AFTER_RE = re.compile(  # "$120 per hour", "40 beads a day": a rate
    r"^\s*(?:[A-Za-z-]+\s+){0,2}?(?:per|each|every)\s+([a-z]+)|^\s*(?:[A-Za-z-]+\s+)?an?\s+(" + _TIME_UNITS + r")s?\b",
    re.IGNORECASE)
_MONEY_AFTER_RE = re.compile(r"^\s*(?:dollars?|cents?|bucks?|usd|euros?|pounds?)\b", re.IGNORECASE)
_MONEY_TALK_RE = re.compile(r"[$\u00a3\u20ac]|\b(?:dollars?|cents?|euros?|cost|costs|price|pay|paid|spend|spent|"
                            r"earn\w*|profit|money)\b", re.IGNORECASE)
_MONEY_UNITS = frozenset({"dollar", "cent", "euro", "pound", "buck"})  # "How many dollars ...?" asks money
_BARE_AFTER_RE = re.compile(r"^\s*(?:[.,;:!?]|$)")  # the value stands alone: "She has 17."


def sentences(text: str) -> list[str]:
    """The sentences (and lines) of ``text``, stripped."""
    return [s.strip() for s in SENTENCE_SPLIT_RE.split(text) if s and s.strip()]


def is_question(sentence: str) -> bool:
    """Whether a sentence ends with a question mark."""
    return sentence.rstrip(" *_\"')").endswith("?")


def _base(word: str) -> str:
    """A word lower-cased, without a possessive ``'s`` or a trailing apostrophe."""
    w = word.lower()
    return w[:-2] if w.endswith(("'s", "\u2019s")) else w.rstrip("'\u2019")


def stem(word: str) -> str:
    """A word lower-cased, without a possessive ``'s`` or a plural ``s``."""
    w = _base(word)
    return w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w


def terms(text: str) -> set[str]:
    """Content words of ``text``: stems of the words that are not numbers or function words."""
    return {stem(w) for w in WORD_RE.findall(text) if not w[0].isdigit() and _base(w) not in _STOPWORDS}


def talks_about(sentence: str, asked: Asked) -> bool:
    """Whether a sentence talks about the asked quantity: it shares a content word with the
    asking sentence, names the counted noun, or (money asked) talks money."""
    words = terms(sentence)
    return bool(asked.terms and asked.terms & words) or (asked.unit is not None and asked.unit in words) \
        or (asked.money and bool(_MONEY_TALK_RE.search(sentence)))


@dataclass(frozen=True)
class Asked:
    """What the judge knows of the conversation besides the reply (all optional)."""

    terms: frozenset[str] | None = None  # content words of the question's asking sentence
    unit: str | None = None  # the counted noun ("How many X", "the number of X")
    money: bool = False  # the asked quantity is an amount of money
    total: bool = False  # the asked quantity is a total ("in total", "together", "altogether")
    rates: frozenset[str] = frozenset()  # denominators the question itself uses ("every day", "a week")
    compare: bool = False  # the question asks for a difference or a ratio ("how many more")
    words: frozenset[str] = frozenset()  # stems of every word of the asking sentence
    user: frozenset[str] | None = None  # words of the user message this reply answers
    given: frozenset[float] | None = None  # numbers of the question and the user message

    @property
    def known(self) -> bool:
        """Whether the question's asking sentence is known."""
        return self.terms is not None


def _asking_sentence(question: str) -> str | None:
    """The question's last sentence ending with "?", else its last instruction ("calculate ...")."""
    parts = [x.strip() for x in SENTENCE_SPLIT_RE.split(question) if x.strip()]
    asks = [x for x in parts if x.endswith("?")] or [x for x in parts if _ASK_CUE_RE.search(x)]
    return asks[-1] if asks else None


def asked_quantity(question: str | None, user: str | None) -> Asked:
    """What the question asks for, from its asking sentence (the last question, or instruction)."""
    statements = " ".join(x for x in SENTENCE_SPLIT_RE.split(user or "") if not x.strip().endswith("?"))
    user_words = frozenset(stem(w) for w in WORD_RE.findall(statements)) if statements.strip() else None
    given = frozenset(find_numbers(f"{question or ''} {user or ''}")) if (question or user) else None
    ask = _asking_sentence(question) if question else None
    if ask is None:
        return Asked(user=user_words, given=given)
    m = _COUNTED_RE.search(ask)
    noun = (m.group(1) or m.group(2)).lower() if m else None
    unit = stem(noun) if noun and noun not in _AUX else None
    money = unit is None and bool(_MONEY_ASK_RE.search(ask))
    rates = frozenset(stem(g) for m in _RATE_RE.finditer(ask) for g in m.groups() if g)
    return Asked(frozenset(terms(ask)), unit, money, bool(_TOTAL_RE.search(ask)), rates,
                 bool(_COMPARE_ASK_RE.search(ask)), frozenset(stem(w) for w in WORD_RE.findall(ask)),
                 user_words, given)


@dataclass(frozen=True)
class Value:
    """A number of a sentence stated as a value (not an operand, not a modifier)."""

    value: float
    start: int
    end: int
    text: str
    result: bool  # stated as the result of a computation ("= 17", "gives 17")


def values(sentence: str, unit: str | None = None) -> list[Value]:
    """The values a sentence states, in order.

    An operand of an expression ("3 * 4", "45 hours * $10") is not a value, unless a result
    follows it ("3 * 4 = 12": 12 is); a number in a compound modifier ("a 5-year-old tree") is
    not a value either, unless it counts ``unit``, the asked noun ("a 30-meter circuit" for
    "How many meters ...").
    """
    found = []
    for m in _TOKEN_RE.finditer(sentence):
        after = sentence[m.end():]
        lo = _tail_window(sentence, m.start())
        compound = re.match(r"-([A-Za-z]+)", after)
        if _OP_BEFORE_RE.search(sentence, lo, m.start()) or _OP_AFTER_RE.match(after) \
                or (compound and stem(compound.group(1)) != unit):
            continue
        numbers = find_numbers(m.group(0))
        if numbers:
            result = bool(_RESULT_BEFORE_RE.search(sentence, lo, m.start()))
            found.append(Value(numbers[0], m.start(), m.end(), m.group(0), result))
    return found


_BEFORE_WINDOW = 48  # the "...\s*$" patterns read at most this far before a value's trailing spaces


def _tail_window(text: str, end: int) -> int:
    """Where the patterns anchored at the end of ``text[:end]`` need to start looking: before its
    trailing whitespace, at most ``_BEFORE_WINDOW`` characters (``search(text, lo, end)`` then
    equals ``search(text[:end])``: look-behinds and ``\\b`` still see the text before ``lo``)."""
    w = end
    while w > 0 and text[w - 1].isspace():
        w -= 1
    return max(0, w - _BEFORE_WINDOW)


def counted_nouns(after: str) -> set[str]:
    """What a number counts, from the words after it: "12 (red) marbles", "3 cups of feed" (the
    noun after "of" too: "2 bolts of fiber", "1 days of pencils")."""
    words = WORD_RE.findall(after)[:4]
    if words and words[0].lower() in ("per", "a", "an", "each", "every"):
        return set()  # "$3 a year", "$1.50 per year": a rate, not a count of years
    nouns = {stem(w) for w in words[:2]}
    for i, w in enumerate(words[:3]):
        if w.lower() == "of" and i + 1 < len(words):
            nouns.add(stem(words[i + 1]))
    return nouns


def main_value(sentence: str, found: list[Value], asked: Asked) -> Value:
    """The value a sentence commits to: its last result ("she has 3 * 39 = 108 marbles left after
    the initial 39"), else its last count of the counted noun ("it will take 3 years for Carlos
    to earn $1.50 per year" for "How many years ...?"), else its last value."""
    results = [v for v in found if v.result]
    if results:
        return results[-1]
    counts = [v for v in found if asked.unit is not None and asked.unit in counted_nouns(sentence[v.end:])]
    return counts[-1] if counts else found[-1]


def fits_asked(sentence: str, value: Value, asked: Asked) -> bool:
    """Whether ``value`` can be a value of the asked quantity, by the words that follow it.

    Not when it is a change or a comparison ("12 more cards", "200 fewer fruits than") and the
    question asks for neither; a rate whose denominator the question does not use ("$120 per
    hour" when the week's earnings are asked); a count of another noun than the counted one
    ("180 chickens" for "How many cups ..."; a value standing alone fits); a number without a
    currency when money is asked.
    """
    after = sentence[value.end:]
    if _RELATION_AFTER_RE.match(after) and not asked.compare:
        return False
    per = _PER_AFTER_RE.match(after)
    if per and stem(per.group(1) or per.group(2)) not in asked.rates:
        return False
    bare = bool(_BARE_AFTER_RE.match(after))
    currency = value.text[0] in "$\u00a3\u20ac"
    if asked.unit is not None and not bare and asked.unit not in counted_nouns(after) \
            and not value.text.endswith("%") and not (currency and asked.unit in _MONEY_UNITS):
        return False
    return not asked.money or currency or bool(_MONEY_AFTER_RE.match(after)) \
        or (bare and bool(_MONEY_TALK_RE.search(sentence)))
