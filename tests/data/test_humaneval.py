"""HumanEval as sharded code instructions: the shipped file, the sharding invariants on all 164
problems, the source spec, LiC code records, malformed input."""

from __future__ import annotations

import ast
import gzip
import json
import re
from collections import Counter

import pytest

from jaxrl_mt.data.humaneval import HEADING, load_humaneval, shard_prompt
from jaxrl_mt.data.loaders import DataError, asset_path, load_lic, load_source
from jaxrl_mt.tasks import lic_extra


@pytest.fixture(scope="module")
def tasks():
    return load_source("humaneval:@")


def _raw():
    with gzip.open(asset_path("humaneval/HumanEval.jsonl.gz"), "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _norm_tokens(text: str) -> Counter:
    return Counter(t.rstrip(".,:;").strip("`").rstrip(".,:;") for t in text.split() if t != ">>>")


def _docstring(prompt: str, entry: str) -> str:
    fn = [n for n in ast.parse(prompt).body if isinstance(n, ast.FunctionDef) and n.name == entry][-1]
    return ast.get_docstring(fn) or ""


def test_all_164_load_as_code_tasks_with_their_test_fields(tasks):
    assert len(tasks) == 164 and len({t.task_id for t in tasks}) == 164
    assert tasks[0].task_id == "HumanEval/0" and tasks[-1].task_id == "HumanEval/163"
    for t, raw in zip(tasks, _raw()):
        extra = lic_extra(t)
        assert t.domain == "code" and t.meta["source"] == "humaneval"
        assert extra["prompt"] == raw["prompt"] and extra["test"] == raw["test"]
        assert extra["entry_point"] == extra["metadata"]["func_name"] == raw["entry_point"]
        assert t.answer == raw["prompt"] + raw["canonical_solution"]
        assert raw["prompt"].strip("\n") in t.full_prompt and t.full_prompt.startswith(
            "Complete the following Python function"
        )


def test_source_spec_takes_a_count_and_a_file(tmp_path):
    assert [t.task_id for t in load_source("humaneval:@:3")] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    path = tmp_path / "he.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _raw()[5:7]))
    assert [t.task_id for t in load_source(f"humaneval:{path}")] == ["HumanEval/5", "HumanEval/6"]
    assert len(load_source(f"humaneval:{path}:1")) == 1


def test_shard_one_is_the_intent(tasks):
    for t in tasks:
        entry = lic_extra(t)["entry_point"]
        assert t.target.startswith(f"Write a Python function `{entry}`")
        doc = " ".join(_docstring(lic_extra(t)["prompt"], entry).split())
        first = t.target.split(":", 1)[1].strip() if ":" in t.target else ""
        assert doc.startswith(" ".join(first.split())), t.task_id  # the docstring's opening sentence
        assert t.conditions[0].startswith("The function signature is `def ") and entry in t.conditions[0]


def test_every_docstring_token_example_and_requirement_is_in_some_shard(tasks):
    n_examples = 0
    for t in tasks:
        extra = lic_extra(t)
        doc = _docstring(extra["prompt"], extra["entry_point"])
        kept = "\n".join(line for line in doc.splitlines() if not HEADING.match(line))
        missing = _norm_tokens(kept) - _norm_tokens("\n".join(t.shards))
        assert not missing, (t.task_id, missing)
        for line in doc.splitlines():  # every doctest call is in one shard, whole
            if line.strip().startswith(">>>"):
                call = line.strip()[3:].strip()
                assert any(call in s for s in t.shards), (t.task_id, call)
                n_examples += 1
        assert all(s.strip() and s == s.strip() for s in t.shards), t.task_id
        assert len(set(t.shards)) == len(t.shards), t.task_id
    assert n_examples > 150  # the doctests really were checked


def test_example_shards_hold_one_example_each(tasks):
    by_id = {t.task_id: t for t in tasks}
    ex = [c for c in by_id["HumanEval/0"].conditions if c.startswith("For example")]
    assert ex == [
        "For example, `has_close_elements([1.0, 2.0, 3.0], 0.5)` should return `False`.",
        "For example, `has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)` should return `True`.",
    ]
    io = [c for c in by_id["HumanEval/120"].conditions if c.startswith("For example")]
    assert len(io) == 3 and all(c.count("Input:") == 1 and c.count("Output:") == 1 for c in io)
    arrows = [c for c in by_id["HumanEval/137"].conditions if "➞" in c]
    assert len(arrows) == 4 and all(c.startswith("For example: compare_one(") for c in arrows)


def test_helper_code_of_the_prompt_is_a_shard_and_tables_stay_whole(tasks):
    by_id = {t.task_id: t for t in tasks}
    helper = [c for c in by_id["HumanEval/10"].conditions if "already defined" in c]
    assert len(helper) == 1 and "def is_palindrome(string: str) -> bool:" in helper[0]
    table = [c for c in by_id["HumanEval/81"].conditions if "Letter grade" in c]
    assert len(table) == 1 and len(re.findall(r"\n", table[0])) >= 13 and "D-" in table[0]
    assert "Letter grade" not in by_id["HumanEval/81"].target


def test_shard_prompt_errors_name_the_problem():
    with pytest.raises(DataError, match="no top-level function 'g'"):
        shard_prompt("def f(x):\n    '''Doc.'''\n", "g")
    with pytest.raises(DataError, match="not parseable"):
        shard_prompt("def f(:\n", "f")
    target, conds = shard_prompt("def f(x):\n    pass\n", "f")
    assert target == "Write a Python function `f`." and conds == ("The function signature is `def f(x)`.",)


def test_malformed_files_name_file_line_and_field(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"task_id": "x", "prompt": "def f():\n    pass\n", "entry_point": "f"}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: field 'test'"):
        load_humaneval(bad)
    bad.write_text("{not json\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: invalid JSON"):
        load_humaneval(bad)
    with pytest.raises(DataError, match="no such file"):
        load_source(f"humaneval:{tmp_path / 'missing.jsonl'}")


def test_lic_code_records_keep_their_fields_and_get_a_code_prompt(tmp_path):
    he, raw = load_source("humaneval:@:1")[0], _raw()[0]
    records = [
        {
            "task_id": "sharded-HumanEval/0",
            "task": "code",
            "source": "humaneval",
            "prompt": raw["prompt"],
            "test": raw["test"],
            "metadata": {"func_name": "has_close_elements"},
            "shards": [
                {"shard_id": 2, "shard": "Numbers come as a list."},
                {"shard_id": 1, "shard": "Close elements?"},
            ],
        },
        {
            "task_id": "sharded-lcb/1",
            "task": "code",
            "source": "lcb_easy",
            "question_content": "Print the sum of two integers.",
            "starter_code": "",
            "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
            "metadata": "{}",
            "shards": [{"shard_id": 1, "shard": "Add two numbers."}],
        },
        {
            "task_id": "sharded-GSM8K/1",
            "task": "math",
            "question": "1+1?",
            "answer": "#### 2",
            "shards": [{"shard_id": 1, "shard": "1+1?"}],
        },
    ]
    path = tmp_path / "lic.json"
    path.write_text(json.dumps(records))
    code = load_lic(path, task="code")
    assert [t.task_id for t in code] == ["sharded-HumanEval/0", "sharded-lcb/1"]
    assert code[0].target == "Close elements?" and code[0].conditions == ("Numbers come as a list.",)
    assert code[0].full_prompt == he.full_prompt
    assert lic_extra(code[0])["test"] == raw["test"] and lic_extra(code[0])["metadata"] == {
        "func_name": "has_close_elements"
    }
    assert code[1].full_prompt == "Print the sum of two integers." and "public_test_cases" in lic_extra(code[1])
    assert [t.task_id for t in load_source(f"lic:{path}:code")] == ["sharded-HumanEval/0", "sharded-lcb/1"]
