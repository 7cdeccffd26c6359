"""Whether a math reply's conclusion commits to a value of the asked quantity (rule-based judge).

``judge_rules.classify_rule_based`` calls :func:`commits_to_value` for a math reply that is not
missing, hedging, asking or refusing. The reply commits when its *conclusion* (the last sentence
that states a value and talks about what was asked) states a value of the asked quantity as a
result, a conclusion, a ``label: value`` line or a state ("Ava has 23 coins."), and no later
sentence starts more work on the question. The patterns each rule stands for are named in its
comment; ``judge_rules_asked`` reads the question and the values.
"""

from __future__ import annotations

import re

from jaxrl_mt.rewards.judge_rules_asked import (
    WORD_RE,
    Asked,
    Value,
    counted_nouns,
    fits_asked,
    is_question,
    main_value,
    sentences,
    stem,
    talks_about,
    terms,
    values,
)

__all__ = ["commits_to_value", "is_alternative_of_asked"]

_SHORT_ANSWER_WORDS = 4  # a reply of at most this many words stating a value is an answer
_CONCLUSION_START_RE = re.compile(  # the sentence presents itself as the conclusion
    r"^\W*(?:so|therefore|thus|hence|in\s+total|altogether|overall|finally|in\s+conclusion|"
    r"that\s+means|this\s+means|which\s+means|the\s+total\s+is|in\s+all)\b",
    re.IGNORECASE,
)
_SO_CLAUSE_RE = re.compile(  # a concluding clause inside a sentence: "..., so she has 12"
    r"[,;]\s*(?:so|therefore|thus|hence|which\s+means|that\s+means)\b", re.IGNORECASE)
_KEY_VALUE_RE = re.compile(r"^[^:\d]{1,40}:\s*\$?\d[\d,.]*(?:\s+[A-Za-z]+)?\W*$")  # "Total: 20 books"
_STATE_RE = re.compile(  # a quantity's value stated as a state: "has 12", "is 12" (not "is giving"), "12 left"
    r"\b(?:has|have|had|holds?|held|contains?|costs?|owns?|makes?|carr(?:y|ies|ying)|left|leaving|remain(?:s|ing)?|"
    r"now|total|altogether|in\s+all|at\s+the\s+end|end(?:s|ed)?\s+(?:up\s+)?with|there\s+(?:are|is|were|was))\b"
    r"|\b(?:is|are|was|were)\b(?!\s+\w+ing\b)"
    r"|\b(?:it|there|that|he|she|here)['\u2019]s\b|\b(?:they|we|there)['\u2019]re\b",  # "It's 22,200 shells."
    re.IGNORECASE,
)
_EVENT_RE = re.compile(  # an event that changes a quantity: what happens, not how much there is
    r"\b(?:los[et]|loses|losing|give[sn]?|gave|giving|finds?|found|receive[sd]?|buys?|bought|sells?|sold|"
    r"eats?|ate|gets?|got|adds?|added|takes?|took|spends?|spent|uses?|used|donate[sd]?|wins?|won|"
    r"picks?|picked|collects?|collected|throws?|threw|present(?:s|ed|ing)?)\b",
    re.IGNORECASE,
)
_VALUE_LEAD_RE = re.compile(  # the word right before a value: "cover 10", "spent $100", "grew a total of 12"
    r"\b([A-Za-z]+)\s+(?:(?:a\s+total\s+of|about|around|approximately|exactly|only)\s+)?$", re.IGNORECASE)
_START_RE = re.compile(  # the starting amount, a given, not the asked (final) quantity
    r"\bstart(?:s|ed)?\s+(?:off\s+)?with\b|\binitially\b|\bat\s+first\b|\bto\s+begin\s+with\b",
    re.IGNORECASE,
)
_PLAN_RE = re.compile(  # announces work still to do: "we need to", "to find out", "let's"
    r"\bneeds?\s+to\b|\blet's\b|\blet\s+us\b|\bto\s+(?:find|solve|calculate|determine|figure|work)\b"
    r"|\bwe\s+(?:will|would|can|must|should|have\s+to)\b|\bI\s+(?:will|would|need)\b|\bfirst,?\s+we\b"
    r"|\bwants?\s+to\b|\blet\s+\w\s+be\b|\bwill\s+(?:determine|depend|decide|affect)\b|\bdepends?\s+on\b",
    re.IGNORECASE,
)
_REOPEN_RE = re.compile(  # a sentence that starts more work on the question: "To find out how many ..."
    r"^\W*(?:(?:now|next|then|so),?\s+)?(?:to\s+(?:find|calculate|determine|figure|solve|get)|let's|let\s+us"
    r"|we\s+(?:need|have|will|can|must|should))\b"
    r"|\bis\s+(?:the\s+)?(?:sum|difference|product|quotient)\s+of\b",  # defines the computation still to do
    re.IGNORECASE,
)
_STEP_RE = re.compile(  # opens another step of the work
    r"^\W*(?:on|in|during|after|then|next|now|first|second|third|finally|when|if|since)\b", re.IGNORECASE)
_UNFINISHED_RE = re.compile(r"[-+*/=\u00d7\u00f7(]\s*$|\b(?:x|times|plus|minus|by)\s*$")  # cut off mid-expression
_ADDRESS_RE = re.compile(r"\byou\b|\byour\b", re.IGNORECASE)  # "you said 12": the user's fact, not a claim
_ENDS_ON_VALUE_RE = re.compile(  # a cut-off sentence that got to its value: "... = 448", "... is 108 beads left"
    r"(?:=|\b(?:is|are|was|were|has|have|had|gives?|equals?|total\s+of)|:)"
    r"(?:\s+(?:now|then|still|only|just|about|around|approximately|exactly))?\s*[$\u00a3\u20ac]?\d[\d,.]*(?:\s?%)?"
    r"(?:\s+[A-Za-z'-]+){0,4}\W*$", re.IGNORECASE)
_TOTAL_SAID_RE = re.compile(  # a value presented as a total
    r"\b(?:total|in\s+all|altogether|together|combined|overall|sum|whole)\b", re.IGNORECASE)


def cut_off(text: str) -> bool:
    """Whether the reply stops mid-sentence (no closing punctuation: the token budget ran out)."""
    return not re.search(r"[.!?)\]}*\"'`:]\s*$", text)


def _is_echo(sentence: str, asked: Asked) -> bool:
    """Whether a sentence only repeats the user's statements (its words are the user's; a question
    the user asked does not count: answering it in its own words is an answer)."""
    if asked.user is None:
        return False
    words = [stem(w) for w in WORD_RE.findall(sentence)]
    return bool(words) and sum(w in asked.user for w in words) >= 0.85 * len(words)


def _states_counted(sentence: str, value: Value, asked: Asked) -> bool:
    """Pattern: a state of the asked count ("A farm has 8 sheep." for "How many sheep does the farm
    have now?"): an answer attempt even when it repeats the number the user just gave (GUIDELINES)."""
    return asked.unit is not None and bool(_STATE_RE.search(sentence[:value.start])) \
        and asked.unit in counted_nouns(sentence[value.end:])


def _is_asked_verb(word: str, asked: Asked) -> bool:
    """Whether ``word`` is a content word of the asking sentence, in any inflection: the same
    first four letters ("spent" for "spend", "ordered" for "order", "traveled" for "travel")."""
    w = word.lower()
    return len(w) >= 4 and any(len(t) >= 4 and t[:4] == w[:4] for t in asked.terms or ())


def _answers_in_asked_verb(sentence: str, value: Value, asked: Asked) -> bool:
    """Pattern: a declarative answer in the question's own verb, the value right after it ("How
    many miles will he cover?" -> "Felix will cover 10 miles."; "How many dollars did Mishka
    spend?" -> "Mishka spent $100 on ..."): a statement of the asked quantity, like a state."""
    m = _VALUE_LEAD_RE.search(sentence[:value.start])
    return bool(m) and _is_asked_verb(m.group(1), asked)


def _labels_asked_value(sentence: str, asked: Asked) -> bool:
    """Pattern: a ``label: value`` line ("Total: 20 books", "Chloe's beads: 47") whose label or
    unit names the asked quantity or a total; an unrelated label ("Día de la Consciencia: 12")
    is not an answer."""
    if not _KEY_VALUE_RE.match(sentence):
        return False
    return not asked.known or talks_about(sentence, asked) or bool(_TOTAL_SAID_RE.search(sentence))


def _is_event(sentence: str, value: Value, asked: Asked) -> bool:
    """Pattern: a sentence that tells what happens to the quantity ("Jonas loses 3 beads", "Gary
    bought 3 marbles") and states no state of it, or whose value is the amount of such an event
    ("The shelf holds 8 books, and the librarian adds 8 books."): the verb nearest before the value
    is an event's; the question's own verb ("How much did he spend") is not an event."""
    events = [m for m in _EVENT_RE.finditer(sentence) if not _is_asked_verb(m.group(0), asked)]
    if not events:
        return False
    states = [m.end() for m in _STATE_RE.finditer(sentence, 0, value.start)]
    before = [m.end() for m in events if m.end() <= value.start]
    nearest_event = bool(before) and not value.result and (not states or before[-1] > states[-1])
    return not _STATE_RE.search(sentence) or nearest_event


def _strongly_matches(sentence: str, asked: Asked) -> bool:
    """Pattern: the sentence restates the asking sentence, every content word of it ("Chloe has 27
    pencils at the end of the first day"): an explicit answer to that question, not a step."""
    return bool(asked.terms) and len(asked.terms) >= 3 and asked.terms <= terms(sentence)


def _statement_commits(sentence: str, value: Value, computed: set[float], asked: Asked) -> bool:
    """The last checks of :func:`_commits`, for a sentence that is neither short nor a result.

    Pattern: a value in a concluding clause ("The tree costs $3 a year, so it will take 3 years
    ...") is judged on that clause, as a conclusion."""
    start_asked = asked.terms is not None and "start" in asked.terms
    clause = [m.start() for m in _SO_CLAUSE_RE.finditer(sentence, 0, value.start)]
    concludes = bool(clause) or bool(_CONCLUSION_START_RE.match(sentence))
    sentence = sentence[clause[-1]:] if clause else sentence
    if _PLAN_RE.search(sentence) or _ADDRESS_RE.search(sentence) \
            or (_START_RE.search(sentence) and not start_asked):
        return False
    if _is_echo(sentence, asked) and not _states_counted(sentence, value, asked):
        return False
    if concludes or value.value in computed:
        return True
    if not (_STATE_RE.search(sentence) or (start_asked and _START_RE.search(sentence))
            or _answers_in_asked_verb(sentence, value, asked)):
        return False
    numbers = {v.value for v in values(sentence)}
    if len(numbers) > 1 and asked.given is not None and numbers <= asked.given:
        return False  # several given numbers and no computation: a restatement of the facts
    return not asked.known or bool(asked.terms & terms(sentence))


def _commits(sentence: str, n_words: int, computed: set[float], asked: Asked) -> bool:
    """Whether a sentence commits to a value: its last value, stated as a result, a conclusion or
    a state of the asked quantity.

    An event ("Ava gives away 14 marbles"), the starting amount ("Ava starts with 12", unless the
    question asks for it), a plan ("we need to add 5"), a repetition of the user's message or a
    question does not;
    nor does a value of another quantity than the asked one (:func:`fits_asked`), nor, when a
    total is asked, a value not presented as a total or as the conclusion (a part).
    """
    if is_question(sentence) or _UNFINISHED_RE.search(sentence):
        return False
    found = values(sentence, asked.unit)
    if not found:
        return False
    value = main_value(sentence, found, asked)
    if asked.known and (not fits_asked(sentence, value, asked) or _is_event(sentence, value, asked)):
        return False
    if n_words <= _SHORT_ANSWER_WORDS or _labels_asked_value(sentence, asked):
        return True
    if asked.total and not _CONCLUSION_START_RE.match(sentence) and not _TOTAL_SAID_RE.search(sentence):
        return False  # pattern: a part of the total ("it produces 15 fruits at age 6")
    if value.result:
        return True
    return _statement_commits(sentence, value, computed, asked)


def _candidates(sents: list[str], text: str, asked: Asked) -> tuple[list[int], bool]:
    """Indices of the sentences that state a value, and whether the reply ends in a fragment.

    Pattern: a reply cut off by the token budget ends in a fragment; the fragment counts as a
    sentence only when it got to its value ("... = 448", "... is 108 beads left") or is short
    ("18"); otherwise the reply was cut off mid-work and the complete sentences before decide.
    With the question known, only sentences talking about what was asked count
    (:func:`talks_about`); when none does, the last one counts, unless the reply never names the
    counted noun at all. The result the reply ends on ("... divide the distance by the speed:
    240 / 30 = 8") always counts.
    """
    fragment = cut_off(text) and bool(sents)
    idx = [i for i, s in enumerate(sents) if values(s)]
    if fragment and idx and idx[-1] == len(sents) - 1 and not _ENDS_ON_VALUE_RE.search(sents[-1]) \
            and len(WORD_RE.findall(sents[-1])) > _SHORT_ANSWER_WORDS:
        idx.pop()
    if not asked.known:
        return idx, fragment
    about = [i for i in idx if talks_about(sents[i], asked)]
    if idx and idx[-1] == len(sents) - 1 and idx[-1] not in about and values(sents[-1])[-1].result:
        about.append(idx[-1])  # the value the reply ends on, a computed result
    if about:
        return about, fragment
    names_unit = asked.unit is None or asked.unit in {stem(w) for w in WORD_RE.findall(text)}
    return (idx[-1:] if names_unit or len(WORD_RE.findall(text)) <= _SHORT_ANSWER_WORDS else []), fragment


def _norm(sentence: str) -> str:
    """A sentence's words, lower-cased, joined by single spaces."""
    return " ".join(WORD_RE.findall(sentence.lower()))


def _work_goes_on(after: list[str], open_tail: bool, earlier: list[str], asked: Asked) -> bool:
    """Pattern: a later sentence starts more work on the question ("To find out how many ...,
    we need to ..."), or the reply is cut off while still at work on it: opening another step
    ("On the second day,") or the conclusion ("So, the"), in the middle of an expression ("Jonas has 90 - ")
    or after a number
    that is not a value reached ("The file is downloaded 20% ..., which means 20"). A cut-off
    fragment that repeats an earlier sentence (a degenerate loop) or is about something else (a
    tangent) is no work on the question."""
    if any(_REOPEN_RE.search(s) for s in after):
        return True
    if not (open_tail and after):
        return False
    tail = after[-1]
    if _STEP_RE.match(tail) or _CONCLUSION_START_RE.match(tail) or _UNFINISHED_RE.search(tail):
        return True  # cut off opening a step, or the conclusion ("So, the"), or mid-expression
    if any(_norm(s).startswith(_norm(tail)) for s in earlier):
        return False
    return bool(re.search(r"\d", tail)) and (not asked.known or talks_about(tail, asked))


def _restates(sents: list[str], i: int, asked: Asked) -> bool:
    """Pattern: a sentence that computes nothing and only states values already known (given by
    the user or stated earlier in the reply): a remark ("This is a simplified calculation, but
    we need to consider the rate of 5 euros."), not a new conclusion."""
    found = values(sents[i])
    known = set(asked.given or ()) | {v.value for s in sents[:i] for v in values(s)}
    return not any(v.result for v in found) and {v.value for v in found} <= known


def commits_to_value(sents: list[str], text: str, asked: Asked) -> bool:
    """Whether the reply's conclusion commits to a value of the asked quantity.

    The conclusion is the last sentence stating a value that talks about what was asked (a
    closing remark such as "This is a classic example ... ratio 3" is skipped). Sentences after
    it do not undo it unless the work goes on (:func:`_work_goes_on`); an explicit answer that
    restates the question ("So, Chloe has 27 pencils at the end of the first day.") is undone
    only by later work on that same question. A last candidate that fails to commit gives way
    to the one before when it is a fragment cut off inside the concluding sentence ("The profit
    is 150%") or a restatement of known values (:func:`_restates`).
    """
    n_words = len(WORD_RE.findall(text))
    idx, fragment = _candidates(sents, text, asked)
    computed = {v.value for s in sents for v in values(s) if v.result}
    open_tail = fragment and len(sents) - 1 not in idx
    for pos in range(len(idx) - 1, -1, -1):
        i = idx[pos]
        after = sents[i + 1:]
        explicit = _strongly_matches(sents[i], asked) and not any(_strongly_matches(s, asked) for s in after)
        if _work_goes_on(after, open_tail, sents[:-1], asked) and not explicit:
            return False
        if _commits(sents[i], n_words, computed, asked):
            return True
        if not ((fragment and i == len(sents) - 1) or _restates(sents, i, asked)):
            return False
    return False


def is_alternative_of_asked(span: str, asked: Asked) -> bool:
    """Whether a passage offering alternative values ("around 50-60 fruits per year", "if ...
    then 5 ...") offers one for the asked quantity (hedging) rather than only for another one
    (discussion): some value of one of its sentences fits the asked quantity."""
    if not asked.known:
        return True
    for sentence in sentences(span):
        if asked.total and not _TOTAL_SAID_RE.search(sentence):
            continue
        if any(fits_asked(sentence, v, asked) for v in values(sentence)):
            return True
    return False
