"""The reply collector's problem choice: ``--source`` specs with slices and seeded synthetic sets,
``--exclude-tasks`` (disjoint by task from earlier sets), ``--split`` and the reply budget field.

The end-to-end test runs the real CLI on the session's tiny random Llama (conftest's
``tiny_chat_model_dir``) with a 3-token budget.
"""

from __future__ import annotations

import json

import pytest

from jaxrl_mt.data.records import DataError
from jaxrl_mt.eval.collect_replies import (
    KINDS,
    excluded_task_ids,
    main,
    parse_source,
    plan,
)


def test_parse_source_seeded_synthetic_and_slices():
    name, tasks = parse_source("s2=synthetic:5:2:31")
    assert name == "s2"
    assert [t.task_id for t in tasks] == [f"synthetic/31/{i}" for i in range(5)]
    assert len(tasks[0].conditions) == 3  # two steps: start value + two events
    _, sliced = parse_source("s2=synthetic:5:2:31[1:3]")
    assert [t.task_id for t in sliced] == ["synthetic/31/1", "synthetic/31/2"]
    _, gsm = parse_source("g=gsm8k:@gsm8k/test_sample.jsonl[14:16]")
    assert [t.task_id for t in gsm] == ["gsm8k/test_sample/14", "gsm8k/test_sample/15"]
    _, tail = parse_source("r=rlsta_add:@[30:]")
    assert [t.task_id for t in tail] == ["gsm8k/30", "gsm8k/31"]


@pytest.mark.parametrize("arg, msg", [
    ("synthetic:5:1:3", "expected NAME=SPEC"),
    ("s=synthetic:5:x:3", "synthetic:N:STEPS:SEED"),
    ("s=synthetic:5:1:3[9:]", "selects no task"),
])
def test_parse_source_errors(arg, msg):
    with pytest.raises(DataError, match=msg):
        parse_source(arg)


def test_excluded_task_ids_reads_ids_and_names_bad_line(tmp_path):
    f = tmp_path / "old.jsonl"
    f.write_text('{"task_id": "synthetic/7/1", "text": "a"}\n\n{"text": "no id"}\n', encoding="utf-8")
    assert excluded_task_ids([f]) == {"synthetic/7/1"}
    f.write_text('{"task_id": "a"}\n{not json\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"old\.jsonl:2: not JSON"):
        excluded_task_ids([f])


def test_cli_sources_exclusion_split_and_budget(tmp_path, tiny_chat_model_dir):
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"task_id": "synthetic/31/0"}) + "\n", encoding="utf-8")
    out = tmp_path / "replies.jsonl"
    argv = ["--out", str(out), "--model", str(tiny_chat_model_dir), "--max-new-tokens", "3", "--temperatures", "0",
            "--source", "s1=synthetic:2:1:31", "--exclude-tasks", str(old), "--split", "heldout2"]
    assert main(argv) == 0
    recs = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    _, tasks = parse_source("s1=synthetic:2:1:31")
    expected = sum(len(r.user_turns) for r in plan([("s1", tasks[1])], KINDS, 0))
    assert len(recs) == expected  # every turn of task 1's three conversations; task 0 excluded
    assert {r["task_id"] for r in recs} == {"synthetic/31/1"}
    assert {r["split"] for r in recs} == {"heldout2"}
    assert {r["max_new_tokens"] for r in recs} == {3}
    assert {r["kind"] for r in recs} == set(KINDS)
    assert main(argv) == 0  # a rerun resumes: nothing new is written
    assert len(out.read_text(encoding="utf-8").splitlines()) == expected
