"""calibrate: pass@k and the filter's keep rule from several runs, the tables, --recompute from files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jaxrl_mt.data.loaders import load_source
from experiments.calibrate import any_correct, main, more_correct, runs_per_task


def test_any_correct_and_more_correct() -> None:
    scores = {"a": 0.0, "b": 0.25, "c": 1.0}
    assert any_correct(scores) == {"a": 0.0, "b": 1.0, "c": 1.0}
    # keep rule st > mt, on the tasks both hold only; equal is not kept
    assert more_correct({"a": 0.5, "b": 0.25, "c": 0.5}, {"a": 0.25, "b": 0.25, "d": 0.0}) == {"a": 1.0, "b": 0.0}


def test_runs_per_task_counts_one_kind_of_kept_tasks() -> None:
    recs = [{"kind": "full", "task_id": "x"}] * 3 + [{"kind": "full", "task_id": "y"},
                                                      {"kind": "sharded", "task_id": "y"}] * 2
    assert runs_per_task(recs, "full", lambda t: True) == 3
    assert runs_per_task(recs, "full", lambda t: t == "y") == 2
    assert runs_per_task(recs, "mt_refine", lambda t: True) == 0


def _record(task_id: str, kind: str, run: int, reply: str, gold: str) -> dict:
    return {"conv_id": f"{task_id}#{kind}#{run}", "task_id": task_id, "kind": kind, "run": run, "score": 0.0,
            "gold": gold, "turns": [{"index": 0, "user": "q", "assistant": reply}]}


def test_recompute_builds_pass_at_k_tables_from_transcripts(tmp_path: Path, capsys) -> None:
    """Two problems, 4 runs at T = 1: problem 0 is solved single-turn in 2 of 4 runs and multi-turn in
    1 of 4; problem 1 never. FULL accuracy 25%, pass@4 50%, FULL > MT-Add on 1 of 2 problems."""
    spec = "family:train:2:1"
    tasks = load_source(spec)
    lines = []
    for i, t in enumerate(tasks):
        right, wrong = f"The answer is {t.answer}.", f"The answer is {int(t.answer) + 100}."
        for run in range(4):
            lines.append(_record(t.task_id, "full", run, right if i == 0 and run < 2 else wrong, t.answer))
            lines.append(_record(t.task_id, "sharded", run, right if i == 0 and run == 0 else wrong, t.answer))
            lines.append(_record(t.task_id, "mt_refine", run, wrong, t.answer))
    d = tmp_path / "T1"
    d.mkdir()
    (d / "transcripts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    (d / "eval_config.json").write_text(json.dumps({"model": "m", "max_new_tokens": 128, "system_prompt": "Be brief.",
                                                    "temperature": 1.0}), encoding="utf-8")

    assert main(["--out", str(tmp_path), "--families", f"tr={spec}", "--temps", "1", "--runs", "4",
                 "--recompute"]) == 0
    summary = json.loads((tmp_path / "calibration.json").read_text())
    # the setting the transcripts were made with, not --recompute's default flags
    assert summary["settings"] == {"T1": {"model": "m", "max_new_tokens": 128, "system_prompt": "Be brief."}}
    row = summary["table"]["T1/tr"]
    assert row["runs"] == 4
    assert row["full_strict"]["mean"] == pytest.approx(0.25) and row["full_strict"]["n"] == 2
    assert row["sharded_strict"]["mean"] == pytest.approx(0.125)
    assert row["full_strict_any"]["mean"] == pytest.approx(0.5)
    assert row["sharded_strict_any"]["mean"] == pytest.approx(0.5)
    assert row["mt_refine_strict_any"]["mean"] == 0.0
    assert row["full_gt_sharded"]["mean"] == pytest.approx(0.5) and row["full_gt_mt_refine"]["mean"] == 0.5
    md = (tmp_path / "calibration.md").read_text()
    assert "| 1 | tr | 2 | 4 | 25 [" in md  # accuracy with its CI
    assert "| 1 | tr | 2 | 4 | 50 [" in md and "pass@k" in md  # the pass@k table
    assert capsys.readouterr().out == md + "\n"  # printed too


def test_runs_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--runs must be >= 1"):
        main(["--out", str(tmp_path), "--runs", "0", "--recompute"])


def test_cut_shares_at_the_run_budget_and_smaller_ones(tmp_path: Path) -> None:
    """FULL replies of 10, 40, 64 (cut) and 64 (cut) tokens at a 64-token budget: 50% cut; a 40-token
    budget would cut 3 of 4, a 50-token one 2 of 4, 8 tokens all; median length 64 (upper median)."""
    from experiments.calibrate import cut_shares

    recs = []
    for i, (n, reason) in enumerate([(10, "stop"), (40, "stop"), (64, "length"), (64, "length")]):
        r = _record(f"t{i}", "full", 0, "x", "1")
        r["turns"][0].update(new_tokens=n, finish_reason=reason)
        recs.append(r)
    recs.append(_record("t9", "full", 0, "no length recorded", "1"))  # skipped
    c = cut_shares(recs, "full", lambda t: True, [8, 40, 50])
    assert c == {"n": 4, "median_tokens": 64.0, "cut": 0.5, "cut_at": {"8": 1.0, "40": 0.75, "50": 0.5}}
    assert cut_shares(recs, "sharded", lambda t: True, [8]) is None
    assert cut_shares(recs, "full", lambda t: t == "t0", [8])["cut"] == 0.0
