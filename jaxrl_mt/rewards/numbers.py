"""Number tokens in free text: the grammar every reader of ``rewards.verifier`` shares.

Numbers understood: ``1,234`` (commas as thousands separators only), ``$5``, ``\\$5``, ``50%``
(read as 50), ``-3`` (a minus right before a digit or ``$``, not after a word or digit, so
``10-3`` is two numbers), ``3.5``, ``.5``, ``3/4``, ``\\frac{3}{4}`` (also ``\\dfrac``,
``\\tfrac``). Values that are not finite (integers of hundreds of digits, a zero denominator)
are not numbers.
"""

from __future__ import annotations

import math
import re

__all__ = ["find_numbers", "format_number", "parse_number"]

# An unsigned magnitude: thousands-separated integer or plain digits, optional decimals, or ".5".
_MAG = r"(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
# A sign is a minus (ASCII or Unicode) not glued to a preceding word, digit or closing bracket.
_SIGN = r"(?:(?<![\w)\]}])[-\u2212])"


def _number_pattern(sign: str, before_num: str) -> str:
    return (
        r"(?P<frac>(?P<fsign>" + sign + r")?\\[dt]?frac\s*"
        r"\{\s*(?P<fnum>[-\u2212]?" + _MAG + r")\s*\}\s*\{\s*(?P<fden>[-\u2212]?" + _MAG + r")\s*\})"
        r"|(?P<plain>(?P<sign>" + sign + r")?(?:\\?\$\s*(?P<sign2>[-\u2212])?)?"
        + before_num + r"(?P<num>" + _MAG + r")"
        r"(?:/(?P<den>" + _MAG + r")(?![/\d]))?"
        r"(?P<pct>\s*\\?%)?)"
    )


_NUMBER_RE = re.compile(_number_pattern(_SIGN, r"(?<![A-Za-z\d/])"))
# The same token where a string starts: its look-behinds see nothing there (always pass).
_NUMBER_AT_START_RE = re.compile(_number_pattern(r"[-\u2212]", ""))
# Wrappers allowed around a bare number in ``parse_number``.
_STRIP_RE = re.compile(r"^(?:\\\(|\\\[|\$\$?)\s*|\s*(?:\\\)|\\\]|\$\$?)$")


def _magnitude(text: str) -> float:
    """Value of a ``_MAG`` match (commas are thousands separators)."""
    return float(text.replace(",", ""))


def _signed(text: str) -> float:
    """Value of an optionally signed ``_MAG`` match."""
    if text[:1] in "-\u2212":
        return -_magnitude(text[1:])
    return _magnitude(text)


def _match_value(m: re.Match) -> float | None:
    """Numeric value of one ``_NUMBER_RE`` match (None for a zero denominator)."""
    if m.group("frac"):
        den = _signed(m.group("fden"))
        if den == 0:
            return None
        value = _signed(m.group("fnum")) / den
        return -value if m.group("fsign") else value
    value = _magnitude(m.group("num"))
    if m.group("den"):
        den = _magnitude(m.group("den"))
        if den == 0:
            return None
        value /= den
    negative = bool(m.group("sign")) != bool(m.group("sign2"))  # "-$-5" reads as +5
    return -value if negative else value


def find_numbers(text: str) -> list[float]:
    """All numbers in ``text``, in order of appearance.

    Args:
      text: free text (model output, LaTeX, markdown).

    Returns:
      The values of every number token (see the module docstring for the syntax understood).
    """
    values = []
    for m in _NUMBER_RE.finditer(text):
        value = _match_value(m)
        if value is not None and math.isfinite(value):
            values.append(value)
    return values


def format_number(value: float) -> str:
    """Normalised string of a number: ``"42"``, ``"-3"``, ``"0.75"``."""
    if value == 0:
        return "0"  # also folds -0.0
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def parse_number(s: str | float | int | None) -> float | None:
    """Parses a string that *is* one number (not a sentence holding one).

    Accepts surrounding whitespace, a trailing period, ``$...$`` / ``\\(...\\)`` math delimiters and
    the syntax listed in the module docstring: ``"1,234"``, ``"$5"``, ``"-3"``, ``"50%"``,
    ``"3/4"``, ``"\\frac{3}{4}"``. Use ``extract_answer`` to find an answer inside free text.

    Args:
      s: the string (ints and floats are passed through as floats).

    Returns:
      The value, or None if ``s`` is not a single number.
    """
    if s is None or isinstance(s, bool):
        return None
    if isinstance(s, (int, float)):
        return float(s) if math.isfinite(s) else None
    text = str(s).strip().rstrip(".").strip()
    previous = None
    while previous != text:  # peel nested delimiters such as "$\(5\)$"
        previous = text
        text = _STRIP_RE.sub("", text)
    m = _NUMBER_RE.fullmatch(text)
    if m is None:
        return None
    value = _match_value(m)
    return value if value is not None and math.isfinite(value) else None
