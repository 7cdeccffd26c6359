"""Matching brackets in untrusted text in linear time, without recursion (JSON or Python tokens).

The call scanners of :mod:`jaxrl_mt.tasks.calls` ask, for an opening bracket at position ``i``,
where the value (JSON) or the call (Python) that starts there closes, as a parser started at
``i`` would see it: brackets inside strings (and, for Python, comments) do not count, a closing
bracket of the wrong kind or an unterminated string ends every bracket still open, and nesting
deeper than ``max_depth`` fails the outermost one.

One pass from ``i`` resolves every opener it meets outside a string (a parser started at such
an opener is in the same state as the pass there, so its answer is the pass's), and keeps going
while any of them is open; an opener the pass saw inside a string gets its own pass when asked
for. The passes together examine at most ``budget_per_char`` characters per character of the
text (then every opener not yet resolved counts as unmatched), so the whole scan is linear.
"""

from __future__ import annotations

import re

__all__ = ["BracketMatcher", "json_matcher", "python_matcher"]

_PAIRS = {")": "(", "]": "[", "}": "{"}

# JSON strings cannot hold raw control characters, so an unterminated one stops at the line.
_JSON_TOKENS = re.compile(r'(?P<s>"(?:[^"\\\x00-\x1f]|\\[^\x00-\x1f])*")|(?P<bad>")|(?P<b>[\[\]{}])')
# Python: triple-quoted strings may span lines; single-quoted ones end at the line unless a
# backslash continues them; comments run to the end of the line.
_PY_TOKENS = re.compile(
    r"(?P<s>'''(?:[^'\\]|\\[\s\S]|'(?!''))*'''|\"\"\"(?:[^\"\\]|\\[\s\S]|\"(?!\"\"))*\"\"\")"
    r"|(?P<bad>'''|\"\"\")"
    r"|(?P<s1>'(?:[^'\\\n\r]|\\(?:\r\n|[\s\S]))*'|\"(?:[^\"\\\n\r]|\\(?:\r\n|[\s\S]))*\")"
    r"|(?P<bad1>['\"])|(?P<c>\#[^\n]*)|(?P<b>[()\[\]{}])"
)


class BracketMatcher:
    """Where each opening bracket of one text closes (see the module doc).

    Args:
      text: the text.
      tokens: a regex whose groups name strings/comments (skipped), ``bad`` / ``bad1``
        (an unterminated string: fails every open bracket) and ``b`` (a bracket).
      max_depth: deepest nesting a parser accepts.
      budget_per_char: characters the passes may examine per character of ``text``.
    """

    def __init__(self, text: str, tokens: re.Pattern, *, max_depth: int, budget_per_char: int = 8):
        self.text, self.tokens, self.max_depth = text, tokens, max_depth
        self.budget = budget_per_char * len(text) + 4096
        self._close: dict[int, int] = {}  # opener position -> closer position, or -1

    def close(self, i: int) -> int:
        """The position of the bracket closing the opener at ``i`` (-1: it never closes)."""
        if i not in self._close:
            self._pass(i)
        return self._close.get(i, -1)

    def _pass(self, start: int) -> None:
        """One pass from ``start`` until no bracket it opened is open."""
        if self.budget <= 0:
            self._close[start] = -1
            return
        stack: list[int] = []
        end = len(self.text)
        for m in self.tokens.finditer(self.text, start):
            kind = m.lastgroup
            if kind == "b":
                ch, pos = m.group(), m.start()
                if ch in "([{":
                    stack.append(pos)
                    if len(stack) > self.max_depth:
                        self._close.setdefault(stack.pop(0), -1)  # its parser is too deep here
                elif stack and self.text[stack[-1]] == _PAIRS[ch]:
                    self._close.setdefault(stack.pop(), pos)
                else:
                    self._fail(stack)
            elif kind in ("bad", "bad1"):
                self._fail(stack)
            if not stack:
                end = m.end()
                break
        self.budget -= end - start
        self._fail(stack)

    def _fail(self, stack: list[int]) -> None:
        for p in stack:
            self._close.setdefault(p, -1)
        stack.clear()


def json_matcher(text: str, max_depth: int) -> BracketMatcher:
    """A matcher with JSON's string rules."""
    return BracketMatcher(text, _JSON_TOKENS, max_depth=max_depth)


def python_matcher(text: str, max_depth: int = 200) -> BracketMatcher:
    """A matcher with Python's string and comment rules (200: the tokenizer's nesting limit)."""
    return BracketMatcher(text, _PY_TOKENS, max_depth=max_depth)
