"""The typed evaluation config: built once from the config file, every field checked, frozen."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from jaxrl_mt.eval.errors import EvalError
from jaxrl_mt.eval.eval_config import HTTP_KEYS, EvalConfig, HttpSection, typed_eval_config
from jaxrl_mt.eval.http_assistant import http_backend_kw
from jaxrl_mt.evaluate import RESULT_FIELDS, _check_workdir, normalize_config
from tests.eval.test_evaluate_cli import get_config

# the fields added after the first eval configs were written, with the defaults such configs load with
LATER_FIELDS = {"mesh_shape": "auto", "reuse_cache": True, "enable_thinking": None, "attention": "auto",
                "abstain": False, "http_concurrency": 8, "http_timeout": 60.0, "http_retries": 3,
                "http_backoff": 0.5, "http_deadline": 1800.0, "api_key_env": "OPENAI_API_KEY"}


def _raw(tmp_path, **kw):
    return {**get_config("cpu", workdir=str(tmp_path)).to_dict(), **kw}


def test_the_config_file_becomes_a_frozen_typed_config(tmp_path):
    c = normalize_config(get_config("cpu", workdir=str(tmp_path)))
    assert isinstance(c, EvalConfig) and c.temperature == 1.0 and isinstance(c.temperature, float)
    assert c.scenarios[0] == "full" and isinstance(c.scenarios, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.runs = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        c.sources["math"] = ("x",)  # type: ignore[index]  # read-only views, not shared dicts
    with pytest.raises(TypeError):
        c.datasets["math"] = "x"  # type: ignore[index]
    assert normalize_config(c) == c  # a typed config passes through unchanged
    assert c.to_dict()["sources"] == {"math": ["synthetic:2:0", "lic:@"]}  # JSON-able for the report
    assert json.loads(json.dumps(c.to_dict()))["datasets"]["code"] == "humaneval:@:2"


def test_a_resolved_multi_task_config_is_not_resolved_again(tmp_path):
    every = normalize_config(get_config("cpu_all", workdir=str(tmp_path)))
    assert every.tasks == ("math", "code", "database", "actions") and every.dataset[0] == "synthetic:1:0"
    # its `dataset` (as loaded) has specs that name no task: resolving it again would be refused
    assert normalize_config(every) == every
    with pytest.raises(EvalError, match=r"config field 'runs': bad value 0"):  # values are checked again
        normalize_config(every.replace(runs=0))


def test_unknown_missing_and_mistyped_fields_are_named(tmp_path):
    with pytest.raises(EvalError, match=r"unknown config field\(s\) runz"):
        typed_eval_config(_raw(tmp_path, runz=4))
    raw = _raw(tmp_path)
    del raw["runs"]
    with pytest.raises(EvalError, match="config has no field runs"):
        typed_eval_config(raw)
    with pytest.raises(EvalError, match=r"config field max_new_tokens must be int, got '64' \(str\)"):
        typed_eval_config(_raw(tmp_path, max_new_tokens="64"))
    with pytest.raises(EvalError, match=r"config field temperature must be float, got True"):
        typed_eval_config(_raw(tmp_path, temperature=True))
    with pytest.raises(EvalError, match=r"config field datasets\.code must be str or tuple, got 3 \(int\)"):
        typed_eval_config(_raw(tmp_path, datasets={"math": "synthetic:1", "code": 3}))
    with pytest.raises(EvalError, match=r"config field dataset must be tuple, got \[1\] \(list\)"):
        typed_eval_config(_raw(tmp_path, dataset=[1]))
    with pytest.raises(EvalError, match=r"config field enable_thinking must be bool or NoneType, got 'yes'"):
        normalize_config(_raw(tmp_path, enable_thinking="yes"))
    with pytest.raises(EvalError, match=r"unknown config field\(s\) sources, tasks"):  # resolved, not config fields
        typed_eval_config(_raw(tmp_path, tasks=("math",), sources={}))


def test_a_config_written_before_the_later_fields_loads_with_their_defaults(tmp_path):
    raw = _raw(tmp_path, scenarios="full,sharded", dataset="synthetic:1", temperature=0)
    for k in (*LATER_FIELDS, "datasets"):  # `dataset` alone chose the sources then
        del raw[k]
    c = normalize_config(raw)
    assert {k: c.to_dict()[k] for k in LATER_FIELDS} == LATER_FIELDS
    assert c.sources == {"math": ("synthetic:1",)} and dict(c.datasets) == {}
    assert c.scenarios == ("full", "sharded") and c.dataset == ("synthetic:1",)
    assert c.temperature == 0.0 and type(c.temperature) is float
    # the shipped config sets every later field to its default: old and new configs evaluate alike
    assert {k: normalize_config(_raw(tmp_path)).to_dict()[k] for k in LATER_FIELDS} == LATER_FIELDS
    with pytest.raises(EvalError, match="config field 'http_timeout': bad value 0.0"):
        normalize_config(_raw(tmp_path, http_timeout=0.0))


def test_eval_config_json_keeps_the_results_defining_fields_as_before(tmp_path):
    cfg = get_config("cpu", workdir=str(tmp_path), dataset=("synthetic:1", "lic:@"), max_new_tokens=4,
                     system_prompt="S", temperature=0.0, enable_thinking=True, abstain=True)
    _check_workdir(tmp_path, normalize_config(cfg))
    stored = json.loads((tmp_path / "eval_config.json").read_text())
    attention = {k: stored.pop(k) for k in ("attention", "attention_effective", "attention_env")}
    assert attention == {"attention": "auto", "attention_effective": os.environ.get("JAXRL_MT_ATTENTION") or "auto",
                         "attention_env": os.environ.get("JAXRL_MT_ATTENTION") or None}  # kept, never compared
    assert list(stored) == list(RESULT_FIELDS)
    assert stored == {  # what the dict-based config wrote (a resumed evaluation compares against it)
        "model": "builtin:smollm2-135m-instruct", "dtype": "float32", "dataset": ["synthetic:1", "lic:@"],
        "task": "math", "shuffle_shards": False, "temperature": 0.0, "top_p": 1.0, "max_new_tokens": 4,
        "system_prompt": "S", "protocol": "lic", "verifier_mode": "strict", "judge": "rule",
        "user_simulator": "fixed", "user_temperature": 0.0, "strategy": "plain", "seed": 0, "abstain": True,
        "enable_thinking": True}


def test_eval_config_json_records_the_attention_variable(tmp_path, monkeypatch):
    """JAXRL_MT_ATTENTION overriding the configured attention is kept in eval_config.json (issue 52 item 5)."""
    monkeypatch.setenv("JAXRL_MT_ATTENTION", "blockwise")
    _check_workdir(tmp_path, normalize_config(get_config("cpu", workdir=str(tmp_path), attention="einsum")))
    stored = json.loads((tmp_path / "eval_config.json").read_text())
    assert (stored["attention"], stored["attention_effective"], stored["attention_env"]) == (
        "einsum", "blockwise", "blockwise")


def test_the_endpoint_fields_are_the_http_section(tmp_path):
    c = normalize_config(_raw(tmp_path, http_timeout=5, http_concurrency=2, api_key_env="K"))
    assert c.http == HttpSection(concurrency=2, timeout=5.0, retries=3, backoff=0.5, deadline=1800.0, api_key_env="K")
    assert type(c.http.timeout) is float  # an int where a float is declared, as for every field
    assert not any(hasattr(c, k) for k in HTTP_KEYS)  # the file's keys live in the section only
    assert {k: c.to_dict()[k] for k in HTTP_KEYS} == {"http_concurrency": 2, "http_timeout": 5.0, "http_retries": 3,
                                                      "http_backoff": 0.5, "http_deadline": 1800.0, "api_key_env": "K"}
    report_config = {k: v for k, v in c.to_dict().items() if k not in ("tasks", "sources")}  # the file's layout
    assert typed_eval_config(report_config).http == c.http
    assert http_backend_kw("http:http://x/v1#m", c.http) == {"max_workers": 2, "timeout": 5.0, "max_retries": 3,
                                                            "backoff": 0.5, "deadline": 1800.0, "api_key_env": "K"}
    assert http_backend_kw("local", c.http) == {}
    with pytest.raises(EvalError, match=r"config field http_retries must be int, got 'x' \(str\)"):
        normalize_config(_raw(tmp_path, http_retries="x"))
    with pytest.raises(EvalError, match=r"^unknown config field\(s\) http$"):
        typed_eval_config(_raw(tmp_path, http={"timeout": 1.0}))
    with pytest.raises(EvalError, match="config field 'http_concurrency': bad value 0"):
        normalize_config(_raw(tmp_path, http_concurrency=0))
