"""LiC database/actions records: shipped samples, Python-literal fields, malformed-record messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jaxrl_mt.data.lic_fields import parse_literal
from jaxrl_mt.data.loaders import asset_path, load_lic, load_source
from jaxrl_mt.data.records import DataError
from jaxrl_mt.tasks.base import lic_extra


def test_database_sample_via_source_spec():
    tasks = load_source("lic:@:database")
    assert len(tasks) == 15 and {t.domain for t in tasks} == {"database"}
    t = tasks[0]
    assert t.task_id == "sharded-spider-val-499-hard" and t.target == "historical battles"
    assert t.full_prompt == "What are the ids and names of the battles that led to more than 10 people killed in total."
    assert t.answer.startswith("SELECT T1.id ,  T1.name FROM battle AS T1")
    extra = lic_extra(t)
    assert extra["db_id"] == "battle_death" and extra["reference_sql"] == t.answer
    # schema_tables was a string (with JSON nulls); it is parsed
    assert extra["schema_tables"]["battle"]["columns"][0] == [0, "id", "INT", 0, None, 1]
    assert extra["schema_tables"]["ship"]["foreign_keys"][0][2] == "battle"
    same_file = load_source(f"lic:{asset_path('lic/lic_database_sample.json')}:database")
    assert [x.task_id for x in same_file] == [x.task_id for x in tasks]


def test_actions_sample_via_source_spec():
    tasks = load_source("lic:@:actions")
    assert len(tasks) == 15 and {t.domain for t in tasks} == {"actions"}
    t = tasks[0]
    assert t.task_id == "sharded-BFCL/parallel_67"
    # the question is a BFCL message list: its user content, outer quotes removed
    assert t.full_prompt.startswith("Can you calculate the area of two circles, one with a radius of 5 meters")
    assert not t.full_prompt.endswith('"')
    extra = lic_extra(t)
    assert extra["test_category"] == "parallel" and extra["function"][0]["name"] == "geometry.calculate_area_circle"
    assert list(extra["function"][0]["parameters"]["properties"]) == ["radius", "unit"]  # spec order kept
    assert json.loads(t.answer) == extra["reference_answer"]
    assert extra["reference_answer"][1] == {"geometry.calculate_area_circle": {"radius": [10], "unit": ["meters", "m"]}}
    assert len(load_source("lic:@")) == 3 and load_source("lic:@:math")[0].domain == "math"


def _write(tmp_path: Path, records: list) -> Path:
    p = tmp_path / "lic.json"
    p.write_text(json.dumps(records, indent=1))
    return p


def _stringified(rec: dict) -> dict:
    """The record with its nested fields written as Python-literal strings (RLSTA's copy)."""
    return {
        k: (repr(v) if k in ("function", "reference_answer", "fully_specified_question", "shards") else v)
        for k, v in rec.items()
    }


def test_python_literal_fields_parse_like_structured_ones(tmp_path):
    recs = json.loads(asset_path("lic/lic_actions_sample.json").read_text())[:3]
    plain = load_lic(_write(tmp_path, recs), task="actions")
    lit = load_lic(_write(tmp_path, [_stringified(r) for r in recs]), task="actions")
    assert [lic_extra(t) for t in lit] == [lic_extra(t) for t in plain]
    assert [(t.target, t.conditions, t.full_prompt, t.answer) for t in lit] == [
        (t.target, t.conditions, t.full_prompt, t.answer) for t in plain
    ]


def _record_line(p: Path, k: int) -> int:
    return [i for i, line in enumerate(p.read_text().splitlines(), 1) if line == " {"][k]


@pytest.mark.parametrize(
    "field,value,message",
    [
        (
            "reference_answer",
            "[{'math.gcd': {'num1': [45]}",
            "field 'reference_answer': not a valid Python literal (SyntaxError",
        ),
        (
            "reference_answer",
            "[{'math.gcd': 45}]",
            "field 'reference_answer[0]': expected {function: {param: [accepted values]}}",
        ),
        ("function", "[{'description': 'no name'}]", "field 'function[0].name': expected a non-empty string"),
        ("function", "[]", "field 'function': expected a non-empty list of function specs"),
        (
            "test_category",
            "sequential",
            "field 'test_category': expected one of simple, multiple, parallel, parallel_multiple",
        ),
    ],
)
def test_malformed_actions_record_names_file_line_record_field(tmp_path, field, value, message):
    recs = json.loads(asset_path("lic/lic_actions_sample.json").read_text())[:3]
    recs[1] = _stringified(recs[1])
    recs[1][field] = value
    p = _write(tmp_path, recs)
    with pytest.raises(DataError) as e:
        load_lic(p, task="actions")
    assert str(e.value).startswith(f"{p}:{_record_line(p, 1)} (record 1): {message}"), str(e.value)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("schema_tables", "{'battle': {'columns': [", "field 'schema_tables': not a valid Python literal"),
        ("schema_tables", "[1, 2]", "field 'schema_tables': expected an object of tables"),
        ("schema_sql", "", "field 'schema_sql': expected a non-empty string"),
        ("reference_sql", None, "field 'reference_sql': expected a non-empty string"),
    ],
)
def test_malformed_database_record_names_file_line_record_field(tmp_path, field, value, message):
    recs = json.loads(asset_path("lic/lic_database_sample.json").read_text())[:4]
    recs[2][field] = value
    p = _write(tmp_path, recs)
    with pytest.raises(DataError) as e:
        load_lic(p, task="database")
    assert str(e.value).startswith(f"{p}:{_record_line(p, 2)} (record 2): {message}"), str(e.value)
    assert len(load_lic(p, task="actions")) == 0  # other tasks do not look at the database fields


def test_parse_literal_accepts_python_and_json_spellings():
    assert parse_literal("[{'a': (1, 2), 'b': None, 'c': True}]", "f:1", "x") == [{"a": (1, 2), "b": None, "c": True}]
    assert parse_literal('{"a": null, "b": [true, false]}', "f:1", "x") == {"a": None, "b": [True, False]}
    with pytest.raises(DataError, match=r"^f:3 \(record 0\): field 'x': not a valid Python literal \(ValueError"):
        parse_literal("[__import__('os')]", "f:3 (record 0)", "x")
