"""judge_eval's incremental LLM-judge predictions: written chunk by chunk, resumed after a kill."""

from __future__ import annotations

import json

import pytest

from jaxrl_mt.rewards.judge_eval import llm_predictions


def _items(n: int) -> list[dict]:
    return [{"text": f"reply {k}", "label": "answer_attempt"} for k in range(n)]


class Judge:
    """A stand-in LLM judge (the function argument): labels by parity, records what it was asked."""

    def __init__(self):
        self.asked: list[list[str]] = []

    def __call__(self, block):
        self.asked.append([r["text"] for r in block])
        return ["answer_attempt" if int(r["text"].split()[1]) % 2 else "discussion" for r in block]


def test_predictions_are_appended_per_chunk_and_a_killed_run_resumes(tmp_path):
    path = tmp_path / "pred.jsonl"
    items, judge = _items(7), Judge()
    want = ["discussion", "answer_attempt"] * 3 + ["discussion"]
    assert llm_predictions(items, judge, str(path), chunk=3) == want
    assert [len(a) for a in judge.asked] == [3, 3, 1]
    lines = path.read_text().splitlines()
    assert [json.loads(x) for x in lines] == [{"text": f"reply {k}", "predicted": p} for k, p in enumerate(want)]
    # killed while writing the third chunk: 5 whole lines and a cut one
    path.write_text("\n".join(lines[:5]) + "\n" + lines[5][:9])
    judge2 = Judge()
    assert llm_predictions(items, judge2, str(path), chunk=3) == want
    assert judge2.asked == [["reply 5", "reply 6"]]  # only what was not written
    assert path.read_text().splitlines() == lines
    # labels of other items are refused, not mixed in
    with pytest.raises(ValueError, match="line 1 is not the label of item 1"):
        llm_predictions(_items(9)[2:], Judge(), str(path), chunk=3)
    assert llm_predictions(items, Judge(), None, chunk=4) == want  # no file: plain chunked calls
