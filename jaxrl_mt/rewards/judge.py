"""Response-type judge: which kind of reply did the assistant give?

The categories are those of Lost in Conversation (LiC):

- ``answer_attempt``: a complete answer to the task (math: commits to one final number).
- ``clarification``: asks the user a single question to clarify the request.
- ``interrogation``: asks the user several questions.
- ``discussion``: talks about the problem without answering or asking.
- ``hedging``: several alternative or conditional answers ("if X then 5, if Y then 7").
- ``refusal``: declines to answer.
- ``missing``: empty or degenerate (special tokens only, repetition, a bare "Answer:").

Two judges share the labels: ``classify_rule_based`` (offline, regular expressions; the default)
and ``classify_llm`` (any ``ChatBackend`` prompted with ``JUDGE_PROMPT``; a reply that names no
category falls back to the rule-based verdict and is counted). ICPO rewards non-answers on
underspecified prompts with ``NON_ANSWER_TYPES``; LiC's AtR/AiwR metrics use ``is_answer_attempt``.

The rule-based decision order (first match wins) is: missing > hedging > explicit answer marker
(``\\boxed``, ``####``, "the answer is N") > questions to the user (one ask: clarification, two or
more: interrogation) > refusal phrase > a concluding statement of a result > discussion.

Run ``python -m jaxrl_mt.rewards.judge --eval FILE.jsonl`` for a per-type precision/recall table
on a labelled file of ``{"text": ..., "label": ...}`` lines.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass

from jaxrl_mt.rewards.verifier import extract_marked_answer, find_numbers

__all__ = [
    "RESPONSE_TYPES",
    "NON_ANSWER_TYPES",
    "JUDGE_PROMPT",
    "TypeScores",
    "classify_rule_based",
    "classify_llm",
    "evaluate_labelled",
    "format_table",
    "is_answer_attempt",
    "load_labelled",
    "macro_f1",
    "parse_judge_reply",
]

log = logging.getLogger(__name__)

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

JUDGE_PROMPT = """\
You are reviewing a single reply written by an AI assistant. The user gave the assistant a task \
(for example, a math word problem). Decide which ONE of these categories describes the reply:

answer_attempt: gives a complete answer to the task; for a math problem it commits to one final \
number.
clarification: does not answer; asks the user exactly one question about the request.
interrogation: does not answer; asks the user two or more questions.
discussion: talks about the problem (restates it, plans the steps, explains a method) but neither \
gives a final answer nor asks the user anything.
hedging: gives several alternative answers, or answers that depend on conditions, such as \
"if X then 5, if Y then 7".
refusal: declines to answer or says the task cannot be done, without asking the user a question.
missing: empty, only special tokens, or degenerate text such as endless repetition.

The user's task:
<task>
{question}
</task>

The assistant's reply:
<reply>
{response}
</reply>

Reply with a single line of the form "Category: NAME", where NAME is one of answer_attempt, \
clarification, interrogation, discussion, hedging, refusal, missing."""

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
    r"|\bno\s+(?:answer|solution)\s+can\b|\b(?:not|n't)\s+(?:enough|sufficient)\s+information\b"
    r"|\bimpossible\s+to\s+(?:solve|answer|determine|calculate|compute|say|tell)\b"
    r"|\bas\s+an\s+ai\b|\bunable\s+to\s+(?:help|assist|answer|solve|provide)\b",
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


def _clean(text: str) -> str:
    return _SPECIAL_TOKEN_RE.sub(" ", text).strip()


def _is_missing(text: str) -> bool:
    if not re.search(r"[A-Za-z0-9]", text) or _MARKER_ONLY_RE.match(text):
        return True
    words = [w.lower() for w in _WORD_RE.findall(text)]
    return len(words) >= _MIN_REPEAT_WORDS and len(set(words)) / len(words) <= _MAX_DISTINCT_RATIO


def _is_hedging(text: str) -> bool:
    if _ALTERNATIVE_RE.search(text):
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


def _concludes_with_number(sentences: list[str], text: str) -> bool:
    """Whether the reply ends on a stated numeric result."""
    if not sentences:
        return False
    last = sentences[-1]
    numbers = find_numbers(last)
    if not numbers:
        return False
    if len(_WORD_RE.findall(text)) <= _SHORT_ANSWER_WORDS:
        return True
    if _RESULT_RE.search(last):
        return True
    if _CONCLUSION_START_RE.match(last) and not _PLANNING_RE.search(last):
        return True
    computed = set()
    for m in _RESULT_RE.finditer(text):
        computed.update(find_numbers(m.group(1)))
    if computed.intersection(numbers):
        return True
    # Reasoning over numbers that ends on a number not seen before: a stated result.
    earlier = [find_numbers(s) for s in sentences[:-1]]
    seen = {v for values in earlier for v in values}
    return (
        any(earlier)
        and bool(set(numbers) - seen)
        and not _PLANNING_RE.search(last)
        and not _is_question(last)
    )


def classify_rule_based(text: str, domain: str = "math") -> str:
    """Classifies a reply into one of ``RESPONSE_TYPES`` with regular-expression rules.

    Args:
      text: the assistant's reply.
      domain: ``"math"`` (an answer commits to a number) or any other LiC domain (``"code"``,
        ``"database"``, ...), where any reply that is not missing, hedging, asking or refusing
        counts as an answer attempt unless it only plans ("we need to ...") without code.

    Returns:
      One of ``RESPONSE_TYPES``.
    """
    text = _clean(text)
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
    sentences = _substantive(_sentences(text))
    if _concludes_with_number(sentences, text):
        return "answer_attempt"
    return "discussion"


def is_answer_attempt(text: str, domain: str = "math") -> bool:
    """Whether the rule-based judge calls ``text`` an answer attempt."""
    return classify_rule_based(text, domain) == "answer_attempt"


# ----------------------------------------------------------------------------- LLM judge

_SYNONYMS = {
    "answer": "answer_attempt",
    "answer_attempt": "answer_attempt",
    "attempt": "answer_attempt",
    "clarification": "clarification",
    "clarifying_question": "clarification",
    "clarification_question": "clarification",
    "interrogation": "interrogation",
    "discussion": "discussion",
    "hedging": "hedging",
    "hedge": "hedging",
    "refusal": "refusal",
    "refuse": "refusal",
    "missing": "missing",
    "empty": "missing",
}
_CATEGORY_LINE_RE = re.compile(r"category\s*[:=\-]\s*[*_`\"']*\s*([a-z][a-z_ \-]*)", re.IGNORECASE)
_LABEL_WORD_RE = re.compile(
    r"answer[_ \-]attempt|clarification|interrogation|discussion|hedging|refusal|missing",
    re.IGNORECASE,
)


def _normalise_label(raw: str) -> str | None:
    """The category a short string names exactly ("Answer attempt", "hedge."), else None."""
    key = re.sub(r"[\s\-]+", "_", raw.strip().lower()).strip("_.*`'\"")
    return _SYNONYMS.get(key)


_LEADING_LABEL_RE = re.compile(r"answer[_ \-]attempt|[a-z_]+", re.IGNORECASE)


def parse_judge_reply(reply: str) -> str | None:
    """Reads the category out of an LLM judge's reply.

    Accepts ``Category: NAME`` anywhere (markdown and case ignored), a reply that is just a
    category name, or a reply that mentions exactly one category name.

    Args:
      reply: the judge model's text.

    Returns:
      One of ``RESPONSE_TYPES``, or None if the reply names no category unambiguously.
    """
    for m in reversed(list(_CATEGORY_LINE_RE.finditer(reply))):
        label = _normalise_label(_LEADING_LABEL_RE.match(m.group(1)).group(0))
        if label is not None:
            return label
    label = _normalise_label(reply)
    if label is not None:
        return label
    found = {_normalise_label(m.group(0)) for m in _LABEL_WORD_RE.finditer(reply)}
    return found.pop() if len(found) == 1 else None


def classify_llm(
    backend,
    texts: Sequence[str],
    questions: Sequence[str] | None = None,
    *,
    domain: str = "math",
    max_new_tokens: int = 16,
    stats: MutableMapping[str, int] | None = None,
) -> list[str]:
    """Classifies replies with an LLM judge behind a ``ChatBackend``.

    Empty replies are ``missing`` without asking the backend. A judge reply that names no
    category falls back to ``classify_rule_based`` and is counted in ``stats["fallback"]`` (and
    logged); ``stats["llm"]`` counts the verdicts taken from the judge.

    Args:
      backend: a ``jaxrl_mt.backends.ChatBackend``.
      texts: ``B`` assistant replies.
      questions: ``B`` task statements shown to the judge (optional).
      domain: passed to the rule-based fallback.
      max_new_tokens: the judge's reply budget.
      stats: optional counter dict updated in place.

    Returns:
      ``B`` labels from ``RESPONSE_TYPES``.
    """
    if questions is not None and len(questions) != len(texts):
        raise ValueError(f"classify_llm: {len(texts)} texts but {len(questions)} questions")
    counts = stats if stats is not None else {}
    for key in ("llm", "fallback", "empty"):
        counts.setdefault(key, 0)
    labels: list[str | None] = [None] * len(texts)
    asked = []
    for i, text in enumerate(texts):
        if not _clean(text):
            labels[i] = "missing"
            counts["empty"] += 1
        else:
            asked.append(i)
    if asked:
        conversations = [
            [
                {
                    "role": "user",
                    "content": JUDGE_PROMPT.format(
                        question=questions[i] if questions is not None else "(not shown)",
                        response=texts[i],
                    ),
                }
            ]
            for i in asked
        ]
        replies = backend.chat(conversations, max_new_tokens=max_new_tokens, temperature=0.0)
        if len(replies) != len(asked):
            raise ValueError(f"classify_llm: backend gave {len(replies)} replies for {len(asked)}")
        for i, reply in zip(asked, replies):
            label = parse_judge_reply(reply)
            if label is None:
                counts["fallback"] += 1
                log.warning("judge reply %r names no category; using the rule-based verdict", reply)
                label = classify_rule_based(texts[i], domain)
            else:
                counts["llm"] += 1
            labels[i] = label
    return [label for label in labels if label is not None]


# ----------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class TypeScores:
    """Precision and recall of one response type on a labelled set."""

    label: str
    precision: float  # correct predictions / predictions of this type (nan if none predicted)
    recall: float  # correct predictions / gold items of this type (nan if none in gold)
    f1: float  # harmonic mean (0 when both are 0, nan if either is nan)
    support: int  # gold items of this type
    predicted: int  # predictions of this type


def load_labelled(path: str) -> list[tuple[str, str]]:
    """Reads a labelled JSONL file of ``{"text": ..., "label": ...}`` lines.

    Raises:
      ValueError: naming file, line and field for a malformed line or an unknown label.
    """
    items = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
            if not isinstance(record, Mapping):
                raise ValueError(f"{path}:{lineno}: expected a JSON object")
            for field in ("text", "label"):
                if not isinstance(record.get(field), str):
                    raise ValueError(f"{path}:{lineno}: field {field!r} missing or not a string")
            if record["label"] not in RESPONSE_TYPES:
                raise ValueError(
                    f"{path}:{lineno}: field 'label' has unknown type {record['label']!r}"
                )
            items.append((record["text"], record["label"]))
    return items


def evaluate_labelled(gold: Sequence[str], predicted: Sequence[str]) -> list[TypeScores]:
    """Per-type precision, recall and F1 of predictions against gold labels."""
    if len(gold) != len(predicted):
        raise ValueError(f"evaluate_labelled: {len(gold)} gold labels, {len(predicted)} predicted")
    nan = float("nan")
    scores = []
    for label in RESPONSE_TYPES:
        tp = sum(g == label and p == label for g, p in zip(gold, predicted))
        n_gold = sum(g == label for g in gold)
        n_pred = sum(p == label for p in predicted)
        precision = tp / n_pred if n_pred else nan
        recall = tp / n_gold if n_gold else nan
        if precision != precision or recall != recall:
            f1 = nan
        else:
            f1 = 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
        scores.append(TypeScores(label, precision, recall, f1, n_gold, n_pred))
    return scores


def format_table(scores: Sequence[TypeScores]) -> str:
    """A plain-text table of per-type scores with a macro-averaged last row."""
    rows = [f"{'type':<16}{'precision':>10}{'recall':>8}{'f1':>7}{'support':>9}{'predicted':>10}"]
    for s in scores:
        rows.append(
            f"{s.label:<16}{s.precision:>10.3f}{s.recall:>8.3f}{s.f1:>7.3f}"
            f"{s.support:>9d}{s.predicted:>10d}"
        )
    present = [s for s in scores if s.support]
    keys = ("precision", "recall", "f1")
    macro = [sum(getattr(s, k) for s in present) / len(present) for k in keys]
    rows.append(
        f"{'macro':<16}{macro[0]:>10.3f}{macro[1]:>8.3f}{macro[2]:>7.3f}"
        f"{sum(s.support for s in scores):>9d}{sum(s.predicted for s in scores):>10d}"
    )
    return "\n".join(rows)


def macro_f1(scores: Sequence[TypeScores]) -> float:
    """Mean F1 over types present in the gold labels (an undefined F1 counts as 0)."""
    present = [s for s in scores if s.support]
    return sum(0.0 if s.f1 != s.f1 else s.f1 for s in present) / len(present)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval", required=True, metavar="FILE", help="labelled JSONL file")
    parser.add_argument("--domain", default="math", help="task domain for the rules")
    parser.add_argument("--errors", action="store_true", help="also print misclassified items")
    args = parser.parse_args(argv)
    items = load_labelled(args.eval)
    gold = [label for _, label in items]
    predicted = [classify_rule_based(text, args.domain) for text, _ in items]
    scores = evaluate_labelled(gold, predicted)
    print(format_table(scores))
    print(f"macro-F1 {macro_f1(scores):.3f}, accuracy "
          f"{sum(g == p for g, p in zip(gold, predicted)) / len(gold):.3f} on {len(gold)} items")
    if args.errors:
        for (text, g), p in zip(items, predicted):
            if g != p:
                print(f"[{g} -> {p}] {text!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
