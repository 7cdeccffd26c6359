"""The tests of a code task, read from its record, and how they are run in the sandbox.

Three kinds, from the task's metadata ``lic_extra`` (:func:`jaxrl_mt.tasks.base.lic_extra`):

``check`` (HumanEval; LiC's HumanEval-derived records)
  ``test`` defines ``check(candidate)``; the program is the prompt's imports and helper code, the
  extracted code, the test, then ``check(<entry_point>)``, run once. ``entry_point`` or
  ``metadata.func_name`` names the function.
``functional`` (LiveCodeBench call-based cases)
  ``public_test_cases`` (+ ``private_test_cases``) with ``testtype: "functional"``: each input is
  one JSON value per line (the arguments), the output one JSON value. One program calls
  ``Solution().<func_name>`` (or the top-level function) on every case and asserts each result.
``stdio`` (LiveCodeBench stdin/stdout cases)
  Each case runs the program on its input; the stripped stdout (trailing spaces of each line
  ignored) must equal the stripped expected output. Stops at the first failing case.

LiveCodeBench stores private cases as base64(zlib(pickle(json))): they are decoded with an
unpickler that refuses every class (so it can build only plain data) and a 64 MB cap.
"""

from __future__ import annotations

import ast
import base64
import dataclasses
import io
import json
import pickle
import zlib
from typing import Any

from jaxrl_mt.data.records import DataError, ShardedTask
from jaxrl_mt.tasks.base import lic_extra
from jaxrl_mt.tasks.sandbox import SandboxLimits, SandboxResult, run_python

__all__ = ["CodeTests", "code_tests", "run_tests"]

_MAX_DECODED = 64 << 20


@dataclasses.dataclass(frozen=True)
class CodeTests:
    """What to run against extracted code.

    Attributes:
      kind: ``"check"``, ``"functional"`` or ``"stdio"``.
      entry_point: the function to test (check, functional), else None.
      preamble: code placed before the candidate (the HumanEval prompt's imports and helpers).
      check: the HumanEval test code (defines ``check``); "" for the other kinds.
      cases: ``(input, expected output)`` pairs (functional, stdio).
    """

    kind: str
    entry_point: str | None = None
    preamble: str = ""
    check: str = ""
    cases: tuple[tuple[str, str], ...] = ()


class _DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _json_or_packed(value: Any, field: str, where: str) -> list:
    """A test-case list given as a list, JSON text, or LCB's base64(zlib(pickle(json)))."""
    if isinstance(value, list):
        return value
    if not isinstance(value, str):
        raise DataError(f"{where}: field '{field}': expected a list or text, got {type(value).__name__}")
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        pass
    try:
        raw = zlib.decompressobj().decompress(base64.b64decode(value.encode()), _MAX_DECODED)
        obj = _DataOnly(io.BytesIO(raw)).load()
        return json.loads(obj) if isinstance(obj, (str, bytes)) else obj
    except Exception as e:  # noqa: BLE001 (any decoding failure is a data error)
        raise DataError(f"{where}: field '{field}': neither JSON nor packed test cases ({type(e).__name__})") from None


def _record_meta(extra: dict, where: str) -> dict:
    meta = extra.get("metadata", {})
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except json.JSONDecodeError:
            raise DataError(f"{where}: field 'metadata': not JSON") from None
    return meta if isinstance(meta, dict) else {}


def _preamble(prompt: str, entry_point: str) -> str:
    """The prompt's top-level code except the entry function (imports, helpers)."""
    try:
        tree = ast.parse(prompt)
    except SyntaxError:
        return ""
    keep = [
        n for n in tree.body if not (isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == entry_point)
    ]
    return "\n\n".join(ast.get_source_segment(prompt, n) or ast.unparse(n) for n in keep)


def code_tests(task: ShardedTask, *, private: bool = True) -> CodeTests:
    """The tests of ``task`` (see the module doc); ``private``: include LCB private cases.

    Raises:
      DataError: the record carries no usable tests (the message names the task).
    """
    where = f"task {task.task_id!r}"
    extra = lic_extra(task)
    entry = extra.get("entry_point") or _record_meta(extra, where).get("func_name")
    if isinstance(extra.get("test"), str) and extra["test"].strip() and "def check" in extra["test"]:
        if not entry:
            raise DataError(f"{where}: field 'entry_point': missing (needed by the HumanEval test)")
        return CodeTests("check", entry, _preamble(extra.get("prompt", ""), entry), extra["test"])
    raw = []
    for field in ("public_test_cases", "private_test_cases") if private else ("public_test_cases",):
        if extra.get(field):
            raw += _json_or_packed(extra[field], field, where)
    if not raw:
        raise DataError(
            f"{where}: no tests: expected 'test' (HumanEval) or 'public_test_cases' (LiveCodeBench) in lic_extra"
        )
    kinds = {c.get("testtype", "stdin") if isinstance(c, dict) else None for c in raw}
    if None in kinds or not all(isinstance(c.get("input"), str) and isinstance(c.get("output"), str) for c in raw):
        raise DataError(f"{where}: test cases: expected objects with text 'input' and 'output'")
    if kinds == {"functional"}:
        if not entry:
            raise DataError(f"{where}: field 'metadata.func_name': missing (needed by functional tests)")
        return CodeTests("functional", entry, cases=tuple((c["input"], c["output"]) for c in raw))
    if kinds == {"stdin"}:
        return CodeTests("stdio", None, cases=tuple((c["input"], c["output"]) for c in raw))
    raise DataError(f"{where}: test cases mix or use unknown test types {sorted(map(str, kinds))}")


def _alias(code: str, entry: str) -> str:
    """``entry = <last top-level def>`` when the code defines no ``entry`` (LiC renames it too)."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return ""
    names = [n.name for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    assigned = {t.id for n in body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    defs = [n.name for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if entry in names or entry in assigned or not defs:
        return ""
    return f"\n{entry} = {defs[-1]}\n"


_FUNCTIONAL_DRIVER = """
import json as _json
_cases = {cases!r}
_target = Solution().{entry} if "Solution" in globals() else {entry}
for _i, (_inp, _out) in enumerate(_cases):
    _args = [_json.loads(_line) for _line in _inp.split("\\n") if _line.strip()]
    _got = _target(*_args)
    _got = list(_got) if isinstance(_got, tuple) else _got
    _want = _json.loads(_out)
    assert _got == _want, f"case {{_i}}: {entry}{{tuple(_args)!r}} returned {{_got!r:.200}}, expected {{_want!r:.200}}"
"""


def _norm(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def run_tests(code: str, tests: CodeTests, limits: SandboxLimits) -> SandboxResult:
    """Runs ``tests`` against ``code`` in the sandbox; returns the deciding run's result.

    A stdio mismatch becomes verdict ``failed`` with the case number, expected and actual text.
    """
    if tests.kind == "check":
        program = (f"{tests.preamble}\n\n{code}\n{_alias(code, tests.entry_point)}\n\n{tests.check}\n\n"
                   f"check({tests.entry_point})\n")
        return run_python(program, limits=limits, allow_exit=False)
    if tests.kind == "functional":
        driver = _FUNCTIONAL_DRIVER.format(cases=list(tests.cases), entry=tests.entry_point)
        return run_python(f"{code}\n{_alias(code, tests.entry_point)}\n{driver}", limits=limits, allow_exit=False)
    result = None
    for i, (inp, want) in enumerate(tests.cases):
        result = run_python(code, stdin=inp, limits=limits, allow_exit=True)
        if result.verdict != "passed":
            return dataclasses.replace(result, reason=f"case {i}: {result.reason}")
        if _norm(result.stdout) != _norm(want):
            why = f"case {i}: expected {_norm(want)[:120]!r}, got {_norm(result.stdout)[:120]!r}"
            return dataclasses.replace(result, verdict="failed", reason=why)
    if result is None:
        raise DataError("stdio tests without cases")
    return result
