"""Numeric answer extraction and verification for math word problems.

One verifier serves RLSTA training rewards and the LiC evaluator, in two modes:

- ``strict`` (the LiC harness): the single extracted answer must equal the gold number, up to a
  relative tolerance of 1e-6.
- ``lenient`` (RLSTA's released code): any of the last three numbers in the text is within 1e-3
  (absolute) of the gold number.

Extraction priority (``extract_answer``): the last ``\\boxed{...}`` (nested braces handled) >
the later of the last ``#### x`` and the last "the answer is x" / "final answer: x" (a final "The
answer is 15." outranks a stray "#### 1" line before it, and a final "#### 15" an earlier answer
phrase) > the last number in the text. A marker whose span holds no number is skipped, and the
next priority is tried. A reply longer than ``MAX_CHECKED_CHARS`` holds no answer (every scan
here is linear, nothing recurses). After a ``####`` or answer-phrase marker the value is the first
number that follows, unless the marker is followed directly by an equation: then its result ("The
answer is 2024-18=2006" reads 2006, not 2024; "The answer is 12 because 3+4=7" still reads 12).

Lenient mode refuses a reply that offers several different final candidates: explicit markers
that disagree ("The answer is 12 ... #### 14"), or alternatives in the final sentence ("12 or
14", "either 12 or 14", a range "85-90" or "between 10 and 20"). Listing candidates would
otherwise game "any of the last three numbers".

Numbers understood: see ``rewards.numbers`` (``1,234``, ``$5``, ``50%``, ``-3``, ``3/4``,
``\\frac{3}{4}`` ...). Extracted answers are returned as normalised numeric strings: integers
without a decimal point (``"1234"``), other values as Python's shortest round-trip float (``"0.75"``).

Every reader here reads the answer after a think block (``rewards.think.answer_part``: the text
after the last ``</think>``; a think block left open holds no answer).
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Sequence

import numpy as np

from jaxrl_mt.rewards.alternatives import final_sentence, offers_alternatives
from jaxrl_mt.rewards.numbers import (
    _NUMBER_AT_START_RE,
    _NUMBER_RE,
    _match_value,
    find_numbers,
    format_number,
    parse_number,
)
from jaxrl_mt.rewards.think import answer_part

__all__ = [
    "MODES",
    "STRICT_REL_TOL",
    "LENIENT_ABS_TOL",
    "LENIENT_LAST_K",
    "MAX_CHECKED_CHARS",
    "boxed_contents",
    "extract_answer",
    "extract_marked_answer",
    "find_numbers",
    "format_number",
    "offers_several_candidates",
    "parse_number",
    "verify",
    "verify_batch",
    "verify_both",
]

MODES = ("strict", "lenient")
STRICT_REL_TOL = 1e-6  # relative tolerance of strict mode (LiC harness: numeric equality)
LENIENT_ABS_TOL = 1e-3  # absolute tolerance of lenient mode (RLSTA's released code)
LENIENT_LAST_K = 3  # lenient mode looks at this many trailing numbers
MAX_CHECKED_CHARS = 100_000  # longer replies are not read (no answer): every checker stops here

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE_RE = re.compile(r"[{}]")
_BOXED_BUDGET = 4  # box contents read per character of the reply (only boxes nested in boxes reach it)
_HASH_RE = re.compile(r"####")
# "answer" as a noun ("The answer is", "Final answer:"), not the verb ("before I answer: is ...").
_ANSWER_RE = re.compile(
    r"(?<!\bI\s)(?<!\bto\s)(?<!\bwe\s)(?<!\byou\s)(?<!\bcan\s)(?<!\bwill\s)(?<!\bnot\s)"
    r"\banswer\b[\s*_]*(?:is\b|:|=)",
    re.IGNORECASE,
)
# Arithmetic right after a marker, up to its last '=': numbers, operators, brackets, spaces only.
_EQUATION_RE = re.compile(r"[\s$\d.,+\-\u2212*/x\u00d7\u00f7()^]*=(?:[\s$\d.,+\-\u2212*/x\u00d7\u00f7()^]*=)*")


def _boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` (balanced braces), in order (one pass over the braces)."""
    closes: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE_RE.finditer(text):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            closes[stack.pop()] = m.start()
    return [text[m.end() : closes[m.end() - 1]] for m in _BOXED_RE.finditer(text) if m.end() - 1 in closes]


def boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` / ``\\fbox{...}`` of ``text`` (balanced braces), in order."""
    return _boxed_contents(text)


def _last_number(span: str) -> float | None:
    numbers = find_numbers(span)
    return numbers[-1] if numbers else None


def _first_valid(text: str, pos: int, end: int) -> float | None:
    """The first finite value of the number tokens found from ``pos`` to ``end``."""
    for m in _NUMBER_RE.finditer(text, pos, end):
        value = _match_value(m)
        if value is not None and math.isfinite(value):
            return value
    return None


class _Span:
    """``_first_number(text[pos:line end])`` without copying the line: the value from ``pos`` up
    to ``end`` (where the next marker of the line starts: no number crosses a marker), else
    ``tail`` (the value after that marker)."""

    def __init__(self, text: str, end: int, tail: float | None):
        self.text, self.end, self.tail = text, end, tail

    def first(self, pos: int) -> float | None:
        m = _NUMBER_AT_START_RE.match(self.text, pos, self.end)
        if m is not None:
            value = _match_value(m)
            if value is not None and math.isfinite(value):
                return value
        value = _first_valid(self.text, m.end() if m is not None else pos + 1, self.end)
        return self.tail if value is None else value


def _marker_hits(text: str, marker: re.Pattern) -> list[tuple[int, float]]:
    """``(start, value)`` of each ``marker`` match with a value (the first number on the rest of its
    line, or an equation's result: "2024 - 18 = 2006" reads 2006), last match first. Linear: each
    stretch between two markers of a line is read a bounded number of times."""
    newlines = [m.start() for m in re.finditer("\n", text)]
    hits: list[tuple[int, float]] = []
    nxt: tuple[int, int, float | None] | None = None  # (line end, next marker's start, its full-scan value)
    for m in reversed(list(marker.finditer(text))):
        k = m.end()
        i = bisect.bisect_left(newlines, k)
        line_end = newlines[i] if i < len(newlines) else len(text)
        same_line = nxt is not None and nxt[0] == line_end
        end, tail = (nxt[1], nxt[2]) if same_line else (line_end, None)
        span = _Span(text, end, tail)
        value = None
        eq = _EQUATION_RE.match(text, k, end)
        if eq is not None:
            value = span.first(eq.end())
        if value is None:
            value = span.first(k)
        if value is not None:
            hits.append((m.start(), value))
        full = _first_valid(text, k, end)
        nxt = (line_end, m.start(), tail if full is None else full)
    return hits


def _boxed_values(text: str) -> list[float]:
    """The value of each ``\\boxed{...}`` holding a number (its last one), last box first."""
    values, budget = [], _BOXED_BUDGET * len(text) + 1000
    for c in reversed(_boxed_contents(text)):
        budget -= len(c)
        if budget < 0:
            break  # boxes nested thousands deep: the innermost ones were read
        v = _last_number(c)
        if v is not None:
            values.append(v)
    return values


def _marked_values(text: str) -> list[float]:
    """Every explicit answer's value: boxed (last first), then ####, then answer phrases (each last
    first). ``offers_several_candidates`` compares them; ``_marked_value`` picks the answer."""
    values = _boxed_values(text)
    for marker in (_HASH_RE, _ANSWER_RE):
        values += [v for _, v in _marker_hits(text, marker)]
    return values


def _marked_value(text: str) -> float | None:
    """The explicit answer's value, if any: the last boxed one; else whichever of the last ####
    line and the last answer phrase comes later ("#### 1\\nThe answer is 15." reads 15: a stray
    "####" line before the final sentence does not outrank it; "The answer is 4.\\n#### 5" reads 5)."""
    boxed = _boxed_values(text)
    if boxed:
        return boxed[0]
    last = [hits[0] for hits in (_marker_hits(text, _HASH_RE), _marker_hits(text, _ANSWER_RE)) if hits]
    return max(last)[1] if last else None


def offers_several_candidates(text: str) -> bool:
    """Whether a reply offers more than one final answer: explicit markers with different values,
    or alternatives ("12 or 14") or a range ("85-90", "between 10 and 20") in its final sentence."""
    if len(text) > MAX_CHECKED_CHARS:
        return False
    text = answer_part(text)
    marked = _marked_values(text)
    if any(not math.isclose(v, marked[0], rel_tol=STRICT_REL_TOL, abs_tol=1e-12) for v in marked[1:]):
        return True
    sentence = final_sentence(text)
    return sentence is not None and offers_alternatives(sentence)


def _extract_value(text: str) -> float | None:
    """The answer's value following the extraction priority (see module docstring)."""
    value = _marked_value(text)
    return _last_number(text) if value is None else value


def extract_marked_answer(text: str) -> str | None:
    """Like ``extract_answer`` but only from an explicit marker (boxed, ####, "answer is").

    Args:
      text: a model response.

    Returns:
      The normalised numeric string, or None if no marker is followed by a number.
    """
    value = _marked_value(answer_part(text)) if len(text) <= MAX_CHECKED_CHARS else None
    return None if value is None else format_number(value)


def extract_answer(text: str) -> str | None:
    """Extracts the final numeric answer of a response.

    Priority: (1) the last ``\\boxed{...}``, wherever it stands; else (2) the last final-answer
    marker of the text, ``#### x`` or "the answer is x" / "final answer: x" (case-insensitive; the
    first number on the rest of that line): whichever of the two kinds comes last wins, so
    "#### 1\\nThe answer is 15." reads 15 and "The answer is 4.\\n#### 5" reads 5; else (3) the
    last number in the text.

    Args:
      text: a model response.

    Returns:
      The normalised numeric string (``"1234"``, ``"0.75"``, ``"-3"``), or None if the text holds
      no number.
    """
    value = _extract_value(answer_part(text)) if len(text) <= MAX_CHECKED_CHARS else None
    return None if value is None else format_number(value)


def _gold_value(gold: str | float | int) -> float:
    """The gold answer's value: a bare number, or else extracted like a response."""
    value = parse_number(gold)
    if value is None and isinstance(gold, str):
        value = _extract_value(gold)
    if value is None:
        raise ValueError(f"gold answer {gold!r} holds no number")
    return value


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown verification mode {mode!r}; expected one of {MODES}")


def _verify_value(text: str, gold_value: float, mode: str) -> float:
    if len(text) > MAX_CHECKED_CHARS:
        return 0.0
    text = answer_part(text)
    if mode == "strict":
        value = _extract_value(text)
        ok = value is not None and math.isclose(
            value, gold_value, rel_tol=STRICT_REL_TOL, abs_tol=1e-12
        )
    else:
        tail = find_numbers(text)[-LENIENT_LAST_K:]
        ok = any(abs(v - gold_value) <= LENIENT_ABS_TOL for v in tail) and not offers_several_candidates(text)
    return 1.0 if ok else 0.0


def verify(text: str, gold: str | float | int, mode: str = "strict") -> float:
    """Scores one response against the gold answer.

    Args:
      text: the model response.
      gold: the gold answer, e.g. ``"72"``, ``"1,000"``, ``"3/4"`` or a GSM8K solution ending in
        ``#### 72``.
      mode: ``"strict"`` (extracted answer equals gold, relative tolerance 1e-6) or ``"lenient"``
        (any of the last three numbers within 1e-3 of gold, and not several final candidates).

    Returns:
      1.0 if correct, else 0.0.

    Raises:
      ValueError: unknown ``mode``, or a gold answer that holds no number.
    """
    _check_mode(mode)
    return _verify_value(text, _gold_value(gold), mode)


def verify_batch(
    texts: Sequence[str], golds: Sequence[str | float | int], mode: str = "strict"
) -> np.ndarray:
    """Scores a batch of responses.

    Args:
      texts: ``B`` responses.
      golds: ``B`` gold answers.
      mode: ``"strict"`` or ``"lenient"`` (see ``verify``).

    Returns:
      ``[B]`` float32 array of 0/1 scores.
    """
    _check_mode(mode)
    if len(texts) != len(golds):
        raise ValueError(f"verify_batch: {len(texts)} texts but {len(golds)} gold answers")
    scores = [_verify_value(t, _gold_value(g), mode) for t, g in zip(texts, golds)]
    return np.asarray(scores, dtype=np.float32)  # [B]


def verify_both(text: str, gold: str | float | int) -> dict[str, float]:
    """Scores one response in both modes: ``{"strict": s, "lenient": l}``."""
    gold_value = _gold_value(gold)
    return {mode: _verify_value(text, gold_value, mode) for mode in MODES}
