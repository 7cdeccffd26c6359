"""The code task through the full path: reply text -> extract -> sandbox -> verdict.

HumanEval: all 164 canonical solutions must pass, and solutions with every ``return`` emptied
must fail on at least 95% of the problems (both about 25 s together on 2 cores, so they stay in
the default run). LiveCodeBench-style records
(stdin/stdout and call-based cases, packed private cases) load through ``load_lic`` and run.
"""

from __future__ import annotations

import ast
import base64
import json
import os
import pickle
import zlib

import pytest

from jaxrl_mt.data.loaders import DataError, load_lic, load_source
from jaxrl_mt.data.records import ShardedTask
from jaxrl_mt.tasks import CodeTask, Task, get_task, lic_extra
from jaxrl_mt.tasks.code import extract_code
from jaxrl_mt.tasks.sandbox import SandboxLimits

CODE = CodeTask(limits=SandboxLimits(timeout_s=3.0))


@pytest.fixture(scope="module")
def humaneval():
    return load_source("humaneval:@")


def _reply(code: str) -> str:
    return f"Here is the code:\n```python\n{code}\n```"


def _mutated(source: str, entry: str) -> str:
    """The program with every ``return X`` of the entry function turned into ``return None``."""
    tree = ast.parse(source)
    fn = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry][-1]
    for node in ast.walk(fn):
        if isinstance(node, ast.Return):
            node.value = ast.Constant(None)
    return ast.unparse(tree)


def _canonical(tasks):
    return {t.task_id: CODE.verify(_reply(t.answer), t) for t in tasks}


def _mutation_failures(tasks):
    return {t.task_id: CODE.verify(_reply(_mutated(t.answer, lic_extra(t)["entry_point"])), t) for t in tasks}


def test_registered_as_code():
    task = get_task("code")
    assert isinstance(task, CodeTask) and isinstance(task, Task) and task.name == "code"
    assert "```python" in task.system_prompt


@pytest.mark.slow  # the suite budget (issue 52): 36 s; the sandbox stays in CI through test_sandbox*
def test_canonical_solutions_pass_all_164(humaneval):
    verdicts = _canonical(humaneval)
    assert len(verdicts) == 164
    assert {k: (v.status, v.reason) for k, v in verdicts.items() if v.score != 1.0} == {}
    assert all(v.status == "passed" and "def " in v.extracted for v in verdicts.values())


@pytest.mark.slow  # 39 s: the suite budget (issue 52); canonical solutions and hostile replies stay in CI
def test_mutated_solutions_fail_on_at_least_95_percent(humaneval):
    verdicts = _mutation_failures(humaneval)
    failed = [k for k, v in verdicts.items() if v.score == 0.0]
    assert len(failed) / 164 >= 0.95, [k for k, v in verdicts.items() if v.score]
    assert all(verdicts[k].status in ("failed", "crashed", "timeout") for k in failed)
    assert sum(verdicts[k].status == "failed" for k in failed) > 140  # mostly a failed assertion, not a crash


def test_failed_test_names_the_assertion(humaneval):
    t = humaneval[0]
    wrong = t.answer.replace("if distance < threshold:", "if distance <= 0:")
    v = CODE.verify(_reply(wrong), t)
    assert (v.score, v.status) == (0.0, "failed") and v.reason.startswith("line ") and "assert candidate(" in v.reason


def test_verify_statuses_for_no_code_bad_code_and_loops(humaneval):
    t = humaneval[0]
    assert CODE.verify("I would loop over all pairs of numbers.", t).status == "rejected"
    assert (
        CODE.verify("```python\ndef has_close_elements(numbers, threshold):\n    return (\n```", t).status == "rejected"
    )
    quick = CodeTask(limits=SandboxLimits(timeout_s=1.0))
    loop = quick.verify(_reply("def has_close_elements(numbers, threshold):\n    while True:\n        pass"), t)
    assert (loop.score, loop.status) == (0.0, "timeout")
    early = CODE.verify(
        _reply("import sys\ndef has_close_elements(numbers, threshold):\n    return True\nsys.exit(0)"), t
    )
    assert (early.score, early.status) == (0.0, "crashed")  # leaving before check() runs never passes


def test_function_under_another_name_is_tested_like_lic(humaneval):
    t = humaneval[0]
    renamed = t.answer.replace("def has_close_elements(", "def close_pair(")
    assert CODE.verify(_reply(renamed), t).score == 1.0


def test_helpers_from_the_prompt_are_available(humaneval):
    t = humaneval[10]  # make_palindrome uses the prompt's is_palindrome
    solution = t.answer[t.answer.index("def make_palindrome") :]
    assert "def is_palindrome" not in solution
    assert CODE.verify(_reply(solution), t).score == 1.0


def test_extraction_cases():
    two = "First try:\n```python\ndef f():\n    return 1\n```\nBetter:\n```python\ndef f():\n    return 2\n```\nDone."
    assert extract_code(two) == "def f():\n    return 2"
    usage = "```python\ndef f():\n    return 2\n```\nUse it like this:\n```python\nprint(f())\n```"
    assert extract_code(usage) == "def f():\n    return 2"  # a later usage snippet does not win over the function
    assert extract_code("```bash\npip install x\n```\n```\ndef g(x):\n    return x\n```") == "def g(x):\n    return x"
    assert extract_code("def f(x):\n    return x + 1\n") == "def f(x):\n    return x + 1"
    assert extract_code("Sure, here it is:\ndef f(x):\n    return x + 1\n") == "def f(x):\n    return x + 1"
    assert extract_code("```python\ndef f(x):\n    return x") == "def f(x):\n    return x"  # unclosed final fence
    assert extract_code("The answer is to sort the list and compare neighbours.") is None
    assert extract_code("Yes") is None and extract_code("sorted") is None  # parse as Python, but are not code
    assert extract_code("") is None
    assert extract_code("```text\njust words\n```") is None


def test_is_answer_attempt(humaneval):
    t = humaneval[0]
    assert CODE.is_answer_attempt(_reply(t.answer), t)
    assert CODE.is_answer_attempt("def has_close_elements(a, b):\n    return False", t)
    assert not CODE.is_answer_attempt("What should happen when the list is empty?", t)
    assert not CODE.is_answer_attempt("I'll compare each pair; the threshold is strict.", t)
    assert not CODE.is_answer_attempt("```python\nprint(threshold)\n```", t)  # a snippet, not a definition
    assert not CODE.is_answer_attempt("```python\ndef broken(:\n```", t)


def _packed(cases: list[dict]) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


def _lcb_file(tmp_path) -> str:
    stdin_cases = [{"input": "3\n1 2 3\n", "output": "6\n", "testtype": "stdin"}]
    private = [
        {"input": "2\n-5 5\n", "output": "0", "testtype": "stdin"},
        {"input": "1\n7\n", "output": "7\n", "testtype": "stdin"},
    ]
    functional = [{"input": "[1, 2, 3]\n2", "output": "[3, 4, 5]", "testtype": "functional"}]
    records = [
        {
            "task_id": "sharded-lcb-stdin",
            "task": "code",
            "source": "lcb_easy",
            "starter_code": "",
            "question_content": "Read n and n integers; print their sum.",
            "public_test_cases": json.dumps(stdin_cases),
            "private_test_cases": _packed(private),
            "metadata": "{}",
            "shards": [{"shard_id": 1, "shard": "Sum some integers."}, {"shard_id": 2, "shard": "First line: n."}],
        },
        {
            "task_id": "sharded-lcb-call",
            "task": "code",
            "source": "lcb_medium",
            "starter_code": "class Solution:\n    def addAll(self, nums, k):\n        ",
            "question_content": "Add k to every element.",
            "public_test_cases": json.dumps(functional),
            "metadata": json.dumps({"func_name": "addAll"}),
            "shards": [{"shard_id": 1, "shard": "Add k to each number."}],
        },
    ]
    path = tmp_path / "lic_code.json"
    path.write_text(json.dumps(records))
    return str(path)


def test_livecodebench_stdin_records_load_and_run(tmp_path):
    stdin_task = load_lic(_lcb_file(tmp_path), task="code")[0]
    assert CODE.tests(stdin_task).kind == "stdio" and len(CODE.tests(stdin_task).cases) == 3
    good = "n = int(input())\nprint(sum(map(int, input().split())))"
    v = CODE.verify(_reply(good), stdin_task)
    assert (v.score, v.status) == (1.0, "passed")
    positives = "n = int(input())\nprint(sum(x for x in map(int, input().split()) if x > 0))"
    v = CODE.verify(_reply(positives), stdin_task)
    assert (v.score, v.status) == (0.0, "failed") and v.reason == "case 1: expected '0', got '5'"  # a private case
    assert CODE.is_answer_attempt(_reply(good), stdin_task)  # a program without a def counts for stdin tasks
    public_only = CodeTask(limits=CODE.limits, private_tests=False)
    assert len(public_only.tests(stdin_task).cases) == 1
    assert public_only.verify(_reply(positives), stdin_task).score == 1.0  # only the private case catches it
    crash = CODE.verify(_reply("print(1 / 0)"), stdin_task)
    assert crash.status == "crashed" and crash.reason.startswith("case 0: line 1: print(1 / 0) -> ZeroDivisionError")


def test_livecodebench_functional_records_run_against_solution_class(tmp_path):
    call_task = load_lic(_lcb_file(tmp_path), task="code")[1]
    assert CODE.tests(call_task).kind == "functional" and CODE.tests(call_task).entry_point == "addAll"
    good = "class Solution:\n    def addAll(self, nums, k):\n        return [x + k for x in nums]"
    assert CODE.verify(_reply(good), call_task).status == "passed"
    bad = "class Solution:\n    def addAll(self, nums, k):\n        return [x * k for x in nums]"
    v = CODE.verify(_reply(bad), call_task)
    assert v.status == "failed" and "returned [2, 4, 6], expected [3, 4, 5]" in v.reason


def test_packed_private_cases_never_unpickle_objects(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    evil = base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()
    extra = {
        "public_test_cases": json.dumps([{"input": "1\n", "output": "1\n", "testtype": "stdin"}]),
        "private_test_cases": evil,
    }
    task = ShardedTask(
        "evil", "code", "Echo a number.", (), "Echo a number.", "", metadata={"lic_extra": json.dumps(extra)}
    )
    with pytest.raises(DataError, match="private_test_cases': neither JSON nor packed"):
        CODE.tests(task)
    assert not marker.exists()


def test_task_without_tests_is_a_data_error():
    task = ShardedTask("no-tests", "code", "Write f.", (), "Write f.", "")
    with pytest.raises(DataError, match="task 'no-tests': no tests"):
        CODE.verify("```python\ndef f():\n    pass\n```", task)
