"""A model whose reply holds a lone surrogate (issue 53 item 2): the evaluation finishes.

Before: an ``http:`` model replying ``"\\ud800 The answer is 5."`` ended ``evaluate`` with rc 1 and a
40-line ``UnicodeEncodeError`` from ``eval/transcripts.py``, 0 transcripts, on every rerun.
"""

from __future__ import annotations

import json

from jaxrl_mt.eval.transcripts import TranscriptStore
from jaxrl_mt.evaluate import evaluate
from tests.eval.test_evaluate_cli import read_transcripts
from tests.eval.test_http_assistant import fault_server, http_config  # noqa: F401 (fixture)


def test_a_surrogate_reply_is_evaluated_and_written_as_the_replacement_character(tmp_path, fault_server):  # noqa: F811
    reply = b'{"choices": [{"message": {"content": "\\ud800 The answer is 5."}, "finish_reason": "stop"}]}'
    server = fault_server(lambda number, body: (200, {}, reply))
    out = evaluate(http_config(tmp_path, server.url, scenarios=("full",)), log=lambda s: None)
    records = read_transcripts(tmp_path / "transcripts.jsonl")
    assert len(records) == out["n_generated"] > 0
    assert all(t["assistant"] == "\ufffd The answer is 5." for r in records for t in r["turns"])


def test_the_store_writes_a_surrogate_as_the_replacement_character(tmp_path, caplog):
    """The store's own guard (a reply from any other source): one warning, never an error."""
    store = TranscriptStore(tmp_path / "t.jsonl")
    rec = {"conv_id": "c\ud800", "task_id": "t", "kind": "full", "run": 0, "score": 1.0,
           "turns": [{"assistant": "\ud800 The answer is 5."}]}
    store.append([rec])
    line = (tmp_path / "t.jsonl").read_text(encoding="utf-8")
    assert json.loads(line)["turns"][0]["assistant"] == "\ufffd The answer is 5."
    assert list(store.load()) == ["c\ufffd"] and "lone surrogates written as U+FFFD" in caplog.text
