"""Fenced blocks of a reply (```` ``` ````), found in one linear pass.

The regular expressions these scanners replace backtracked on a fence that never ends its first
line: ``"```" + " " * 99_000`` cost 26.8 s of CPU in the database checker and 7.4 s in the code
checker (issue 53, failure 3). Each scanner here finds exactly what its regular expression found
(``tests/tasks/test_linear_checkers.py`` compares them on random text), with every character
read a bounded number of times.
"""

from __future__ import annotations

import re

__all__ = ["backtick_fences", "fence_tag", "line_fences"]

_CODE_TAG = re.compile(r"[ \t]*([\w+.-]*)")  # a greedy match at the start: nothing to backtrack into


def fence_tag(info: str, tag: re.Pattern = _CODE_TAG) -> str:
    """The language tag at the start of a fence's first line (``" python3 x"`` -> ``"python3"``)."""
    return tag.match(info).group(1)


def backtick_fences(text: str) -> list[tuple[str, str]]:
    """``(info, body)`` of each fence as ``re.finditer(r"```([^\\n`]*)\\n(.*?)(?:```|\\Z)", text,
    re.S)`` finds them: a fence opens at any ```` ``` ```` whose rest of line holds no backtick,
    and runs to the next ```` ``` ```` or the end of the text."""
    out: list[tuple[str, str]] = []
    pos, nl = 0, -1
    while True:
        i = text.find("```", pos)
        if i < 0:
            return out
        j = i + 3
        if nl < j:  # the first newline at or after j (kept while it still is)
            nl = text.find("\n", j)
            if nl < 0:
                return out  # no newline after this point: no fence can open
        if text.find("`", j, nl) >= 0:
            pos = i + 1  # stops at the first backtick: the text up to it is not read again
            continue
        close = text.find("```", nl + 1)
        out.append((text[j:nl], text[nl + 1 :] if close < 0 else text[nl + 1 : close]))
        if close < 0:
            return out
        pos = close + 3


def _is_closer(line: str) -> bool:
    return line.strip(" \t") == "```"


def line_fences(text: str) -> list[tuple[str, str]]:
    """``(info, body)`` of each fence as ``re.finditer(r"^[ \\t]*```([^\\n]*)\\n(.*?)(?:^[ \\t]*```[ \\t]*$|\\Z)",
    text, re.S | re.M)`` finds them: a fence opens on a line starting (after spaces or tabs) with
    ```` ``` ```` and runs to the next line that is only ```` ``` ```` (and spaces or tabs), or to
    the end of the text."""
    out: list[tuple[str, str]] = []
    pos = 0
    while True:
        eol = text.find("\n", pos)
        if eol < 0:
            return out  # an opening line needs its newline
        head = text[pos:eol].lstrip(" \t")
        if not head.startswith("```"):
            pos = eol + 1
            continue
        start = q = eol + 1
        while True:
            end = text.find("\n", q)
            if _is_closer(text[q:] if end < 0 else text[q:end]):
                out.append((head[3:], text[start:q]))
                break
            if end < 0:
                out.append((head[3:], text[start:]))
                return out
            q = end + 1
        if end < 0:
            return out
        pos = end + 1
