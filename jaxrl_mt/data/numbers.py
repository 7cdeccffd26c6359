"""Finding, normalizing and rewriting the numbers written in digits in a text.

One number regex is shared by the segmenter (which must keep every number), the corruption
(which must change some) and the reports, so they all agree on what "a number" is.
Numbers are digit strings with optional thousands commas and decimals (``1,200``, ``3.5``,
``.75``); a sign, a currency symbol or a unit around them is not part of the number.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation

# Thousands groups only when followed by exactly three digits; not glued to letters before.
NUMBER_RE = re.compile(r"(?<![\w.,])(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|(?<![\w.,\d])\.\d+")


def find_numbers(text: str) -> list[re.Match]:
    """All number matches in ``text``, left to right."""
    return list(NUMBER_RE.finditer(text))


def normalize_number(s: str) -> str:
    """Canonical form: commas dropped, trailing decimal zeros dropped (``"8.00"`` -> ``"8"``)."""
    s = s.replace(",", "")
    try:
        d = Decimal(s).normalize()
    except InvalidOperation:
        return s
    out = format(d, "f")
    return out


def number_list(text: str) -> list[str]:
    """Normalized numbers of ``text`` in order, repeats kept."""
    return [normalize_number(m.group()) for m in find_numbers(text)]


def number_set(text: str | Iterable[str]) -> set[str]:
    """Normalized set of numbers in a text (or in several texts together)."""
    if not isinstance(text, str):
        text = "\n".join(text)
    return set(number_list(text))


def has_number(text: str) -> bool:
    return NUMBER_RE.search(text) is not None


def parse_number(s: str) -> Decimal:
    """The value of a number string (commas allowed)."""
    return Decimal(s.replace(",", ""))


def format_like(value: Decimal, template: str) -> str:
    """Writes ``value`` in the style of ``template``: same decimals, commas if it had them.

    Args:
      value: the number to write.
      template: the original number string (e.g. ``"1,250"`` or ``"0.99"``).
    """
    places = len(template.split(".")[1]) if "." in template else 0
    q = Decimal(1).scaleb(-places)
    v = value.quantize(q)
    if "," in template:
        s = f"{v:,.{places}f}"
    else:
        s = f"{v:.{places}f}"
    if template.startswith(".") and s.startswith("0."):
        s = s[1:]
    return s
