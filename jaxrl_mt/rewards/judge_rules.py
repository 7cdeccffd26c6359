"""Rule-based response-type judge: which kind of reply did the assistant give?

The categories are those of Lost in Conversation (LiC):

- ``answer_attempt``: the reply commits to an answer (math: one value for the asked quantity).
- ``clarification``: asks the user a single question to clarify the request.
- ``interrogation``: asks the user several questions.
- ``discussion``: talks about the problem without answering or asking.
- ``hedging``: several alternative or conditional answers ("if X then 5, if Y then 7").
- ``refusal``: declines to answer.
- ``missing``: empty or degenerate (special tokens only, repetition, a bare "Answer:").

ICPO rewards non-answers on underspecified prompts with ``NON_ANSWER_TYPES``; LiC's scoring and
its AtR/AiwR metrics use ``is_answer_attempt``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jaxrl_mt.rewards.judge_rules_asked import (
    Asked,
    asked_quantity,
    is_question,
    sentences,
    terms,
)
from jaxrl_mt.rewards.judge_rules_math import commits_to_value, is_alternative_of_asked
from jaxrl_mt.rewards.think import answer_part
from jaxrl_mt.rewards.verifier import MAX_CHECKED_CHARS, extract_marked_answer, find_numbers

__all__ = ["NON_ANSWER_TYPES", "RESPONSE_TYPES", "classify_rule_based", "clean_reply", "is_answer_attempt"]

RESPONSE_TYPES = (
    "answer_attempt",
    "clarification",
    "interrogation",
    "discussion",
    "hedging",
    "refusal",
    "missing",
)
NON_ANSWER_TYPES = frozenset({"clarification", "interrogation", "discussion", "hedging", "refusal"})

# ----------------------------------------------------------------------------- rule patterns

_SPECIAL_TOKEN_RE = re.compile(r"<\|[^|>]*\|>|</?s>|<eos>|<pad>|\[PAD\]|<end_of_turn>")
_MARKER_ONLY_RE = re.compile(
    r"^\W*(?:(?:the\s+)?(?:final\s+)?(?:answer|solution|response)(?:\s+is)?|assistant|user)\W*$",
    re.IGNORECASE,
)
_WORD_RE = re.compile(r"[\w']+")
_MIN_REPEAT_WORDS = 4  # repetition test needs at least this many words
_MAX_DISTINCT_RATIO = 0.25  # distinct/total words at or below this is degenerate repetition

_NUM = r"[-\u2212]?\$?\d[\d,]*(?:\.\d+)?"
_ALTERNATIVE_RE = re.compile(  # "either 4 or 6", "could be 15 or 20"
    r"\b(?:either|could be|might be|may be|possibly|probably)(?:\s+[\w']+){0,2}?\s+" + _NUM
    + r"(?:\s+[\w-]+){0,3}\s+or\s+" + _NUM,
    re.IGNORECASE,
)
_RANGE_RE = re.compile(  # "approximately 85-90", "between 10 and 20": a range of candidate answers
    r"\b(?:approximately|about|around|roughly|somewhere|between)\s+(?:between\s+)?" + _NUM
    + r"\s*(?:-|\u2013|to|and)\s*" + _NUM,
    re.IGNORECASE,
)
_FRAMING_RE = re.compile(  # alone, these announce alternatives; numbers must follow
    r"\bdepend(?:s|ing)?\s+on\b|\bpossibilit(?:y|ies)\b|\bpossible\s+answers?\b"
    r"|\b(?:two|three|several|multiple|different)\s+(?:ways|interpretations|readings|cases|"
    r"scenarios|options|answers)\b|\b(?:case|scenario|option)\s+\d|\botherwise\b"
    r"|\balternatively\b|\bon\s+the\s+other\s+hand\b",
    re.IGNORECASE,
)
_CONDITION_RE = re.compile(r"\bif\b|\bassuming\b|\bsuppos(?:e|ing)\b|\bin\s+case\b", re.IGNORECASE)

_PLEASANTRY_RE = re.compile(
    r"\blet\s+me\s+know\s+if\b|\bwould\s+you\s+like\b|\bdo\s+you\s+want\s+me\b|\bshall\s+i\b"
    r"|\bhope\s+(?:this|that|it)\s+helps\b|\bfeel\s+free\b|\b(?:other|more|further)\s+questions\b"
    r"|\banything\s+else\b|\b(?:happy|glad)\s+to\s+help\b",
    re.IGNORECASE,
)
_SECOND_PERSON_RE = re.compile(r"\byou(?:r)?\b|\bplease\b", re.IGNORECASE)
_REQUEST_RE = re.compile(
    r"\bplease\s+(?:tell|provide|give|share|specify|clarify|confirm|let\s+me\s+know)\b"
    r"|\b(?:can|could|would)\s+you\s+(?:please\s+)?(?:tell|provide|give|share|specify|clarify|"
    r"confirm|let\s+me\s+know)\b|\blet\s+me\s+know\s+(?:how|what|which|whether|the)\b",
    re.IGNORECASE,
)
_EXTRA_ASK_RE = re.compile(  # a further question inside one sentence: ": what ...", ", and how ..."
    r"(?:[;:]\s*(?:and\s+|or\s+)?|,?\s(?:and|or)\s+)"
    r"(?:what|how|which|when|where|who|whether|is|are|do|does|did|was|were|can|could)\b",
    re.IGNORECASE,
)
_QUESTION_START_RE = re.compile(
    r"^\W*(?:and\s+)?(?:what|how|which|when|where|who|whom|why|is|are|am|do|does|did|was|were|"
    r"can|could|would|will|should|shall|may|have|has)\b",
    re.IGNORECASE,
)
_LIST_ITEM_RE = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+\S")
_REFUSAL_RE = re.compile(
    # the speaker declares it cannot or will not answer: "I can't help", "we cannot provide an exact answer"
    r"\b(?:I|we)\s*(?:can\s*not|cannot|can't|can\u2019t|won't|will\s+not|am\s+unable|'m\s+unable|are\s+unable|"
    r"am\s+not\s+able|'m\s+not\s+able|are\s+not\s+able|(?:do\s+not|don't)\s+know|'d\s+rather\s+not|"
    r"would\s+rather\s+not|must\s+decline|decline|(?:do\s+not|don't)\s+think\s+(?:I|we|it|this)\s+"
    r"(?:can|is\s+possible))\b"
    # the question declared unanswerable: "this cannot be determined", "impossible to say", "not enough information"
    r"|\bcan(?:\s*not|'t|\u2019t)\s+be\s+(?:solved|answered|determined|calculated|computed|known|found)\b"
    r"|\bno\s+(?:(?:single|definite|unique|clear|exact)\s+)?(?:answer|solution)\s+(?:can|is\s+possible|exists)\b"
    r"|\b(?:not|n't)\s+(?:enough|sufficient)\s+(?:information|data|details)\b|\binsufficient\s+information\b"
    r"|\bimpossible\s+to\s+(?:solve|answer|determine|calculate|compute|say|tell|know)\b"
    r"|\b(?:don't|do\s+not)\s+have\s+(?:the\s+)?(?:capability|ability|means|information)\b"
    r"|\bunable\s+to\s+(?:help|assist|answer|solve|provide|determine|calculate)\b",
    re.IGNORECASE,
)
_CODE_RE = re.compile(r"```|^\s*(?:def|class|SELECT|import)\b", re.MULTILINE)
_DISCUSSION_RE = re.compile(
    r"\b(?:we\s+need\s+to|let's|let\s+us|to\s+solve\s+this|first,?\s+we|we\s+would|we\s+will|"
    r"I\s+will|I'll)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class _Asks:
    """Questions and requests directed at the user."""

    n_questions: int  # asks in sentences ending with "?"
    n_requests: int  # imperative asks without "?" ("Please tell me ...")
    n_list_items: int  # list items following an ask that ends with ":"


def clean_reply(text: str) -> str:
    """The reply without special tokens, stripped."""
    return _SPECIAL_TOKEN_RE.sub(" ", text).strip()


def _is_missing(text: str) -> bool:
    """Empty, only punctuation, a bare marker ("Answer:"), or degenerate repetition of few words."""
    if not re.search(r"[A-Za-z0-9]", text) or _MARKER_ONLY_RE.match(text):
        return True
    words = [w.lower() for w in _WORD_RE.findall(text)]
    return len(words) >= _MIN_REPEAT_WORDS and len(set(words)) / len(words) <= _MAX_DISTINCT_RATIO


_FOREIGN_NAME_SHARE = 0.06  # word salad: at least this share of words are capitalised names foreign to the task
_TASK_WORD_SHARE = 0.10  # ... and at most this share of its content words are the question's
_MIN_SALAD_WORDS = 12  # shorter replies are never called word salad
_MIN_TASK_TERMS = 3  # nor when the question is too short to tell what belongs to the task


def _is_word_salad(text: str, question: str | None) -> bool:
    """Pattern: sampled word salad (T = 1) that has left the task: names and capitalised words
    the question never uses, in the middle of sentences, and almost none of the question's
    content words ("Karen arrived at El's breeder 3 hours ago ..."). Nothing usable: missing."""
    words = _WORD_RE.findall(text)
    if len(terms(question or "")) < _MIN_TASK_TERMS or len(words) < _MIN_SALAD_WORDS:
        return False  # too little to tell salad from a short reply
    known = {w.lower() for w in _WORD_RE.findall(question)}
    names = [m.group(0) for m in re.finditer(r"(?<=[a-z,;'\u2019]\s)[A-Z][\w'\u2019]*", text)
             if m.group(0).lower() not in known and not re.fullmatch(r"I(?:['\u2019]\w+)?", m.group(0))]
    own = terms(text)
    shared = len(own & terms(question)) / len(own) if own else 0.0
    return len(names) >= max(1.0, _FOREIGN_NAME_SHARE * len(words)) and shared <= _TASK_WORD_SHARE


def _sentence_at(text: str, pos: int) -> str:
    """The sentence of ``text`` around position ``pos``."""
    start = max(text.rfind(c, 0, pos) for c in ".!?\n") + 1
    ends = [i for i in (text.find(c, pos) for c in ".!?\n") if i >= 0]
    return text[start:min(ends) + 1 if ends else len(text)].strip()


def _is_hedging(text: str, asked: Asked) -> bool:
    """Pattern: two or more alternative or conditional values offered for the asked quantity
    (a range or alternatives of another quantity, "around 50-60 fruits per year" when the
    ten-year total is asked, are discussion)."""
    for m in (_ALTERNATIVE_RE.search(text), _RANGE_RE.search(text)):
        if m and is_alternative_of_asked(_sentence_at(text, m.start()), asked):
            return True
    framing = _FRAMING_RE.search(text)
    conditions = list(_CONDITION_RE.finditer(text))
    n_cues = len(conditions) + len(_FRAMING_RE.findall(text))
    starts = [m.start() for m in conditions]
    if framing:
        starts.append(framing.start())
    if not starts or (framing is None and n_cues < 2):
        return False
    first = min(starts)
    sentence_start = max(text.rfind(c, 0, first) for c in ".!?\n") + 1
    return len(set(find_numbers(text[sentence_start:]))) >= 2 \
        and is_alternative_of_asked(text[sentence_start:], asked)  # alternatives hold numbers


def _substantive(sentences: list[str]) -> list[str]:
    """Drops pleasantries and offers ("Let me know if ...", "Would you like me to ...?")."""
    return [s for s in sentences if not _PLEASANTRY_RE.search(s)]


def _count_asks(lines: list[str]) -> _Asks:
    """Counts the asks directed at the user in a reply's substantive lines."""
    sents = [s for line in lines for s in sentences(line)]
    trailing = len(sents)
    while trailing > 0 and is_question(sents[trailing - 1]):
        trailing -= 1  # sentences[trailing:] is the block of questions that ends the reply
    n_questions = n_requests = 0
    for i, s in enumerate(sents):
        if is_question(s) and (i >= trailing or _SECOND_PERSON_RE.search(s)):
            starts_as_question = bool(_QUESTION_START_RE.match(s))
            n_questions += max(1, int(starts_as_question) + len(_EXTRA_ASK_RE.findall(s)))
        elif not is_question(s) and _REQUEST_RE.search(s):
            n_requests += 1
    n_items = 0
    for i, line in enumerate(lines):
        if line.rstrip().endswith(":") and (_REQUEST_RE.search(line) or "?" in line):
            items = 0
            for follow in lines[i + 1 :]:
                if not _LIST_ITEM_RE.match(follow):
                    break
                items += 1
            n_items = max(n_items, items)
    return _Asks(n_questions, n_requests, n_items)


def _n_asks(asks: _Asks) -> int:
    """How many things the reply asks the user (a list after a request counts its items)."""
    if asks.n_list_items >= 2:
        return max(asks.n_list_items, asks.n_questions)
    return asks.n_questions if asks.n_questions else asks.n_requests


def classify_rule_based(text: str, domain: str = "math", *, question: str | None = None,
                        user: str | None = None) -> str:
    """Classifies a reply into one of ``RESPONSE_TYPES`` with regular-expression rules.

    Args:
      text: the assistant's reply.
      domain: ``"math"`` (an answer commits to a number) or any other LiC domain (``"code"``,
        ``"database"``, ...), where any reply that is not missing, hedging, asking or refusing
        counts as an answer attempt unless it only plans ("we need to ...") without code.
      question: the task as the user stated it (optional; math): a reply that only states some
        other quantity than the one asked is then not an answer attempt.
      user: the user message the reply answers (optional; math): a reply that only repeats it
        is then not an answer attempt.

    Returns:
      One of ``RESPONSE_TYPES`` (``missing`` for a reply longer than ``MAX_CHECKED_CHARS``: not read).
      A reply with a think block is judged on the answer after it (``rewards.think``): an open
      think block is ``missing``.
    """
    if len(text) > MAX_CHECKED_CHARS:
        return "missing"
    text = clean_reply(answer_part(text))  # the answer after a think block; an open one: missing
    if _is_missing(text):
        return "missing"
    asked = asked_quantity(question, user) if domain == "math" else Asked()
    if _is_hedging(text, asked):
        return "hedging"
    if domain == "math" and extract_marked_answer(text) is not None:
        return "answer_attempt"
    commits = domain == "math" and commits_to_value(_substantive(sentences(text)), text, asked)
    if domain == "math" and not commits and _is_word_salad(text, question) and not _REFUSAL_RE.search(text):
        return "missing"
    lines = [" ".join(_substantive(sentences(line))) for line in text.splitlines()]
    lines = [line for line in lines if line]
    n_asks = _n_asks(_count_asks(lines))
    if n_asks >= 2:
        return "interrogation"
    if n_asks == 1:
        return "clarification"
    if domain != "math":
        if _REFUSAL_RE.search(text):
            return "refusal"
        if _CODE_RE.search(text) or not _DISCUSSION_RE.search(text):
            return "answer_attempt"
        return "discussion"
    # A committed value outranks a refusal phrase ("We cannot split a marble, so she has 12 left.").
    if commits:
        return "answer_attempt"
    return "refusal" if _REFUSAL_RE.search(text) else "discussion"


def is_answer_attempt(text: str, domain: str = "math", *, question: str | None = None,
                      user: str | None = None) -> bool:
    """Whether the rule-based judge calls ``text`` an answer attempt."""
    return classify_rule_based(text, domain, question=question, user=user) == "answer_attempt"
