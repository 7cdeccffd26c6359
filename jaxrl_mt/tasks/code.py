"""The LiC code task: extract Python from a reply, run the task's tests in the sandbox.

Usage::

    from jaxrl_mt.data.loaders import load_source
    from jaxrl_mt.tasks import get_task

    code = get_task("code")                      # a CodeTask, registered on import
    task = load_source("humaneval:@:1")[0]
    reply = "Here is the code:\\n```python\\n" + task.answer + "\\n```"
    code.verify(reply, task)      # Verdict(score=1.0, extracted=..., status="passed", reason="")
    code.is_answer_attempt("Could you tell me the input format?", task)   # False

Records: HumanEval (``load_source("humaneval:@")``) and LiC code records
(``load_lic(path, task="code")``: HumanEval-derived ones with ``prompt``/``test``/
``metadata.func_name``, LiveCodeBench ones with ``public_test_cases`` run as stdin/stdout or
call-based cases); see :mod:`jaxrl_mt.tasks.code_tests`. Every candidate program runs in
:mod:`jaxrl_mt.tasks.sandbox`, never in this process.

Extraction (:func:`extract_code`): the last fenced Python block that defines a function or class
(else the last fenced Python block; a fence tagged with another language is skipped, an untagged
one counts when it parses; an unclosed final fence runs to the end of the reply); without
fences, the whole reply when it parses and looks like code (a def, class, import, assignment or
control statement: a bare word or phrase parses too, but is not code), else the reply from its
first ``def``/``class``/``import``/``from`` line when that parses; else None.

Known limit: HumanEval's tests compare with ``==``, so a candidate returning an object whose
``__eq__`` always says True passes (as in the original harness and in LiC).
"""

from __future__ import annotations

import ast
import re

from jaxrl_mt.data.records import DataError, ShardedTask
from jaxrl_mt.tasks.base import MAX_REPLY_CHARS, Verdict, oversized
from jaxrl_mt.tasks.code_tests import CodeTests, code_tests, run_tests
from jaxrl_mt.tasks.fences import fence_tag, line_fences
from jaxrl_mt.tasks.sandbox import SandboxLimits

__all__ = ["CODE_SYSTEM_PROMPT", "CodeTask", "extract_code", "looks_like_code"]

CODE_SYSTEM_PROMPT = (
    "You are a helpful assistant who writes Python code. When you give a solution, write the "
    "complete code in a single ```python fenced block: the whole function definition (or the "
    "whole program, when the task reads standard input and prints the answer) together with "
    "every import it needs. Keep the function name and parameters the user asked for."
)

_PY_TAGS = {"", "python", "py", "python3", "py3"}
_CODE_START = re.compile(r"^(def |async def |class |import |from \S+ import )", re.MULTILINE)
_CODE_NODES = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Import,
    ast.ImportFrom,
    ast.Assign,
    ast.AugAssign,
    ast.AnnAssign,
    ast.For,
    ast.While,
    ast.If,
    ast.With,
    ast.Try,
    ast.Return,
)


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _defines(tree: ast.Module | None) -> bool:
    return tree is not None and any(
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in tree.body
    )


def looks_like_code(code: str) -> bool:
    """Parses, and has at least one statement that is more than a bare expression."""
    tree = _parse(code)
    return tree is not None and any(isinstance(n, _CODE_NODES) for n in tree.body)


def _fenced(reply: str) -> list[str]:
    """Python blocks of ``reply`` in order (tagged python, or untagged and parseable)."""
    out = []
    for info, block in line_fences(reply):  # linear: no regular expression to backtrack
        tag, body = fence_tag(info).lower(), block.rstrip()
        if tag not in _PY_TAGS or not body.strip():
            continue
        if tag == "" and _parse(body) is None:
            continue
        out.append(body)
    return out


def extract_code(reply: str) -> str | None:
    """The code of ``reply`` (see the module doc), or None (also for a reply over ``MAX_REPLY_CHARS``)."""
    if not isinstance(reply, str) or not reply.strip() or len(reply) > MAX_REPLY_CHARS:
        return None
    blocks = _fenced(reply)
    if blocks:
        with_defs = [b for b in blocks if _defines(_parse(b))]
        return (with_defs or blocks)[-1]
    if "```" in reply:
        return None
    if looks_like_code(reply):
        return reply.strip("\n")
    m = _CODE_START.search(reply)
    if m and looks_like_code(reply[m.start() :]):
        return reply[m.start() :].strip("\n")
    return None


class CodeTask:
    """The ``code`` task (see the module doc).

    Args:
      limits: sandbox limits of each run (a HumanEval check is one run; a stdio task one run per
        case); default: a 6 s timeout (LiC's), the other :class:`SandboxLimits` defaults.
      private_tests: also run LiveCodeBench private cases when a record has them.
    """

    name = "code"
    system_prompt = CODE_SYSTEM_PROMPT

    def __init__(self, limits: SandboxLimits | None = None, private_tests: bool = True):
        self.limits = limits or SandboxLimits(timeout_s=6.0)
        self.private_tests = private_tests

    def tests(self, task: ShardedTask) -> CodeTests:
        """The tests of ``task`` (raises DataError naming the task when it has none)."""
        return code_tests(task, private=self.private_tests)

    def extract(self, reply: str, task: ShardedTask) -> str | None:
        return extract_code(reply)

    def verify(self, reply: str, task: ShardedTask) -> Verdict:
        """Score 1 when the extracted code passes every test in the sandbox, else 0.

        Status: the sandbox verdict (passed, failed, timeout, crashed, rejected); ``rejected``
        with reason "no code in the reply" when nothing was extracted; ``unparsable`` for a
        reply over ``MAX_REPLY_CHARS``.

        Raises:
          DataError: the task has no tests.
        """
        tests = self.tests(task)
        too_long = oversized(reply)
        if too_long is not None:
            return too_long
        code = self.extract(reply, task)
        if code is None:
            return Verdict(0.0, None, "rejected", "no code in the reply")
        r = run_tests(code, tests, self.limits)
        return Verdict(1.0 if r.verdict == "passed" else 0.0, code, r.verdict, r.reason)

    def is_answer_attempt(self, reply: str, task: ShardedTask) -> bool:
        """The reply holds parseable code that defines a function or class (for a stdin/stdout
        task: any parseable program with a real statement); discussion alone is not."""
        code = self.extract(reply, task)
        if code is None:
            return False
        if _defines(_parse(code)):
            return True
        try:
            stdio = self.tests(task).kind == "stdio"
        except DataError:
            stdio = False
        return stdio and looks_like_code(code)
