"""The task fields of the evaluation config: task lists, per-task sources, start-up errors."""

from __future__ import annotations

import json

import pytest

from jaxrl_mt.data.records import DataError
from jaxrl_mt.eval.simulator import EvalError
from jaxrl_mt.eval.task_config import parse_tasks, resolve_sources, spec_task
from jaxrl_mt.evaluate import load_tasks, normalize_config
from tests.eval.test_evaluate_cli import get_config

DEFAULTS = {
    "math": "synthetic:2:0,lic:@",
    "code": "humaneval:@:2",
    "database": "lic:@:database",
    "actions": "lic:@:actions",
    "data2text": "",
    "summary": "",
}


def test_task_lists_and_all():
    assert parse_tasks("all", "rule") == ("math", "code", "database", "actions")
    assert parse_tasks("code, database,code", "rule") == ("code", "database")
    assert parse_tasks(["actions", "math"], "rule") == ("actions", "math")
    with pytest.raises(EvalError, match=r"config field 'task': unknown task 'sql'; valid: code, .*, all"):
        parse_tasks("math,sql", "rule")
    with pytest.raises(EvalError, match=r"config field 'task': no task given"):
        parse_tasks(" , ", "rule")


def test_summary_and_data2text_need_an_http_judge():
    for t in ("summary", "data2text"):
        with pytest.raises(
            EvalError,
            match=rf"config field 'task': '{t}' has no offline verifier; .* config field "
            r"'judge' must be http:URL#MODEL \(got 'rule'\)",
        ):
            parse_tasks(f"math,{t}", "rule")
    assert parse_tasks("data2text", "http://127.0.0.1:1/v1#j") == ("data2text",)
    with pytest.raises(
        EvalError,
        match=r"config field 'datasets.data2text': no source for task 'data2text' "
        r"\(LiC's summary and data2text records are not shipped",
    ):
        resolve_sources(("data2text",), (), DEFAULTS)


def test_sources_per_task_and_their_checks():
    got = resolve_sources(("math", "code", "database"), (), DEFAULTS)
    assert got == {"math": ("synthetic:2:0", "lic:@"), "code": ("humaneval:@:2",), "database": ("lic:@:database",)}
    # An implicit lic:FILE takes the task it is listed under.
    assert resolve_sources(("actions",), (), {"actions": "lic:/x.json"}) == {"actions": ("lic:/x.json:actions",)}
    with pytest.raises(
        EvalError,
        match=r"config field 'datasets.code': source 'lic:@:database' holds database "
        r"instructions, not code",
    ):
        resolve_sources(("code",), (), {"code": "lic:@:database"})
    with pytest.raises(EvalError, match=r"config field 'datasets.actions': no source for task 'actions'$"):
        resolve_sources(("actions",), (), {"actions": ""})
    # `dataset` overrides: one task takes every source; several need the task in each spec.
    assert resolve_sources(("code",), ("lic:/f.json",), DEFAULTS) == {"code": ("lic:/f.json:code",)}
    two = resolve_sources(("math", "code"), ("synthetic:1", "humaneval:@:1", "lic:@:math"), DEFAULTS)
    assert two == {"math": ("synthetic:1", "lic:@:math"), "code": ("humaneval:@:1",)}
    with pytest.raises(EvalError, match=r"config field 'dataset': source 'tasks:/t.jsonl' does not say which task"):
        resolve_sources(("math", "code"), ("tasks:/t.jsonl",), DEFAULTS)
    with pytest.raises(
        EvalError,
        match=r"config field 'dataset': source 'lic:@:actions' holds actions instructions, "
        r"but config field 'task' selects math, code",
    ):
        resolve_sources(("math", "code"), ("lic:@:actions", "synthetic:1"), DEFAULTS)
    with pytest.raises(EvalError, match=r"config field 'dataset': no source for task 'code'"):
        resolve_sources(("math", "code"), ("synthetic:1",), DEFAULTS)
    assert [spec_task(s) for s in ("lic:@", "lic:a:b:code", "humaneval:@", "gsm8k:@", "tasks:x")] == [
        None,
        "code",
        "code",
        "math",
        None,
    ]


def test_presets_and_normalized_fields(tmp_path):
    cpu = normalize_config(get_config("cpu", workdir=str(tmp_path)))
    assert (cpu.task, cpu.dataset) == ("math", ("synthetic:2:0", "lic:@"))  # as before the task list
    every = normalize_config(get_config("cpu_all", workdir=str(tmp_path)))
    assert every.tasks == ("math", "code", "database", "actions")
    assert every.scenarios == ("full", "sharded") and every.runs == 2
    lic = normalize_config(get_config("lic", workdir=str(tmp_path)))
    assert lic.sources["code"] == ("humaneval:@",) and lic.task == "math,code,database,actions"
    with pytest.raises(EvalError, match=r"config field 'task': unknown task 'sumary'"):
        normalize_config(get_config("cpu", task="sumary"))
    with pytest.raises(ValueError, match=r"unknown preset 'gpu'; valid: cpu, cpu_all, lic"):
        get_config("gpu")


def test_loaded_records_are_checked_for_their_task(tmp_path):
    with pytest.raises(
        EvalError,
        match=r"source 'tasks:.*': task 'x1' is a 'math' task, but the source is "
        r"configured for 'code'",
    ):
        rows = [
            {
                "task_id": "x1",
                "domain": "math",
                "target": "How many?",
                "conditions": ["She has 3."],
                "full_prompt": "She has 3. How many?",
                "answer": "3",
            }
        ]
        g = tmp_path / "t.jsonl"
        g.write_text("".join(json.dumps(r) + "\n" for r in rows))
        load_tasks([f"tasks:{g}"], task="code")
    bad = [
        {
            "task_id": "c1",
            "domain": "code",
            "target": "Write f.",
            "conditions": ["It adds."],
            "full_prompt": "Write f; it adds.",
            "answer": "def f(a, b): return a + b",
        }
    ]
    h = tmp_path / "c.jsonl"
    h.write_text(json.dumps(bad[0]) + "\n")
    with pytest.raises(EvalError, match=rf"source 'tasks:{h}': task 'c1': .*"):
        load_tasks([f"tasks:{h}"], task="code")  # a code task without tests cannot be scored
    seen: dict[str, str] = {}
    assert len(load_tasks(["humaneval:@:1"], task="code", seen=seen)) == 1
    with pytest.raises(EvalError, match=r"duplicate task id 'HumanEval/0'"):
        load_tasks(["humaneval:@:1"], task="code", seen=seen)
    # LiC's summary shards carry document ids, not text: the loader refuses them, naming the field.
    summary = {
        "task_id": "sharded_summary_0",
        "task": "summary",
        "shards": [{"shard_id": 0, "shard": "", "doc_idxs": [1]}],
    }
    f = tmp_path / "lic.json"
    f.write_text(json.dumps([summary]))
    with pytest.raises(DataError, match=rf"{f}:\d+: field 'shards.*shard"):
        load_tasks([f"lic:{f}"], task="summary")
