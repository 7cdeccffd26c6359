"""The LiC actions task: call parsing (Python / JSON), BFCL AST checking, order-free matching."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jaxrl_mt.data.loaders import load_lic, load_source
from jaxrl_mt.tasks import get_task
from jaxrl_mt.tasks.actions import ActionsTask, reference_calls
from jaxrl_mt.tasks.base import lic_extra
from jaxrl_mt.tasks.bfcl_check import normalize_string
from jaxrl_mt.tasks.calls import (
    Call,
    Expr,
    calls_from_json,
    find_calls,
    render_json,
    render_python,
)


@pytest.fixture(scope="module")
def sample():
    return load_source("lic:@:actions")


TASK = ActionsTask()


def _tool_calls(calls: list[Call]) -> str:
    """OpenAI-style: arguments as a JSON string."""
    return json.dumps(
        {
            "tool_calls": [
                {"type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in calls
            ]
        }
    )


def test_registered_and_prompt_renders_the_specs(sample):
    assert isinstance(get_task("actions"), ActionsTask)
    t = sample[0]
    prompt = TASK.system_prompt_for(t)
    assert prompt.startswith(TASK.system_prompt) and "[function_name(param1=value1" in TASK.system_prompt
    for f in lic_extra(t)["function"]:
        assert f'"name": "{f["name"]}"' in prompt and f["description"] in prompt
        for p in f["parameters"]["properties"]:
            assert f'"{p}"' in prompt
    assert prompt.index('"radius"') < prompt.index('"unit"')  # the record's order is kept
    assert TASK.full_prompt_for(t).startswith("Can you calculate the area of two circles")


def test_every_sample_reference_is_correct_in_every_form(sample):
    forms = {
        "python": render_python,
        "json": render_json,
        "tool_calls": _tool_calls,
        "reversed": lambda cs: render_python(cs[::-1]),
        "fenced": lambda cs: f"Sure.\n```python\n{render_python(cs)}\n```",
    }
    results = {
        (t.task_id, f): TASK.verify(fn(reference_calls(lic_extra(t)["reference_answer"])), t)
        for t in sample
        for f, fn in forms.items()
    }
    assert len(sample) == 15 and len(results) == 75
    assert [k for k, v in results.items() if v.status != "correct"] == []


def _bad_value_and_type(call: Call) -> tuple[str, object, object]:
    """(parameter, a wrong value of the right type, a value of a wrong type) for the call's first
    integer, else string, float or list parameter."""
    for typ, bad_value, bad_type in (
        (int, lambda v: v + 1000, str),
        (str, lambda v: v + " Zz", lambda v: 123),
        (float, lambda v: v + 1000.0, str),
        (list, lambda v: v[:-1], str),
    ):
        k = next((k for k, v in call.arguments.items() if type(v) is typ), None)
        if k:
            return k, bad_value(call.arguments[k]), bad_type(call.arguments[k])
    raise AssertionError(f"no scalar argument in {call}")


def test_perturbed_sample_calls_are_wrong(sample):
    """Per record: wrong function, missing required argument, wrong value, wrong type, unexpected
    argument, an extra call; each must be wrong, with the reason naming the failure."""
    checked = 0
    for t in sample:
        extra = lic_extra(t)
        ref = reference_calls(extra["reference_answer"])
        spec = {f["name"]: f for f in extra["function"]}
        first, rest = ref[0], ref[1:]
        required = spec[first.name]["parameters"]["required"]
        k, bad_value, bad_type = _bad_value_and_type(first)
        cases = {
            "wrong function": [Call("not_a_tool", first.arguments)] + rest,
            f"missing required argument '{required[0]}'": [
                Call(first.name, {a: v for a, v in first.arguments.items() if a != required[0]})
            ]
            + rest,
            "unexpected argument 'colour'": [Call(first.name, {**first.arguments, "colour": "red"})] + rest,
            "wrong number of calls": ref + [ref[0]],
            f"wrong value for '{k}'": [Call(first.name, {**first.arguments, k: bad_value})] + rest,
            f"wrong type for '{k}'": [Call(first.name, {**first.arguments, k: bad_type})] + rest,
        }
        for why, calls in cases.items():
            v = TASK.verify(render_python(calls), t)
            assert v.status == "wrong" and v.score == 0.0, (t.task_id, why, v)
            assert why in v.reason, (why, v.reason)
            checked += 1
    assert checked == 15 * 6


# --------------------------------------------------------------------------- hand-built records

TRIANGLE = {
    "name": "calculate_triangle_area",
    "description": "Area of a triangle.",
    "parameters": {
        "type": "dict",
        "properties": {
            "base": {"type": "integer", "description": "Base."},
            "height": {"type": "integer", "description": "Height."},
            "unit": {"type": "string", "description": "Unit, default 'units'."},
        },
        "required": ["base", "height"],
    },
}
WEATHER = {
    "name": "weather.get",
    "description": "Weather in a city.",
    "parameters": {
        "type": "dict",
        "properties": {
            "city": {"type": "string", "description": "City."},
            "days": {"type": "integer", "description": "Days ahead."},
        },
        "required": ["city"],
    },
}
TIME = {
    "name": "time.now",
    "description": "Local time in a city.",
    "parameters": {
        "type": "dict",
        "properties": {
            "city": {"type": "string", "description": "City."},
            "tz_offset": {"type": "float", "description": "Offset in hours."},
        },
        "required": ["city"],
    },
}
ORDER = {
    "name": "shop.order",
    "description": "Order items.",
    "parameters": {
        "type": "dict",
        "properties": {
            "items": {"type": "array", "items": {"type": "string"}, "description": "Items."},
            "address": {
                "type": "dict",
                "properties": {"street": {"type": "string"}, "zip": {"type": "integer"}},
                "description": "Where.",
            },
            "express": {"type": "boolean", "description": "Fast shipping."},
        },
        "required": ["items", "address"],
    },
}


def _record(n: int, category: str, functions: list, reference: list) -> dict:
    # stored the way the RLSTA copy stores them: Python-literal strings
    return {
        "task_id": f"sharded-BFCL/{category}_{n}",
        "task": "actions",
        "test_category": category,
        "language": "Python",
        "function": repr(functions),
        "reference_answer": repr(reference),
        "fully_specified_question": repr([[{"role": "user", "content": f"question {n}"}]]),
        "shards": [{"shard_id": 1, "shard": f"intent {n}"}, {"shard_id": 2, "shard": "detail"}],
    }


@pytest.fixture(scope="module")
def hand(tmp_path_factory) -> dict[str, object]:
    recs = [
        _record(
            0, "simple", [TRIANGLE], [{"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}}]
        ),
        _record(1, "multiple", [WEATHER, TIME], [{"time.now": {"city": ["New York", "NYC"], "tz_offset": [-5.0, ""]}}]),
        _record(
            2,
            "parallel_multiple",
            [WEATHER, TIME],
            [
                {"weather.get": {"city": ["Paris"], "days": [3]}},
                {"time.now": {"city": ["Paris"], "tz_offset": [""]}},
                {"weather.get": {"city": ["Rome"], "days": [3]}},
            ],
        ),
        _record(
            3,
            "simple",
            [ORDER],
            [
                {
                    "shop.order": {
                        "items": [["apple", "pear"], ["pear", "apple"]],
                        "address": [{"street": ["Main St"], "zip": [12345]}],
                        "express": [False, ""],
                    }
                }
            ],
        ),
        _record(
            4,
            "parallel",
            [WEATHER],
            [
                {"weather.get": {"city": ["Oslo", "Bergen"], "days": [1]}},
                {"weather.get": {"city": ["Oslo"], "days": [1]}},
            ],
        ),
    ]
    p = Path(tmp_path_factory.mktemp("lic")) / "actions.json"
    p.write_text(json.dumps(recs, indent=1))
    return {t.task_id.rsplit("/", 1)[1]: t for t in load_lic(p, task="actions")}


@pytest.mark.parametrize(
    "reply,status,reason",
    [
        ("[calculate_triangle_area(base=10, height=5)]", "correct", ""),
        ("calculate_triangle_area(base=10, height=5, unit='UNITS')", "correct", ""),
        ("calculate_triangle_area(10, 5)", "correct", ""),  # positional, mapped by the spec's order
        ('{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}', "correct", ""),
        (
            "[calculate_triangle_area(base=10.0, height=5)]",
            "wrong",
            "wrong type for 'base': expected integer, got float",
        ),
        (
            "[calculate_triangle_area(base=True, height=5)]",
            "wrong",
            "wrong type for 'base': expected integer, got boolean",
        ),
        (
            "[calculate_triangle_area(base=2*5, height=5)]",
            "wrong",
            "wrong type for 'base': expected integer, got the expression '2 * 5'",
        ),
        (
            "[calculate_triangle_area(base=10, height=6)]",
            "wrong",
            "wrong value for 'height' in calculate_triangle_area: got 6, accepted [5]",
        ),
        ("[calculate_triangle_area(base=10, height=5, unit='cm')]", "wrong", "wrong value for 'unit'"),
        ("[calculate_triangle_area(base=10)]", "wrong", "missing required argument 'height'"),
        ("[calculate_triangle_area(base=10, height=5, color='red')]", "wrong", "unexpected argument 'color'"),
        (
            "[calculate_triangle_area(base=10, height=5), calculate_triangle_area(base=10, height=5)]",
            "wrong",
            "wrong number of calls: expected 1, got 2",
        ),
        (
            "[triangle_area(base=10, height=5)]",
            "wrong",
            "wrong function: expected calculate_triangle_area, got triangle_area",
        ),
        ("I need the height of the triangle first.", "no_answer", "no function call"),
    ],
)
def test_simple_rules_worked_by_hand(hand, reply, status, reason):
    v = TASK.verify(reply, hand["simple_0"])
    assert v.status == status and reason in v.reason, v
    assert (v.extracted is None) == (status == "no_answer")


def test_multiple_picks_one_function_and_float_accepts_int(hand):
    t = hand["multiple_1"]
    assert TASK.verify("[time.now(city='nyc')]", t).status == "correct"  # normalised: case, no optional offset
    assert (
        TASK.verify("[time.now(city='New York', tz_offset=-5)]", t).status == "correct"
    )  # int where float is expected
    assert TASK.verify("[time_now(city='New York')]", t).status == "correct"  # '.' written as '_'
    v = TASK.verify("[weather.get(city='New York')]", t)
    assert v.status == "wrong" and v.reason == "wrong function: expected time.now, got weather.get"
    v = TASK.verify("[time.now(city='New York', tz_offset='-5')]", t)
    assert v.reason == "wrong type for 'tz_offset': expected float, got string in time.now"


def test_parallel_multiple_is_order_free(hand):
    t = hand["parallel_multiple_2"]
    ok = "[time.now(city='paris'), weather.get(city='Rome', days=3), weather.get(city='Paris', days=3)]"
    assert TASK.verify(ok, t).status == "correct"
    v = TASK.verify("[weather.get(city='Paris', days=3), weather.get(city='Paris', days=3), time.now(city='Paris')]", t)
    assert v.status == "wrong" and v.reason.startswith(
        "reference call 3 (weather.get) unmatched, predicted call 2: wrong value for 'city'"
    )
    v = TASK.verify("[weather.get(city='Paris', days=3), time.now(city='Paris')]", t)
    assert v.reason == "wrong number of calls: expected 3, got 2"
    v = TASK.verify(
        "[weather.get(city='Paris', days=3), weather.get(city='Rome', days=3), weather.get(city='Oslo', days=3)]", t
    )
    assert (
        v.reason
        == "reference call 2 (time.now) unmatched, predicted call 3: wrong function: expected time.now, got weather.get"
    )


def test_parallel_matching_is_a_bijection_not_greedy(hand):
    # reference 1 accepts Oslo or Bergen, reference 2 only Oslo: a greedy first-fit that gives the
    # Oslo call to reference 1 fails; the bijection Bergen->1, Oslo->2 exists.
    t = hand["parallel_4"]
    assert TASK.verify("[weather.get(city='Oslo', days=1), weather.get(city='Bergen', days=1)]", t).status == "correct"
    assert TASK.verify("[weather.get(city='Bergen', days=1), weather.get(city='Bergen', days=1)]", t).status == "wrong"


def test_nested_arrays_and_dicts(hand):
    t = hand["simple_3"]
    assert (
        TASK.verify("shop.order(items=['Pear', 'apple'], address={'street': 'main st.', 'zip': 12345})", t).status
        == "correct"
    )
    assert (
        TASK.verify(
            "shop.order(items=['apple', 'pear'], address={'street': 'Main St', 'zip': 12345}, express=False)", t
        ).status
        == "correct"
    )
    cases = {
        "shop.order(items=['apple'], address={'street': 'Main St', 'zip': 12345})": "wrong value for 'items'",
        "shop.order(items=['apple', 3], address={'street': 'Main St', 'zip': 12345})": "wrong type for 'items[1]': expected string, got integer",
        "shop.order(items=['apple', 'pear'], address={'street': 'Main St', 'zip': '12345'})": "wrong type for 'address.zip'",
        "shop.order(items=['apple', 'pear'], address={'street': 'Main St'})": "wrong value for 'address'",
        "shop.order(items=['apple', 'pear'], address={'street': 'Main St', 'zip': 12345, 'floor': 2})": "wrong value for 'address'",
        "shop.order(items=['apple', 'pear'], address={'street': 'Main St', 'zip': 12345}, express=0)": "wrong type for 'express'",
    }
    for reply, why in cases.items():
        v = TASK.verify(reply, t)
        assert v.status == "wrong" and why in v.reason, (reply, v.reason)


def test_call_parsing_forms():
    order = {"f": ["a", "b"]}
    assert find_calls("[f(a=1, b='x'), ns.g(c=[1, 2])]") == [Call("f", {"a": 1, "b": "x"}), Call("ns.g", {"c": [1, 2]})]
    assert find_calls("f(a=1)\ng(b=true)") == [Call("f", {"a": 1}), Call("g", {"b": True})]
    assert find_calls("Calling `f(a=-2.5)` now, then `g(b=None)`.") == [Call("f", {"a": -2.5}), Call("g", {"b": None})]
    assert find_calls("f(1, 'x')", order) == [Call("f", {"a": 1, "b": "x"})]
    assert find_calls("f(1, 'x')") is None  # positional without a spec
    assert find_calls("f(a=x)") == [Call("f", {"a": Expr("x")})]
    assert find_calls(
        '[{"name": "f", "parameters": {"a": 1}}, {"function": {"name": "g", "arguments": "{\\"b\\": 2}"}}]'
    ) == [Call("f", {"a": 1}), Call("g", {"b": 2})]
    assert find_calls('Result: {"name": "f", "arguments": {"a": [1, 2]}} -- done') == [Call("f", {"a": [1, 2]})]
    assert find_calls('```json\n{"name": "f", "arguments": {}}\n```\n```python\nf(a=3)\n```') == [Call("f", {"a": 3})]
    assert find_calls("I'll call math.gcd(num1=45, num2=60) and then math.gcd(num1=81, num2=27).") == [
        Call("math.gcd", {"num1": 45, "num2": 60}),
        Call("math.gcd", {"num1": 81, "num2": 27}),
    ]
    assert find_calls("result = f(a=1)") == [Call("f", {"a": 1})]  # found inside the assignment
    for none in ("", "I cannot do that.", "print", "[1, 2, 3]", '{"a": 1}', "the radius (in meters) of compute(this)"):
        assert find_calls(none) is None, none
    calls = [Call("f", {"a": Expr("x"), "b": (1, 2)})]
    assert calls_from_json(render_json(calls)) == [Call("f", {"a": Expr("x"), "b": [1, 2]})]


def test_answer_attempts(sample):
    t = sample[3]  # math.gcd
    assert TASK.is_answer_attempt("[math.gcd(num1=45, num2=60)]", t)
    assert TASK.is_answer_attempt("math_gcd(45, 60)", t) is False  # unknown name, positional: not a call
    assert TASK.is_answer_attempt("[math_gcd(num1=45, num2=60)]", t)
    assert TASK.is_answer_attempt("[lcm(a=1)]", t)  # any name, with arguments
    assert not TASK.is_answer_attempt("Which pairs of numbers do you want?", t)
    assert TASK.extract("Which pairs?", t) is None
    assert json.loads(TASK.extract("math.gcd(45, 60)", t)) == [
        {"name": "math.gcd", "arguments": {"num1": 45, "num2": 60}}
    ]


def test_normalize_string():
    assert normalize_string("Los Angeles, CA") == normalize_string("los-angeles ca") == "losangelesca"
    assert normalize_string("New York") != normalize_string("Newark")
