"""Hostile replies (issue 32, failure 1): every answer checker gives a verdict in under a second.

Each reply goes through ActionsTask.verify / is_answer_attempt, code and SQL extraction, the
rule judge, the verifier and the LLM-judge reply parser. Before the fix, ``"[[" * 600`` raised
RecursionError in the actions checker, ``"call fn(" * 20000`` took over 120 s and 200,000 ``{``
took 27 s; ``"The answer is " * 7000`` took 120 s in the verifier. The scans that replaced the
quadratic ones are checked against the old algorithms (kept here as references) on random text.
"""

from __future__ import annotations

import json
import random
import time

import pytest

from jaxrl_mt.data.loaders import load_source
from jaxrl_mt.rewards import verifier
from jaxrl_mt.rewards.judge_llm import parse_judge_answer, parse_judge_reply
from jaxrl_mt.rewards.judge_rules import classify_rule_based
from jaxrl_mt.tasks import get_task
from jaxrl_mt.tasks.base import MAX_REPLY_CHARS
from jaxrl_mt.tasks.calls import _json_call, _scan_json, _scan_python
from jaxrl_mt.tasks.code import extract_code
from jaxrl_mt.tasks.database import extract_sql

HOSTILE = {
    "[[ x600": "[[" * 600,
    "[ x500 ] x500": "[" * 500 + "]" * 500,
    "call fn( x20000": "call fn(" * 20000,
    "{ x200000": "{" * 200000,
    "call fn( under the cap": "call fn(" * 12000 + ")" * 30,
    "{ under the cap": "{" * 99000,
    "nested JSON under the cap": "[" * 5000 + "]" * 5000,
    "answer markers": "The answer is " * 7000 + "5",
    "boxes": "\\boxed{" * 7000 + "5" + "}" * 7000,
    "fences": "```\n" * 20000,
    "deep argument": "f(a=" + "1+" * 20000 + "1)",
    "long dotted name": "a." * 20000 + "f(x=1)",
    "deep JSON arguments": json.dumps({"name": "f", "arguments": "[" * 3000 + "]" * 3000}),
}


@pytest.fixture(scope="module")
def records():
    return {"actions": load_source("lic:@:actions")[0], "code": load_source("humaneval:@:1")[0],
            "database": load_source("lic:@:database")[0]}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_every_checker_gives_a_verdict_in_under_a_second_of_cpu(records, name):
    reply = HOSTILE[name]
    actions, code, database = (get_task(k) for k in ("actions", "code", "database"))
    checks = {
        "actions.verify": lambda: actions.verify(reply, records["actions"]).status,
        "actions.attempt": lambda: actions.is_answer_attempt(reply, records["actions"]),
        "code.extract": lambda: extract_code(reply),
        "code.attempt": lambda: code.is_answer_attempt(reply, records["code"]),
        "sql.extract": lambda: extract_sql(reply),
        "sql.attempt": lambda: database.is_answer_attempt(reply, records["database"]),
        "judge.math": lambda: classify_rule_based(reply, "math", question="How many apples does Tom have?"),
        "judge.code": lambda: classify_rule_based(reply, "code"),
        "verifier": lambda: (verifier.extract_answer(reply), verifier.verify_both(reply, "5")),
        "judge_llm": lambda: (parse_judge_reply(reply), parse_judge_answer(reply)),
    }
    for what, check in checks.items():
        # this thread's CPU time, not wall time: a loaded CI host or a collector thread does not
        # count (one wall-clock 1.1 s on CI for 0.13 s of work); the bugs took 5-120 s of it
        t0 = time.thread_time()
        check()
        assert time.thread_time() - t0 < 1.0, what
    status = actions.verify(reply, records["actions"]).status
    if len(reply) > MAX_REPLY_CHARS:
        assert status == "unparsable"
    else:  # "fn()" inside the parentheses of "call fn( ... )" is a call (of an unknown function): wrong
        assert status == ("wrong" if name == "call fn( under the cap" else "no_answer"), status
    assert actions.is_answer_attempt(reply, records["actions"]) is False


def test_over_the_cap_is_unparsable_for_every_task(records):
    reply = "x" * (MAX_REPLY_CHARS + 1)
    for name in ("actions", "code", "database"):
        v = get_task(name).verify(reply, records[name])
        assert (v.status, v.score, v.extracted) == ("unparsable", 0.0, None)
        assert f"{MAX_REPLY_CHARS + 1} characters" in v.reason
        assert get_task(name).is_answer_attempt(reply, records[name]) is False
    assert classify_rule_based(reply + " The answer is 5.") == "missing"
    assert verifier.extract_answer("The answer is 5. " + reply) is None


def test_calls_still_found_in_hostile_neighbourhood(records):
    t = records["actions"]
    good = 'calculate_area(radius=5, unit="cm")'
    assert get_task("actions").calls("[[" * 600 + f" ok: {good}", t)[0].name == "calculate_area"
    js = json.dumps({"name": "calculate_area", "arguments": {"radius": 5}})
    assert _scan_json("{" * 3000 + " " + js)[0].arguments == {"radius": 5}


# ----------------------------------------------------------------------- the old scans as references


def _old_json_call(obj):
    if isinstance(obj, list):
        out = [_old_json_call(o) for o in obj]
        return [c for cs in out for c in cs] if out and all(out) else None
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("tool_calls"), list):
        return _old_json_call(obj["tool_calls"])
    if isinstance(obj.get("function"), dict):
        return _old_json_call(obj["function"])
    return _json_call(obj)  # one leaf: same code


def _old_scan_json(text):
    dec, out, pos = json.JSONDecoder(), [], 0
    while True:
        i = min([j for j in (text.find("[", pos), text.find("{", pos)) if j >= 0], default=-1)
        if i < 0:
            return out
        try:
            obj, end = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            pos = i + 1
            continue
        calls = _old_json_call(obj)
        out += calls or []
        pos = end if calls else i + 1


def _old_scan_python(text, order):
    from jaxrl_mt.tasks.calls import _CALL_START_RE, _python_calls

    out, pos = [], 0
    while True:
        m = _CALL_START_RE.search(text, pos)
        if m is None:
            return out
        pos = m.end()
        for end in [i for i, ch in enumerate(text[m.end():], m.end()) if ch == ")"][:20]:
            calls = _python_calls(text[m.start(): end + 1], order)
            if calls:
                out += calls
                pos = end + 1
                break


_PIECES = ['{"name": "f", "arguments": {"a": 1}}', '[{"name": "g", "parameters": {}}]', "f(a=1)", "g(b='x)')",
           "h(c=[1, (2)])", '"', "'", "(", ")", "[", "]", "{", "}", "#", "\n", " I'll ", "\\", "x", ", ", ":",
           '"a"', "'''", "1", "ns.k(z=None)", '{"tool_calls": [{"function": {"name": "t", "arguments": "{}"}}]}']


def test_linear_scans_equal_the_old_ones_on_random_text():
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(_PIECES) for _ in range(rng.randrange(1, 14)))
        assert _scan_json(text) == _old_scan_json(text), text
        assert _scan_python(text, {}) == _old_scan_python(text, {}), text


def _old_marked_values(text):
    values = []
    for c in reversed(verifier._boxed_contents(text)):
        v = verifier._last_number(c)
        if v is not None:
            values.append(v)
    for marker in (verifier._HASH_RE, verifier._ANSWER_RE):
        for m in reversed(list(marker.finditer(text))):
            end = text.find("\n", m.end())
            span = text[m.end():] if end < 0 else text[m.end():end]
            eq = verifier._EQUATION_RE.match(span)
            value = None
            if eq is not None:
                nums = verifier.find_numbers(span[eq.end():])
                value = nums[0] if nums else None
            if value is None:
                nums = verifier.find_numbers(span)
                value = nums[0] if nums else None
            if value is not None:
                values.append(value)
    return values


def test_marker_values_equal_the_old_scan_on_random_text():
    pieces = ["The answer is", "answer:", "answer =", "####", " ", "-", "$", "5", "1/0", "2+3=", "=", "\n", "is",
              "\\boxed{", "}", "{", "x", "12,345", ".5", "%", "\\frac{1}{2}", "apples", "−", "s-4"]
    rng = random.Random(1)
    for _ in range(4000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 16)))
        assert verifier._marked_values(text) == _old_marked_values(text), text
