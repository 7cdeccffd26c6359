"""Sharding a single-turn problem into a target shard plus one-fact condition shards.

Two segmenters share one output shape, ``(target, conditions)``:

* :func:`segment_rule_based`: offline and deterministic, for GSM8K-style word problems. Sentence
  split (abbreviation- and decimal-safe), the question sentence becomes the target (a leading
  "If ..., how many ...?" clause or a trailing "... if ...?" clause is moved into a condition),
  the other sentences are split at clause boundaries (``;``, ``, and``, ``, but``, ...) when both
  sides are long enough to stand alone, and the shard count is capped by merging the shortest
  neighbours. Text is only cut, never rewritten, so every number of the question stays.
* :class:`LLMSegmenter`: the LiC protocol with our own prompts (segment, then rephrase each
  segment conversationally), run through any helper backend that has
  ``chat(conversations, *, max_new_tokens, temperature) -> list[str]`` (the local JAX model or
  an OpenAI-compatible endpoint). Its output is validated (a JSON list of shards, every number
  of the question kept, at most ``max_shards``); invalid output falls back to the rule-based
  segmenter with a warning.
"""

from __future__ import annotations

import json
import re
import warnings
from typing import Any

from jaxrl_mt.backends import ChatBackend, make_backend
from jaxrl_mt.data.numbers import has_number, number_set

_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "st", "jr", "sr", "vs", "etc", "no", "lbs", "lb", "oz", "ft", "mt",
    "approx", "min", "hr", "hrs", "sq", "mi", "yds", "yd", "prof", "inc", "co", "ave", "jan",
    "feb", "mar", "apr", "aug", "sept", "sep", "oct", "nov", "dec", "e.g", "i.e", "a.m", "p.m",
}
_SENT_END = re.compile(r"(?<=[.!?])[\"'\u201d\u2019)\]]*\s+")
_QUESTION_WORDS = (
    r"how|what|which|who|whom|whose|when|where|why|is|are|was|were|do|does|did|can|could|will|"
    r"would|should|find|calculate|determine|compute|work out"
)
_IMPERATIVE = re.compile(rf"^\s*(?:{_QUESTION_WORDS}|express|give|round|estimate)\b", re.I)
# "If X, how many ...?" -> condition X, target "How many ...?" (split at the LAST such comma).
_LEAD_CLAUSE = re.compile(
    rf",\s+(?:then\s+|so\s+)?(?=(?:(?:in|by|for|at|on|to|with|from|after|of)\s+)?(?:{_QUESTION_WORDS})\b)", re.I
)
_QUESTION_START = re.compile(rf"^(?:{_QUESTION_WORDS})\b", re.I)
_LEAD_NO_COMMA = re.compile(r"\s+(?=(?:how|what|which|who)\b)", re.I)
_LEAD_WORDS = re.compile(r"^(?:if|suppose|supposing|assuming|given)\s+(?:that\s+)?", re.I)
# "How many ... if X?" -> target "How many ...?", condition X.
_TRAIL_CLAUSE = re.compile(r",?\s+(?:if|given that|assuming|provided that)\s+", re.I)
# Clause boundaries inside a condition sentence; the connector word is dropped.
_CLAUSE_SPLIT = re.compile(
    r";\s+|,\s+(?:and then|and so|and|but then|but|while|whereas|so|then|which means)\s+"
    r"|\s+(?:and|but)\s+(?=\w+\s+\w+)", re.I
)
_MIN_CLAUSE_WORDS = 4
# A clause after a connector must open with a subject: a pronoun, a determiner or a name.
_SUBJECT_WORDS = {
    "he", "she", "they", "it", "we", "i", "you", "his", "her", "their", "its", "our", "my", "your",
    "the", "each", "every", "there", "this", "that", "these", "those", "both", "all", "some", "one",
}


def split_sentences(text: str) -> list[str]:
    """Splits text into sentences at ``.!?`` followed by whitespace, keeping abbreviations
    (``Mr.``, ``a.m.``) and decimals (``3.5``) inside their sentence."""
    text = re.sub(r"\s+", " ", text.strip())
    if not text:
        return []
    pieces, start = [], 0
    for m in _SENT_END.finditer(text):
        candidate = text[start : m.start()].rstrip()
        last = candidate.rsplit(" ", 1)[-1].rstrip(".!?\"')\u201d\u2019]").lower().lstrip("($\"'(")  # noqa: B005 (character sets)
        next_char = text[m.end() : m.end() + 1]
        if candidate.endswith(".") and (last in _ABBREVIATIONS or (len(last) == 1 and last.isalpha())):
            continue  # "Mr. Smith", "J. Doe"
        if candidate.endswith(".") and next_char and next_char.islower():
            continue  # "5 p.m. on Monday"
        pieces.append(text[start : m.end()].strip())
        start = m.end()
    if start < len(text):
        pieces.append(text[start:].strip())
    return [p for p in pieces if p]


def _cap(s: str) -> str:
    s = s.strip()
    return s[:1].upper() + s[1:] if s else s


def _end(s: str, punct: str = ".") -> str:
    s = s.strip().rstrip(",;:")
    return s if s[-1:] in ".!?\"')\u201d\u2019" else s + punct


def _n_words(s: str) -> int:
    return len(s.split())


def _pick_target(sentences: list[str]) -> int:
    """Index of the question sentence: the last with '?', else the last imperative, else last."""
    for i in range(len(sentences) - 1, -1, -1):
        if "?" in sentences[i]:
            return i
    for i in range(len(sentences) - 1, -1, -1):
        if _IMPERATIVE.match(sentences[i]):
            return i
    return len(sentences) - 1


def _split_question(q: str) -> tuple[str, list[str]]:
    """Moves a leading or trailing conditional clause of the question sentence into a condition."""
    conds = []
    lead = list(_LEAD_CLAUSE.finditer(q))
    if not lead and _LEAD_WORDS.match(q):
        # "If he has 23 kangaroos what is ...?" (no comma before the question word)
        lead = list(_LEAD_NO_COMMA.finditer(q))
    if lead:
        m = lead[-1]
        head, tail = q[: m.start()], q[m.end() :]
        if _n_words(head) >= 3 and _n_words(tail) >= 3:
            conds.append(_end(_cap(_LEAD_WORDS.sub("", head))))
            q = _cap(tail)
    trail = _TRAIL_CLAUSE.search(q)
    if trail and q.rstrip().endswith("?"):
        head, tail = q[: trail.start()], q[trail.end() :].rstrip().rstrip("?")
        if _n_words(head) >= 3 and _n_words(tail) >= 3 and not _QUESTION_START.match(tail):
            conds.append(_end(_cap(tail)))
            q = head.rstrip(",") + "?"
    return q, conds


def split_clauses(sentence: str) -> list[str]:
    """Splits a condition sentence at clause boundaries when both sides can stand alone
    (at least four words each); each piece gets a capital letter and a final period."""
    parts = [sentence]
    out: list[str] = []
    while parts:
        s = parts.pop(0)
        done = True
        for m in _CLAUSE_SPLIT.finditer(s):
            head, tail = s[: m.start()], s[m.end() :]
            if _n_words(head) >= _MIN_CLAUSE_WORDS and _n_words(tail) >= _MIN_CLAUSE_WORDS:
                connector = m.group().strip().lower()
                if connector != ";" and not _opens_clause(tail):
                    continue  # "He buys a hat for $10, and a pencil for $2": not two clauses
                if connector != ";" and _is_name(head.split()[-1]) and _is_name(tail.split()[0]):
                    continue  # "partners Mike and Johnson": a list of names
                # bare " and " / " but " only between two clauses that each carry a number
                if connector in ("and", "but") and not (has_number(head) and has_number(tail)):
                    continue
                out.append(_end(_cap(head)))
                parts.insert(0, _cap(tail))
                done = False
                break
        if done:
            out.append(_end(_cap(s)))
    return out


def _opens_clause(s: str) -> bool:
    first = s.split(maxsplit=1)[0].strip("\"'(“")
    return first.lower() in _SUBJECT_WORDS or (first[:1].isupper() and first.isalpha())


def _is_name(word: str) -> bool:
    word = word.strip(",.\"'")
    return word[:1].isupper() and word.isalpha() and word.lower() not in _SUBJECT_WORDS


def _merge_to(conds: list[str], max_conds: int) -> list[str]:
    """Merges the adjacent pair with the fewest words until ``len(conds) <= max_conds``."""
    conds = list(conds)
    while len(conds) > max(max_conds, 1):
        i = min(range(len(conds) - 1), key=lambda j: _n_words(conds[j]) + _n_words(conds[j + 1]))
        conds[i : i + 2] = [f"{conds[i]} {conds[i + 1]}"]
    return conds


def segment_rule_based(question: str, max_shards: int = 10) -> tuple[str, tuple[str, ...]]:
    """Cuts a GSM8K-style question into a target shard and one-fact condition shards.

    Args:
      question: the single-turn problem text.
      max_shards: cap on the total number of shards (target + conditions), at least 2.

    Returns:
      ``(target, conditions)``; ``1 + len(conditions) <= max_shards``. Every number of the
      question appears in the shards (the text is only cut, never rewritten).

    Raises:
      ValueError: empty question or ``max_shards < 2``.
    """
    if max_shards < 2:
        raise ValueError(f"max_shards must be >= 2, got {max_shards}")
    sentences = split_sentences(question)
    if not sentences:
        raise ValueError("empty question")
    t = _pick_target(sentences)
    target, q_conds = _split_question(sentences[t])
    conds: list[str] = []
    for i, s in enumerate(sentences):
        if i == t:
            conds.extend(q_conds)
        else:
            conds.extend(split_clauses(s))
    conds = _merge_to(conds, max_shards - 1)
    return _cap(target.strip()), tuple(conds)


# --------------------------------------------------------------------------- LLM segmenter


SEGMENT_SYSTEM = (
    "You split word problems into shards for a multi-turn conversation study. "
    "Answer with a JSON list of strings and nothing else."
)
SEGMENT_PROMPT = """Split the problem below into shards.
Rules:
- The first shard is the question itself: what is asked, with no numbers or facts if possible.
- Every other shard states exactly one fact needed to solve the problem.
- Copy every number exactly as written in the problem; every number must appear in some shard.
- Do not add facts, do not solve the problem, use at most {max_shards} shards in total.

Problem:
{question}

Answer with a JSON list of strings, the question shard first."""

REPHRASE_PROMPT = """Below is a JSON list of shards of a word problem. Rewrite each shard as a short, casual \
message a user would type in a chat, one message per shard, in the same order. Keep the meaning and keep \
every number exactly as written. The first message asks the question; the others each give one fact.

Shards:
{shards}

Answer with a JSON list of {n} strings and nothing else."""


def parse_json_list(text: str) -> list[Any]:
    """Extracts the JSON list from an LLM reply (code fences and chatter around it allowed).

    Raises:
      ValueError: no JSON list can be decoded.
    """
    text = re.sub(r"```(?:json)?", "", text)
    start, end = text.find("["), text.rfind("]")
    if start < 0 or end <= start:
        raise ValueError("no JSON list in the reply")
    value = json.loads(text[start : end + 1])
    if not isinstance(value, list):
        raise ValueError("the reply is not a JSON list")
    return value


def validate_shards(question: str, shards: Any, max_shards: int) -> tuple[str, tuple[str, ...]]:
    """Checks LLM shards: 2..max_shards non-empty strings holding every number of the question.

    Returns:
      ``(target, conditions)``.

    Raises:
      ValueError: naming the first problem found.
    """
    if not isinstance(shards, list) or not all(isinstance(s, str) and s.strip() for s in shards):
        raise ValueError("expected a JSON list of non-empty strings")
    if not 2 <= len(shards) <= max_shards:
        raise ValueError(f"expected 2..{max_shards} shards, got {len(shards)}")
    missing = number_set(question) - number_set(shards)
    if missing:
        raise ValueError(f"numbers of the question missing from the shards: {sorted(missing)}")
    shards = [s.strip() for s in shards]
    return shards[0], tuple(shards[1:])


class LLMSegmenter:
    """LiC-protocol segmentation (segment, then rephrase) through a chat backend.

    Args:
      backend: a ``jaxrl_mt.backends.ChatBackend`` (any object with ``chat(conversations, *,
        max_new_tokens, temperature)``), or a backend spec for ``make_backend`` such as
        ``"http:http://127.0.0.1:8000/v1#MODEL"`` or ``"local"``.
      max_shards: cap on the total number of shards.
      rephrase: run the second (conversational rephrasing) step.
      max_new_tokens: generation budget per call.
      temperature: sampling temperature passed to the backend.
    """

    def __init__(
        self,
        backend: ChatBackend | str,
        *,
        max_shards: int = 10,
        rephrase: bool = True,
        max_new_tokens: int = 512,
        temperature: float = 0.0,
    ):
        if isinstance(backend, str):
            backend = make_backend(backend)
        if not callable(getattr(backend, "chat", None)):
            raise TypeError("backend must have a chat(conversations, ...) method")
        self.backend = backend
        self.max_shards = max_shards
        self.rephrase = rephrase
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.fallbacks = 0  # questions that fell back to the rule-based segmenter

    def _chat(self, prompts: list[str]) -> list[str]:
        convs = [[{"role": "system", "content": SEGMENT_SYSTEM}, {"role": "user", "content": p}] for p in prompts]
        replies = self.backend.chat(convs, max_new_tokens=self.max_new_tokens, temperature=self.temperature)
        if len(replies) != len(convs):
            raise ValueError(f"backend returned {len(replies)} replies for {len(convs)} conversations")
        return list(replies)

    def segment(self, questions: list[str]) -> list[tuple[str, tuple[str, ...]]]:
        """Segments a batch of questions; one batched backend call per step.

        Returns:
          ``(target, conditions)`` per question. Invalid LLM output falls back to
          :func:`segment_rule_based` (a ``UserWarning`` names the question and the reason); an
          invalid rephrasing keeps the validated segmentation.
        """
        questions = list(questions)
        if not questions:
            return []
        replies = self._chat([SEGMENT_PROMPT.format(question=q, max_shards=self.max_shards) for q in questions])
        results: list[tuple[str, tuple[str, ...]] | None] = []
        for i, (q, r) in enumerate(zip(questions, replies)):
            try:
                results.append(validate_shards(q, parse_json_list(r), self.max_shards))
            except ValueError as e:
                warnings.warn(f"LLM segmentation of question {i} invalid ({e}); using the rule-based segmenter",
                              stacklevel=2)
                self.fallbacks += 1
                results.append(segment_rule_based(q, self.max_shards))
        if not self.rephrase:
            return results
        prompts = []
        for target, conds in results:
            shards = [target, *conds]
            prompts.append(REPHRASE_PROMPT.format(shards=json.dumps(shards, ensure_ascii=False), n=len(shards)))
        rephrased = self._chat(prompts)
        out = []
        for i, (q, seg, r) in enumerate(zip(questions, results, rephrased)):
            try:
                shards = parse_json_list(r)
                if not isinstance(shards, list) or len(shards) != 1 + len(seg[1]):
                    raise ValueError(f"expected {1 + len(seg[1])} shards, got {len(shards)}")
                out.append(validate_shards(q, shards, self.max_shards))
            except ValueError as e:
                warnings.warn(f"LLM rephrasing of question {i} invalid ({e}); keeping the segmentation", stacklevel=2)
                out.append(seg)
        return out
