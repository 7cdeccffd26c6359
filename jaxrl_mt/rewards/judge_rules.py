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

from jaxrl_mt.rewards.verifier import extract_marked_answer, find_numbers

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

_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+|\n+")
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
    r"\bI\s*(?:can\s*not|cannot|can't|can\u2019t|won't|will\s+not|am\s+unable|'m\s+unable|"
    r"am\s+not\s+able|'m\s+not\s+able|do\s+not\s+know|don't\s+know|'d\s+rather\s+not|"
    r"would\s+rather\s+not|must\s+decline|decline)\b"
    r"|\bI\s+(?:don't|do\s+not)\s+think\s+(?:I|it|this)\s+(?:can|is\s+possible)\b"
    r"|\bcan(?:\s*not|'t|\u2019t)\s+be\s+(?:solved|answered|determined|calculated|computed)\b"
    r"|\bno\s+(?:(?:single|definite|unique|clear)\s+)?(?:answer|solution)\s+(?:can|is\s+possible|exists)\b"
    r"|\b(?:not|n't)\s+(?:enough|sufficient)\s+information\b"
    r"|\bimpossible\s+to\s+(?:solve|answer|determine|calculate|compute|say|tell)\b"
    r"|\bas\s+an?\s+(?:ai|chatbot|language\s+model|(?:ai\s+)?assistant)\b"
    r"|\b(?:don't|do\s+not)\s+have\s+the\s+(?:capability|ability|means)\b"
    r"|\bunable\s+to\s+(?:help|assist|answer|solve|provide)\b",
    re.IGNORECASE,
)
_CONCLUSION_START_RE = re.compile(
    r"^\W*(?:so|therefore|thus|hence|in\s+total|altogether|overall|finally|in\s+conclusion|"
    r"that\s+means|this\s+means|which\s+means|the\s+total\s+is|in\s+all)\b",
    re.IGNORECASE,
)
_PLANNING_RE = re.compile(
    r"\b(?:need|needs|will|would|should|must|let's|let\s+us|we'll|have\s+to|going\s+to|"
    r"first|next|want)\b",
    re.IGNORECASE,
)
_RESULT_RE = re.compile(  # a computed value: "= 31", "gives 9", "which is 12"
    r"(?:=|\bgives?\b|\bgiving\b|\bequals?\b|\bwhich\s+is\b|\bwe\s+get\b|\bto\s+get\b"
    r"|\bresults?\s+in\b|\bcomes?\s+to\b)\s*(" + _NUM + r")",
    re.IGNORECASE,
)
_SHORT_ANSWER_WORDS = 4  # a reply of at most this many words holding a number is an answer
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
    if not re.search(r"[A-Za-z0-9]", text) or _MARKER_ONLY_RE.match(text):
        return True
    words = [w.lower() for w in _WORD_RE.findall(text)]
    return len(words) >= _MIN_REPEAT_WORDS and len(set(words)) / len(words) <= _MAX_DISTINCT_RATIO


def _is_hedging(text: str) -> bool:
    if _ALTERNATIVE_RE.search(text) or _RANGE_RE.search(text):
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
    return len(set(find_numbers(text[sentence_start:]))) >= 2  # alternatives hold numbers


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_SPLIT_RE.split(text) if s and s.strip()]


def _substantive(sentences: list[str]) -> list[str]:
    """Drops pleasantries and offers ("Let me know if ...", "Would you like me to ...?")."""
    return [s for s in sentences if not _PLEASANTRY_RE.search(s)]


def _is_question(sentence: str) -> bool:
    return sentence.rstrip(" *_\"')").endswith("?")


def _count_asks(lines: list[str]) -> _Asks:
    """Counts the asks directed at the user in a reply's substantive lines."""
    sentences = [s for line in lines for s in _sentences(line)]
    trailing = len(sentences)
    while trailing > 0 and _is_question(sentences[trailing - 1]):
        trailing -= 1  # sentences[trailing:] is the block of questions that ends the reply
    n_questions = n_requests = 0
    for i, s in enumerate(sentences):
        if _is_question(s) and (i >= trailing or _SECOND_PERSON_RE.search(s)):
            starts_as_question = bool(_QUESTION_START_RE.match(s))
            n_questions += max(1, int(starts_as_question) + len(_EXTRA_ASK_RE.findall(s)))
        elif not _is_question(s) and _REQUEST_RE.search(s):
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
    if asks.n_list_items >= 2:
        return max(asks.n_list_items, asks.n_questions)
    return asks.n_questions if asks.n_questions else asks.n_requests


_STATE_RE = re.compile(  # a quantity's value stated as a state: "has 12", "is 12", "12 left"
    r"\b(?:has|have|had|holds?|held|contains?|is|are|was|were|costs?|owns?|makes?|left|remain(?:s|ing)?|"
    r"now|total|altogether|in\s+all|at\s+the\s+end|end(?:s|ed)?\s+(?:up\s+)?with|there\s+(?:are|is|were|was))\b",
    re.IGNORECASE,
)
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
_GIVEN_RE = re.compile(  # restates what the problem gives: "we know that", "is given as", "so far"
    r"\bgiven\b|\bwe\s+know\b|\bso\s+far\b|\bthe\s+(?:question|problem)\b|\btells?\s+us\b",
    re.IGNORECASE,
)
_VARIABLE_RE = re.compile(r"\d(?!s\b)[a-z]\b")  # "3x": an expression in a variable, not a value ("2s" is a plural)
_REOPEN_RE = re.compile(  # a sentence that starts more work on the question: "To find out how many ..."
    r"^\W*(?:(?:now|next|then|so),?\s+)?(?:to\s+(?:find|calculate|determine|figure|solve|get)|let's|let\s+us"
    r"|we\s+(?:need|have|will|can|must|should))\b"
    r"|\bis\s+(?:the\s+)?(?:sum|difference|product|quotient)\s+of\b",  # defines the computation still to do
    re.IGNORECASE,
)
_STEP_RE = re.compile(  # opens another step of the work
    r"^\W*(?:on|in|during|after|then|next|now|first|second|third|finally|when|if|since)\b", re.IGNORECASE)
_KEY_VALUE_RE = re.compile(r"^[^:\d]{1,40}:\s*\$?\d[\d,.]*(?:\s+[A-Za-z]+)?\W*$")  # "Total: 20 books"
_UNFINISHED_RE = re.compile(r"[-+*/=\u00d7\u00f7(]\s*$|\b(?:x|times|plus|minus|by)\s*$")  # cut off mid-expression
_ADDRESS_RE = re.compile(r"\byou\b|\byour\b", re.IGNORECASE)  # "you said 12": the user's fact, not a claim


_STOPWORDS = frozenset(
    "a an the of in on at to for from by with and or but is are was were be been do does did has have had "
    "how many much what which who whom whose when where why will would can could should shall may might "
    "it its he she they them their his her him i you we our your this that these those there then than "
    "now left after before each every all total number amount more less".split())


def _terms(text: str) -> set[str]:
    """Content words of ``text``, lower-cased, a plural ``s`` dropped."""
    words = (w.lower().rstrip("'s") for w in _WORD_RE.findall(text) if not w[0].isdigit())
    return {w[:-1] if len(w) > 3 and w.endswith("s") else w for w in words if w and w not in _STOPWORDS}


@dataclass(frozen=True)
class _Context:
    """What the judge knows of the conversation besides the reply (all optional)."""

    asked: frozenset[str] | None = None  # content words of the question's asking sentence
    unit: str | None = None  # the counted noun of a "How many X ..." question
    user: frozenset[str] | None = None  # words of the user message this reply answers
    given: frozenset[float] | None = None  # numbers of the question and the user message


_HOW_MANY_RE = re.compile(r"\bhow\s+many\s+(?:(?:more|fewer|less|total|extra|additional|different)\s+)?([a-z]+)",
                          re.IGNORECASE)
_AUX = frozenset("do does did is are was were will would can could has have had should".split())


def _stem(word: str) -> str:
    w = word.lower().rstrip("'s") if word.endswith("'s") else word.lower()
    return w[:-1] if len(w) > 3 and w.endswith("s") else w


def _context(question: str | None, user: str | None) -> _Context:
    asked = unit = None
    if question:
        asks = [x for x in _SENTENCE_SPLIT_RE.split(question) if x.strip().endswith("?")]
        if asks:
            asked = frozenset(_terms(asks[-1]))
            m = _HOW_MANY_RE.search(asks[-1])
            unit = _stem(m.group(1)) if m and m.group(1).lower() not in _AUX else None
    statements = " ".join(x for x in _SENTENCE_SPLIT_RE.split(user or "") if not x.strip().endswith("?"))
    words = frozenset(_stem(w) for w in _WORD_RE.findall(statements)) if statements.strip() else None
    given = frozenset(find_numbers(f"{question or ''} {user or ''}")) if (question or user) else None
    return _Context(asked, unit, words, given)


def _is_echo(sentence: str, ctx: _Context) -> bool:
    """Whether a sentence only repeats the user's statements (its words are the user's; a question
    the user asked does not count: answering it in its own words is an answer)."""
    if ctx.user is None:
        return False
    words = [_stem(w) for w in _WORD_RE.findall(sentence)]
    return bool(words) and sum(w in ctx.user for w in words) >= 0.85 * len(words)


def _counts_asked_unit(sentence: str, unit: str | None) -> bool:
    """With a "How many X" question: some number of the sentence counts X (or stands alone)."""
    if unit is None:
        return True
    for m in re.finditer(r"\d[\d,.]*\s*(%?)\s*((?:[A-Za-z-]+\s*){0,2})", sentence):
        following = ["%"] if m.group(1) else [_stem(w) for w in m.group(2).split()]
        if not following or unit in following:
            return True
    return False


def _cut_off(text: str) -> bool:
    """Whether the reply stops mid-sentence (no closing punctuation: the token budget ran out)."""
    return not re.search(r"[.!?)\]}*\"'`:]\s*$", text)


def _computed(text: str) -> set[float]:
    """Values the reply computed ("= 31", "gives 9", "which is 12")."""
    return {v for m in _RESULT_RE.finditer(text) for v in find_numbers(m.group(1))}


def _commits(sentence: str, n_words: int, computed: set[float], ctx: _Context, cut_off: bool) -> bool:
    """Whether a sentence commits to a value: a number stated as a result, a conclusion or a state.

    An event ("Ava gives away 14 marbles"), the starting amount ("Ava starts with 12", unless the
    question asks for it), a plan ("we need to add 5"), a restated given ("we know that ..."), a
    repetition of the user's message, an expression in a variable ("3x") or a question does
    not; a computed result ("= 17"), or a value the reply computed before, does. With the
    question known, a state commits only when it talks about what was asked, and counts the
    asked thing ("The program had 3 months of downloads." does not answer "How many downloads
    ...?"). A reply cut off by the token budget commits only through a conclusion ("So ...") or
    a statement of the asked count: a result in the middle of unfinished work is intermediate.
    """
    numbers = find_numbers(sentence)
    if not numbers or _is_question(sentence) or _VARIABLE_RE.search(sentence) or _UNFINISHED_RE.search(sentence):
        return False
    concludes = bool(_CONCLUSION_START_RE.match(sentence))
    if _RESULT_RE.search(sentence):
        return concludes or not cut_off
    if n_words <= _SHORT_ANSWER_WORDS or _KEY_VALUE_RE.match(sentence):
        return True
    start_asked = ctx.asked is not None and "start" in ctx.asked
    if _PLAN_RE.search(sentence) or _ADDRESS_RE.search(sentence) or _GIVEN_RE.search(sentence) \
            or (_START_RE.search(sentence) and not start_asked) or _is_echo(sentence, ctx):
        return False
    if concludes or (computed.intersection(numbers) and not cut_off):
        return True
    states = _STATE_RE.search(sentence) or (start_asked and _START_RE.search(sentence))
    if not states or not _counts_asked_unit(sentence, ctx.unit):
        return False
    if len(set(numbers)) > 1 and ctx.given is not None and set(numbers) <= ctx.given:
        return False  # several given numbers and no computation: a restatement of the facts
    if cut_off and ctx.unit is None:
        return False
    return ctx.asked is None or bool(ctx.asked & _terms(sentence))


def _commitment(sentences: list[str], text: str, ctx: _Context) -> bool:
    """Whether the reply's conclusion commits to a value.

    The conclusion is the last sentence that holds a number and, when the question is known,
    talks about what was asked (a closing remark such as "This is a classic example ... ratio 3"
    is skipped). Number-free sentences after it do not undo it, unless one starts more work on
    the question ("To find out how many ..., we need to ..."): the reply then has not concluded.
    """
    n_words = len(_WORD_RE.findall(text))
    idx = [i for i, s in enumerate(sentences) if find_numbers(s)]
    if ctx.asked is not None:
        idx = [i for i in idx if ctx.asked & _terms(sentences[i])] or idx[-1:]
    if not idx:
        return False
    last = idx[-1]
    after = sentences[last + 1:]
    cut_off = _cut_off(text)
    if any(_REOPEN_RE.search(s) for s in after):
        return False
    if after and cut_off and _STEP_RE.match(after[-1]):
        return False  # cut off while starting another step ("On the second day, Ben receiv")
    computed = _computed(text)
    if _commits(sentences[last], n_words, computed, ctx, cut_off):
        return True
    # Cut off inside the concluding sentence ("The profit is 150%"): the sentence before decides.
    if not (cut_off and not after and len(idx) > 1):
        return False
    prev = idx[-2]
    return not any(_REOPEN_RE.search(s) for s in sentences[prev + 1:]) \
        and _commits(sentences[prev], n_words, computed, ctx, cut_off)


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
      One of ``RESPONSE_TYPES``.
    """
    text = clean_reply(text)
    if _is_missing(text):
        return "missing"
    if _is_hedging(text):
        return "hedging"
    if domain == "math" and extract_marked_answer(text) is not None:
        return "answer_attempt"
    lines = [" ".join(_substantive(_sentences(line))) for line in text.splitlines()]
    lines = [line for line in lines if line]
    n_asks = _n_asks(_count_asks(lines))
    if n_asks >= 2:
        return "interrogation"
    if n_asks == 1:
        return "clarification"
    if _REFUSAL_RE.search(text):
        return "refusal"
    if domain != "math":
        if _CODE_RE.search(text) or not _DISCUSSION_RE.search(text):
            return "answer_attempt"
        return "discussion"
    if _commitment(_substantive(_sentences(text)), text, _context(question, user)):
        return "answer_attempt"
    return "discussion"


def is_answer_attempt(text: str, domain: str = "math", *, question: str | None = None,
                      user: str | None = None) -> bool:
    """Whether the rule-based judge calls ``text`` an answer attempt."""
    return classify_rule_based(text, domain, question=question, user=user) == "answer_attempt"
