"""Issue 53, failure 3 (the code / database / actions checkers) and failure 9 (actions arguments).

Before: ``"```" + 99,000 spaces`` cost 26.8 s of CPU in the database checker (its fence regex)
and 7.4 s in the code checker; a JSON call with a 5,000-digit integer made ``find_calls`` (and
so the actions ``verify`` / ``is_answer_attempt``) raise ValueError, and a ``...`` argument made
``verify`` raise TypeError (not JSON serializable). The linear fence scanners are checked
against the old regular expressions on random text.
"""

from __future__ import annotations

import json
import random
import re
import time

import pytest

from jaxrl_mt.data.loaders import load_source
from jaxrl_mt.rewards.judge_llm import parse_judge_answer, parse_judge_reply
from jaxrl_mt.rewards.judge_rules import classify_rule_based
from jaxrl_mt.tasks import get_task
from jaxrl_mt.tasks.calls import find_calls
from jaxrl_mt.tasks.code import extract_code
from jaxrl_mt.tasks.database import _TAG_RE, extract_sql
from jaxrl_mt.tasks.fences import backtick_fences, fence_tag, line_fences

N = 99_000  # the probe's length (under the 100k reply cap)
FN = "geometry.calculate_area_circle"  # a function of the first LiC actions record
PROBES = {
    "fence + spaces": "```" + " " * N,
    "fence + tabs": "```" + "\t" * N,
    "fence + letters": "```" + "a" * N,
    "fence + spaces + backtick": "```" + " " * N + "`",
    "backticks": "`" * N,
    "short fences": ("```" + " " * 40 + "\n") * (N // 44),
    "1,": "1," * (N // 2),
    "9,000 calls": "[" + ", ".join("f(a=1)" for _ in range(9000)) + "]",
    "5,000-digit JSON integer": json.dumps({"name": FN, "arguments": {"radius": 0}}).replace("0}", "1" * 5000 + "}"),
    "5,000-digit Python integer": f"{FN}(radius={'1' * 5000})",
    "hex integer of 20,000 bits": f"[{FN}(radius=0x{'f' * 5000})]",
    "hex integer of 20,000 bits in an expression": f"{FN}(radius=0x{'f' * 5000} + 1)",
    "... argument": f"{FN}(radius=...)",
    "... positional": f"```python\n{FN}(..., unit=[...])\n```",
    "fenced JSON, negative huge integer": (
        f'```json\n[{{"name": "{FN}", "arguments": {{"radius": -{"9" * 5000}}}}}]\n```'
    ),
}


@pytest.fixture(scope="module")
def records():
    return {"actions": load_source("lic:@:actions")[0], "code": load_source("humaneval:@:1")[0],
            "database": load_source("lic:@:database")[0]}


@pytest.mark.parametrize("name", list(PROBES))
def test_every_checker_answers_the_probe_in_under_a_second_of_cpu_without_raising(records, name):
    reply = PROBES[name]
    actions, code, database = (get_task(k) for k in ("actions", "code", "database"))
    checks = {
        "sql.extract": lambda: extract_sql(reply),
        "sql.attempt": lambda: database.is_answer_attempt(reply, records["database"]),
        "code.extract": lambda: extract_code(reply),
        "code.attempt": lambda: code.is_answer_attempt(reply, records["code"]),
        "actions.attempt": lambda: actions.is_answer_attempt(reply, records["actions"]),
        "actions.verify": lambda: actions.verify(reply, records["actions"]),  # find_calls and the extraction
        "judge.rules": lambda: classify_rule_based(reply, "code"),
        "judge.llm": lambda: (parse_judge_reply(reply), parse_judge_answer(reply)),
    }
    for what, check in checks.items():
        t0 = time.thread_time()  # this thread's CPU: host load does not count
        check()  # raises nothing
        assert time.thread_time() - t0 < 1.0, what


@pytest.mark.parametrize("name", [k for k in PROBES if "integer" in k or "..." in k])
def test_a_call_with_a_huge_integer_or_ellipsis_is_judged_not_raised(records, name):
    actions, task = get_task("actions"), records["actions"]
    verdict = actions.verify(PROBES[name], task)
    if name == "5,000-digit Python integer":  # Python itself refuses to parse the literal
        assert (verdict.status, actions.is_answer_attempt(PROBES[name], task)) == ("no_answer", False)
        return
    assert verdict.status == "wrong" and verdict.score == 0.0, verdict  # before: ValueError / TypeError
    assert actions.is_answer_attempt(PROBES[name], task) is True  # a call of the task's function
    assert json.loads(verdict.extracted)[0]["arguments"]["radius"].keys() == {"__expr__"}


# ------------------------------------------------------------ the old regular expressions as references

_OLD_SQL = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n`]*\n(.*?)(?:```|\Z)", re.S)
_OLD_CALLS = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.S)
_OLD_CODE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:^[ \t]*```[ \t]*$|\Z)", re.S | re.M)
_PIECES = ["```", "``", "`", "\n", " ", "\t", "sql", "python", "py3", " x", "SELECT 1", "def f(): pass", "é", "\r",
           "`` `", "-", "+", "."]


def test_the_linear_scanners_find_what_the_regexes_found_on_random_text():
    rng = random.Random(53)
    for _ in range(4000):
        text = "".join(rng.choice(_PIECES) for _ in range(rng.randrange(1, 18)))
        new = backtick_fences(text)
        assert [(fence_tag(i, _TAG_RE), b) for i, b in new] == _OLD_SQL.findall(text), repr(text)
        assert [b for _, b in new] == _OLD_CALLS.findall(text), repr(text)
        assert [(fence_tag(i), b) for i, b in line_fences(text)] == _OLD_CODE.findall(text), repr(text)


def test_extraction_unchanged_on_ordinary_replies():
    assert extract_sql("Sure:\n```sql\nSELECT name FROM t;\n```\nDone.") == "SELECT name FROM t"
    assert extract_sql("```\nSELECT 1 FROM t\n```\n````sql\nSELECT 2 FROM t\n````") == "SELECT 2 FROM t"
    assert extract_code("x\n  ```python\ndef f():\n    return 1\n  ```\n```js\nlet a\n```") == "def f():\n    return 1"
    assert extract_code("```py\ndef g(): pass") == "def g(): pass"  # an unclosed last fence runs to the end
    assert find_calls("```\nf(a=1)\n```") == find_calls("f(a=1)")
