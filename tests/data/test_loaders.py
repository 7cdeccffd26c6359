"""Loaders on the shipped samples (and the full files when /work/shared/data is present)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jaxrl_mt.data.loaders import (
    asset_path,
    gold_from_gsm8k_answer,
    load_gsm8k,
    load_gsm8k_tfds,
    load_lic,
    load_rlsta_add,
    load_rlsta_refine,
    load_source,
)
from jaxrl_mt.data.numbers import number_set
from jaxrl_mt.data.records import DataError

SHARED = Path(os.environ.get("JAXRL_MT_SHARED_DATA", "/work/shared/data"))
needs_shared = pytest.mark.skipif(not (SHARED / "rlsta").exists(), reason="full data files not present")


def _lines(rel: str) -> list[dict]:
    return [json.loads(l) for l in asset_path(rel).read_text().splitlines() if l.strip()]


# --------------------------------------------------------------------------- GSM8K


def test_gold_from_gsm8k_answer():
    assert gold_from_gsm8k_answer("He pays 2*3=<<2*3=6>>6.\n#### 1,234") == "1234"
    assert gold_from_gsm8k_answer("x\n#### -3.5 ") == "-3.5"
    with pytest.raises(DataError, match="####"):
        gold_from_gsm8k_answer("no marker 12")


@pytest.mark.parametrize("split", ["train", "test"])
def test_gsm8k_samples(split):
    tasks = load_gsm8k(asset_path(f"gsm8k/{split}_sample.jsonl"), split=split)
    raw = _lines(f"gsm8k/{split}_sample.jsonl")
    assert len(tasks) == 64
    for t, r in zip(tasks, raw):
        assert t.full_prompt == r["question"].strip()
        assert t.answer == r["answer"].split("####")[-1].strip().replace(",", "")
        assert 2 <= len(t.shards) <= 10 or len(t.shards) == 1
        assert number_set(r["question"]) <= number_set(t.shards)
    assert tasks[0].task_id == f"gsm8k/{split}/0"
    if split == "train":
        assert tasks[0].answer == "72"  # Natalia's clips
        assert tasks[0].target == "How many clips did Natalia sell altogether in April and May?"
        assert tasks[0].conditions == ("Natalia sold clips to 48 of her friends in April.", "She sold half as many clips in May.")


# --------------------------------------------------------------------------- RLSTA


def test_rlsta_add_sample():
    tasks = load_rlsta_add(asset_path("rlsta/mt_add_math_train_sample.jsonl"))
    raw = _lines("rlsta/mt_add_math_train_sample.jsonl")
    assert len(tasks) == 32
    t = tasks[0]
    assert t.task_id == "gsm8k/0" and t.answer == "660"
    assert t.target == "what will be her phone bill for the entire next year?"
    assert t.conditions == (
        "Calculate the phone bill for next year after a 10% increase",
        "Gillian's usual phone bill is $50 per month",
        "The monthly bill will increase by 10%",
    )
    for t, r in zip(tasks, raw):
        assert t.full_prompt == r["question"] and (t.target, *t.conditions) == tuple(r["shards"])


def test_rlsta_refine_sample():
    tasks = load_rlsta_refine(asset_path("rlsta/mt_refine_math_train_sample.jsonl"))
    assert len(tasks) == 32
    t = tasks[0]
    assert t.answer == "660"  # the ORIGINAL problem's answer
    assert t.corrupted == (None, "Gillian's usual phone bill is $65 per month", "The monthly bill will increase by 15%")
    assert t.full_prompt == (
        "Calculate the phone bill for next year after a 10% increase. Gillian's usual phone bill is $50 per month. "
        "The monthly bill will increase by 10%. What will be her phone bill for the entire next year?"
    )
    # gsm8k/10: shards 1..5, modified 2..5 of which 3, 4, 5 are identical to the originals
    t10 = tasks[10]
    assert t10.task_id == "gsm8k/10"
    assert [c is not None for c in t10.corrupted] == [False, True, False, False, False]
    assert t10.meta["identical_modified"] == 3
    for t, r in zip(tasks, _lines("rlsta/mt_refine_math_train_sample.jsonl")):
        mod = {m["shard_id"]: m["shard"] for m in r["modified_shard"]}
        orig = {s["shard_id"]: s["shard"] for s in r["shards"]}
        assert set(t.corrupted_indices) == {k - 1 for k, v in mod.items() if v != orig[k]}


def test_lic_sample_and_task_selection():
    tasks = load_lic(asset_path("lic/lic_math_format_sample.json"))
    assert [t.task_id for t in tasks] == ["sharded-GSM8K/1246", "sharded-GSM8K/1166", tasks[2].task_id]
    t = tasks[0]
    assert t.target == "what's Ara's total basketball score over four years?"
    assert t.conditions[-1] == "she scores 21 points in each game"
    assert t.answer == "3360" and t.domain == "math"
    assert t.full_prompt.startswith("Ara joined the school basketball team")
    assert load_lic(asset_path("lic/lic_math_format_sample.json"), task="code") == []
    with pytest.raises(DataError, match="unknown LiC task 'poetry'"):
        load_lic(asset_path("lic/lic_math_format_sample.json"), task="poetry")


def _lic_file(tmp_path: Path, records: list) -> Path:
    p = tmp_path / "lic.json"
    p.write_text(json.dumps(records, indent=1))
    return p


def test_lic_whole_file_mixed_tasks(tmp_path):
    math = json.loads(asset_path("lic/lic_math_format_sample.json").read_text())[0]
    code = {
        "task_id": "sharded-HumanEval/1",
        "task": "code",
        "shards": [{"shard_id": 2, "shard": "return them sorted"}, {"shard_id": 1, "shard": "write a function f(xs)"}],
        "reference_tests": ["assert f([2,1]) == [1,2]"],
    }
    summary = {"task_id": "sharded_summary_0", "task": "summary", "shards": [{"shard_id": 0, "shard": "", "doc_idxs": [1]}]}
    p = _lic_file(tmp_path, [code, math, summary])
    assert [t.task_id for t in load_lic(p, task="math")] == ["sharded-GSM8K/1246"]
    (c,) = load_lic(p, task="code")
    assert c.domain == "code" and c.target == "write a function f(xs)" and c.conditions == ("return them sorted",)
    assert json.loads(c.meta["lic_extra"]) == {"reference_tests": ["assert f([2,1]) == [1,2]"]}
    with pytest.raises(DataError, match=r"lic.json:\d+: field 'shards\[0\].shard': expected a non-empty string"):
        load_lic(p, task="summary")


def test_lic_malformed_record_names_line_and_field(tmp_path):
    recs = json.loads(asset_path("lic/lic_math_format_sample.json").read_text())
    del recs[1]["shards"]
    p = _lic_file(tmp_path, recs)
    second = [i for i, l in enumerate(p.read_text().splitlines(), 1) if l == " {"][1]  # start of record 2
    assert second > 2
    with pytest.raises(DataError) as e:
        load_lic(p)
    assert str(e.value) == f"{p}:{second}: field 'shards': missing"


# --------------------------------------------------------------------------- malformed lines


class Raw(str):
    """A mutation that replaces the whole line with this text."""


def _write_with_bad_line(tmp_path: Path, src: str, line_no: int, mutate) -> Path:
    lines = asset_path(src).read_text().splitlines()[:4]
    d = json.loads(lines[line_no - 1])
    out = mutate(d)
    lines[line_no - 1] = out if isinstance(out, Raw) else json.dumps(d)
    p = tmp_path / "x.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


ADD = "rlsta/mt_add_math_train_sample.jsonl"
REFINE = "rlsta/mt_refine_math_train_sample.jsonl"
GSM = "gsm8k/train_sample.jsonl"


@pytest.mark.parametrize(
    "loader, src, mutate, message",
    [
        (load_rlsta_add, ADD, lambda d: d.update(shards=[]), "field 'shards': expected a non-empty list of strings"),
        (load_rlsta_add, ADD, lambda d: d.update(shards=["q?", 3]), "field 'shards': expected a non-empty list of strings"),
        (load_rlsta_add, ADD, lambda d: d.update(shards=["only a target"]), "field 'shards': expected a target and at least one condition"),
        (load_rlsta_add, ADD, lambda d: d.pop("question"), "field 'question': missing"),
        (load_rlsta_add, ADD, lambda d: d.update(task_id=7), "field 'task_id': expected a non-empty string"),
        (load_rlsta_add, ADD, lambda d: d.update(answer="no marker"), "field 'answer': expected a GSM8K solution"),
        (load_rlsta_add, ADD, lambda d: Raw("{not json"), "invalid JSON"),
        (load_rlsta_add, ADD, lambda d: Raw("[1, 2]"), "expected a JSON object"),
        (load_rlsta_refine, REFINE, lambda d: d["shards"][1].update(shard_id="1"), "field 'shards[1].shard_id': expected an integer"),
        (load_rlsta_refine, REFINE, lambda d: d["shards"][1].update(shard=""), "field 'shards[1].shard': expected a non-empty string"),
        (load_rlsta_refine, REFINE, lambda d: d["modified_shard"][0].update(shard_id=99), "field 'modified_shard': shard_id 99 is not in 'shards'"),
        (load_rlsta_refine, REFINE, lambda d: d["modified_shard"][0].update(shard_id=0), "field 'modified_shard': shard_id 0 is the target shard"),
        (load_rlsta_refine, REFINE, lambda d: d.update(shards=[]), "field 'shards': expected a non-empty list of shard objects"),
        (load_rlsta_refine, REFINE, lambda d: d.pop("modification_type"), "field 'modification_type': missing"),
        (load_gsm8k, GSM, lambda d: d.update(question=""), "field 'question': expected a non-empty string"),
        (load_gsm8k, GSM, lambda d: d.update(answer="#### "), "field 'answer': empty final answer"),
    ],
)
def test_malformed_line_names_file_line_and_field(tmp_path, loader, src, mutate, message):
    p = _write_with_bad_line(tmp_path, src, 3, mutate)
    with pytest.raises(DataError) as e:
        loader(p)
    assert str(e.value).startswith(f"{p}:3: {message}"), str(e.value)


def test_missing_file():
    with pytest.raises(DataError, match="no such file"):
        load_rlsta_add("/nonexistent/x.jsonl")


# --------------------------------------------------------------------------- source specs


def test_load_source_specs():
    assert len(load_source("gsm8k:@")) == 64
    assert len(load_source("gsm8k:@gsm8k/test_sample.jsonl")) == 64
    assert len(load_source("rlsta_add:@")) == 32
    assert load_source("rlsta_refine:@")[0].corrupted is not None
    assert len(load_source("lic:@")) == 3 and len(load_source("lic:@:math")) == 3
    p = str(asset_path("lic/lic_math_format_sample.json"))
    assert load_source(f"lic:{p}:code") == []
    syn = load_source("synthetic:4:3")
    assert len(syn) == 4 and all(len(t.conditions) == 4 for t in syn)
    for bad, msg in [("foo:x", "unknown source 'foo:x'"), ("gsm8k", "unknown source"), ("gsm8k:", "missing argument"),
                     ("synthetic:x", "expected synthetic:N"), ("gsm8k:@nope.jsonl", "no shipped data file")]:
        with pytest.raises(DataError, match=msg):
            load_source(bad)


def test_tfds_missing_is_a_clear_error():
    try:
        import tensorflow_datasets  # noqa: F401
    except ImportError:
        with pytest.raises(DataError, match="tensorflow-datasets is not installed"):
            load_gsm8k_tfds()
    else:  # pragma: no cover
        pytest.skip("tensorflow-datasets installed")


# --------------------------------------------------------------------------- full files


@needs_shared
def test_full_rlsta_files_load():
    add = load_rlsta_add(SHARED / "rlsta/mt_add_math_train.jsonl")
    ref = load_rlsta_refine(SHARED / "rlsta/mt_refine_math_train.jsonl")
    assert len(add) == len(ref) == 750
    assert [t.task_id for t in add] == [t.task_id for t in ref]
    assert all(a.answer == r.answer for a, r in zip(add, ref))
    identical = sum(t.meta["identical_modified"] for t in ref)
    assert identical == 935  # measured on the file: about a quarter of 3,705 modified shards


@needs_shared
def test_full_gsm8k_train_numbers_kept():
    tasks = load_gsm8k(SHARED / "gsm8k/train.jsonl")
    assert len(tasks) == 7473
    assert max(len(t.shards) for t in tasks) <= 10
    kept = sum(number_set(t.full_prompt) <= number_set(t.shards) for t in tasks)
    assert kept / len(tasks) >= 0.99
