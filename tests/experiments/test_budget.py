"""The comparison's budget rule (experiments.budget): hand-worked choices, and the summary read from transcripts."""

from __future__ import annotations

import json
from pathlib import Path

from experiments import budget
from experiments.common import compress_transcripts


def _row(cuts: tuple[float, float, float, float], acc: float) -> dict:
    return {"cut_at": {str(b): c for b, c in zip(budget.BUDGETS, cuts)}, "full_strict": acc}


def test_smallest_budget_wins_then_accuracy_then_order() -> None:
    rows = {"S0": _row((0.9, 0.5, 0.2, 0.05), 0.30),  # first <= 10% at 192
            "S1": _row((0.6, 0.08, 0.0, 0.0), 0.10),  # at 96
            "S2": _row((0.5, 0.10, 0.0, 0.0), 0.20),  # at 96 (exactly the limit counts), more accurate
            "S3": _row((0.11, 0.09, 0.0, 0.0), 0.20)}  # at 96, as accurate as S2 but later
    c = budget.choose(rows)
    assert c == {"prompt": "S2", "budget": 96, "fallback": False,
                 "smallest_budget": {"S0": 192, "S1": 96, "S2": 96, "S3": 96}}


def test_fallback_when_no_prompt_reaches_the_limit() -> None:
    rows = {"S0": _row((1.0, 0.9, 0.5, 0.3), 0.4), "S1": _row((1.0, 0.8, 0.4, 0.2), 0.1),
            "S2": _row((1.0, 0.9, 0.4, 0.11), 0.3)}
    c = budget.choose(rows)  # smallest cut at 128: S1 and S2 tie (0.4) -> S2, the more accurate
    assert (c["prompt"], c["budget"], c["fallback"]) == ("S2", 128, True)
    assert c["smallest_budget"] == {"S0": None, "S1": None, "S2": None}


def _record(i: int, tokens: int, reply: str, answer: str) -> dict:
    return {"conv_id": f"c{i}", "task_id": f"t{i}", "kind": "full", "run": 0, "gold": answer,
            "turns": [{"user": "q", "assistant": reply, "new_tokens": tokens,
                       "finish_reason": "length" if tokens >= budget.CEILING else "stop"}]}


def test_summary_from_gzipped_transcripts(tmp_path: Path) -> None:
    lengths = [10, 70, 100, 130, 200, 256, 20, 30, 40, 50]  # >= 64: 5, >= 96: 4, >= 128: 3, >= 192: 2
    folder = tmp_path / "S1" / "T0"
    folder.mkdir(parents=True)
    recs = [_record(i, n, "The answer is 7." if i < 4 else "no idea", "7") for i, n in enumerate(lengths)]
    (folder / "transcripts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    compress_transcripts(folder)
    s = budget.summarize(tmp_path)
    assert list(s["rows"]) == ["S1"]  # prompts without transcripts are left out
    r = s["rows"]["S1"]
    assert r["n"] == 10 and r["cut_at_ceiling"] == 0.1
    assert r["cut_at"] == {"64": 0.5, "96": 0.4, "128": 0.3, "192": 0.2}
    assert r["full_strict"] == 0.4
    assert s["choice"]["fallback"] and s["choice"]["prompt"] == "S1"
    assert "**Chosen: S1 at 128 tokens**" in budget.markdown(s)
