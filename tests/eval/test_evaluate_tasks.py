"""`jaxrl_mt.evaluate` on every offline task at once (tiny model): the per-task table from the transcripts."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

from jaxrl_mt.data.loaders import load_source
from jaxrl_mt.evaluate import evaluate
from jaxrl_mt.tasks import get_task
from tests.eval.test_evaluate_cli import get_config, read_transcripts
from tests.eval.test_simulator import counting_sampler

SOURCES = {"math": "synthetic:1:0", "code": "humaneval:@:1", "database": "lic:@:database", "actions": "lic:@:actions"}


def recompute_tasks(records) -> dict[str, dict[str, float]]:
    """P per task and scenario straight from transcript scores: per instruction, then over instructions."""
    by: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in records:
        by[r["domain"]][r["kind"]][r["task_id"]].append(100.0 * r["score"])
    return {d: {k: float(np.mean([np.mean(s) for s in tasks.values()])) for k, tasks in kinds.items()}
            for d, kinds in by.items()}


def test_every_offline_task_end_to_end(tmp_path, tiny_model):
    cfg = get_config("cpu_all", task="code,database,actions,math", limit=1, runs=1, max_new_tokens=4,
                     workdir=str(tmp_path), bootstrap=20, plots=False)
    for task, spec in SOURCES.items():
        setattr(cfg.datasets, task, spec)
    out = evaluate(cfg, model=tiny_model, sampler=counting_sampler(tiny_model, max_batch=8), log=lambda s: None)
    assert out["n_generated"] == 4 * 2  # tasks x (FULL, SHARDED) x N=1
    recs = read_transcripts(tmp_path / "transcripts.jsonl")
    assert {(r["domain"], r["kind"]) for r in recs} == {(d, k) for d in SOURCES for k in ("full", "sharded")}
    # Each non-math verdict recomputed from the reply text with the task's verifier.
    tasks = {t.task_id: t for spec in SOURCES.values() for t in load_source(spec)[:1]}
    for r in recs:
        for turn in r["turns"]:
            if r["domain"] == "math":
                assert "status" not in turn
                continue
            v = get_task(r["domain"]).verify(turn["assistant"], tasks[r["task_id"]])
            assert (turn["correct"], turn["correct_strict"], turn["status"], turn["extracted"]) == (
                v.score, v.score, v.status, v.extracted)
            assert turn["answer_attempt"] == get_task(r["domain"]).is_answer_attempt(turn["assistant"],
                                                                                   tasks[r["task_id"]])
    text = (tmp_path / "transcripts.jsonl").read_text()
    assert "def check(" not in text and "CREATE TABLE" not in text  # task records stay out of transcripts
    report = json.loads((tmp_path / "report.json").read_text())
    assert list(report["tasks"]) == ["code", "database", "actions", "math"]
    want = recompute_tasks(recs)
    for d, kinds in want.items():
        t = report["tasks"][d]
        assert (t["full"], t["sharded"]) == pytest.approx((kinds["full"], kinds["sharded"]))
        assert t["ratio"] == (None if kinds["full"] == 0 else pytest.approx(kinds["sharded"] / kinds["full"]))
    md = (tmp_path / "report.md").read_text()
    assert "## Per task (LiC score: SHARDED / FULL)" in md
    assert "| model | code FULL | code SHARDED | code ratio | database FULL |" in md
    assert report["config"]["dataset"] == ["humaneval:@:1", "lic:@:database", "lic:@:actions", "synthetic:1:0"]
