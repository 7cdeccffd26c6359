"""LLM-graded LiC tasks (data2text, summary) against a real local HTTP judge."""

from __future__ import annotations

import json

import pytest

from jaxrl_mt.backends import make_backend
from jaxrl_mt.conversations import TurnRecord
from jaxrl_mt.data.loaders import load_lic
from jaxrl_mt.data.records import DataError, ShardedTask
from jaxrl_mt.eval.simulator import Judge, TurnScorer, plan_runs
from jaxrl_mt.eval.task_scoring import conversation_system
from jaxrl_mt.tasks.judged import JudgedTask, parse_grade, references_of
from tests.eval.test_user_sim import server  # noqa: F401  (fixture)

RECORD = {
    "task_id": "sharded-totto-7",
    "task": "data2text",
    "shards": [
        {"shard_id": 1, "shard": "Write one sentence describing the highlighted table cells."},
        {"shard_id": 2, "shard": "The table is the 2001 election results of Springfield."},
        {"shard_id": 3, "shard": "Highlighted: winner Alice Park, 61% of the vote."},
    ],
    "references": ["Alice Park won the 2001 Springfield election with 61% of the vote."],
}


@pytest.fixture
def record(tmp_path) -> ShardedTask:
    f = tmp_path / "lic.json"
    f.write_text(json.dumps([RECORD]))
    return load_lic(f, task="data2text")[0]


def test_parse_grade_and_references(record):
    assert [parse_grade(s) for s in ("Score: 7", "score = 7.5/10", "**Score:** 12", "I think 7")] == [7, 7.5, 10, None]
    assert references_of(record) == RECORD["references"]
    bare = ShardedTask(
        task_id="x", domain="data2text", target="Describe it.", conditions=(), full_prompt="Describe it.", answer=""
    )
    with pytest.raises(DataError, match=r"task x: field 'references': no reference answer"):
        references_of(bare)


def test_graded_by_the_http_judge(record, server):  # noqa: F811
    seen = []

    def respond(payload):
        text = payload["messages"][-1]["content"]
        seen.append(text)
        if text.startswith("You grade"):
            return 200, "Score: 8" if "Alice" in text.split("Assistant's answer:")[1] else "no idea"
        return 200, "Category: answer_attempt\nAnswer: none"

    server.respond = respond
    backend = make_backend(f"http:{server.url}#judge")
    task = JudgedTask("data2text", backend)
    v = task.verify("Alice Park won the 2001 election in Springfield with 61%.", record)
    assert (v.score, v.status) == (0.8, "graded")
    assert RECORD["references"][0] in seen[-1] and record.full_prompt in seen[-1]
    v = task.verify("Bob lost.", record)
    assert (v.score, v.status) == (0.0, "judge_error") and "names no score" in v.reason
    assert task.verify("   ", record).status == "no_answer"
    assert task.stats == {"graded": 1, "unparsed": 1}

    # Through the simulator's scorer, with the LLM judge deciding the answer attempt.
    plugins = {"data2text": task}
    runs, _ = plan_runs([record], ["sharded"], 1, system=lambda t: conversation_system(t, None, plugins))
    assert runs[0].system == task.system_prompt
    runs[0].turns.append(
        TurnRecord(0, runs[0].user_turns[0], "Alice Park won the 2001 election with 61%.", [1], [0.0], "stop", 10)
    )
    TurnScorer(runs, Judge(backend, name="http"), protocol="lic", verifier_mode="strict", tasks=plugins)(runs)
    info = runs[0].turns[0].info
    assert (info["label"], info["answer_attempt"], info["correct"], info["status"]) == (
        "answer_attempt",
        True,
        0.8,
        "graded",
    )
    assert not runs[0].done  # a partial grade does not end a lic conversation (a full score would)
