"""The per-task LiC table, worked out by hand from hand-made transcript records."""

from __future__ import annotations

import json

import pytest

from jaxrl_mt.eval.report import build_report, markdown_report, write_report
from jaxrl_mt.eval.task_report import (
    main,
    markdown_task_table,
    shows_task_table,
    task_table,
)


def rec(
    domain: str,
    task_id: str,
    kind: str,
    run: int,
    score: float,
    *,
    last: float | None = None,
    status: str | None = None,
) -> dict:
    """A transcript record with one turn; ``last``: that turn's correct_strict (default: the score)."""
    turn = {
        "index": 0,
        "label": "answer_attempt",
        "answer_attempt": True,
        "correct": score,
        "correct_strict": score if last is None else last,
    }
    if status:
        turn["status"] = status
    return {
        "conv_id": f"{task_id}|{kind}|{run}",
        "task_id": task_id,
        "kind": kind,
        "run": run,
        "domain": domain,
        "score": score,
        "scored_turn": 1,
        "first_answer_turn": 1,
        "n_turns": 1,
        "stop_reason": "no_more_turns",
        "turns": [turn],
    }


def records() -> list[dict]:
    out = []
    # code: c1 full [1, 1], c2 full [1, 0] -> P 75; sharded c1 [1, 0], c2 [0, 0] -> P 25.
    for tid, full, sharded in (("c1", (1, 1), (1, 0)), ("c2", (1, 0), (0, 0))):
        for r, s in enumerate(full):
            out.append(rec("code", tid, "full", r, s, status="passed" if s else "failed"))
        for r, s in enumerate(sharded):
            out.append(rec("code", tid, "sharded", r, s, status="passed" if s else "timeout"))
    # math: one instruction, full [1, 1] -> 100, sharded [0, 1] -> 50 (A90 90, U90-10 80); the
    # first sharded run's last reply is right although its score is 0 (judge-free check: 100).
    out += [
        rec("math", "m1", "full", 0, 1),
        rec("math", "m1", "full", 1, 1),
        rec("math", "m1", "sharded", 0, 0, last=1),
        rec("math", "m1", "sharded", 1, 1),
    ]
    # database: FULL only, both wrong.
    out += [
        rec("database", "d1", "full", 0, 0, status="wrong"),
        rec("database", "d1", "full", 1, 0, status="sql_error"),
    ]
    return out


def test_task_table_by_hand():
    t = task_table(records(), ["full", "sharded"])
    assert list(t) == ["code", "database", "math"]  # LiC's task order
    code, db, math = t["code"], t["database"], t["math"]
    assert (code["full"], code["sharded"], code["ratio"], code["n_instructions"]) == pytest.approx((75, 25, 1 / 3, 2))
    assert code["scenarios"]["sharded"]["scored_status"] == {"passed": 1, "timeout": 3}
    assert code["scenarios"]["full"]["scored_status"] == {"failed": 1, "passed": 3}
    assert (code["scenarios"]["full"]["n_runs"], code["scenarios"]["sharded"]["ratio_to_full"]) == (
        4,
        pytest.approx(1 / 3),
    )
    # c1 full [100, 100] -> A90 100; c2 full [100, 0] -> A90 = 0 + 0.9 * 100 = 90, U = 90 - 10 = 80.
    assert (code["scenarios"]["full"]["A90"], code["scenarios"]["full"]["U90_10"]) == pytest.approx((95, 40))
    assert (math["full"], math["sharded"], math["ratio"]) == pytest.approx((100, 50, 0.5))
    s = math["scenarios"]["sharded"]
    assert (s["A90"], s["U90_10"], s["last_reply_accuracy"]) == pytest.approx((90, 80, 100))
    assert (db["full"], db["sharded"], db["ratio"], list(db["scenarios"])) == (0.0, None, None, ["full"])
    assert db["scenarios"]["full"]["ratio_to_full"] is None  # P(FULL) = 0: no ratio


def test_report_json_and_markdown_gain_the_table(tmp_path):
    report = build_report(records(), scenarios=["full", "sharded"], protocol="lic", n_boot=20, extra={"model": "m"})
    assert report["tasks"] == json.loads(json.dumps(task_table(records(), ["full", "sharded"])))
    assert report["tasks"]["database"]["ratio"] is None
    md = markdown_report(report)
    assert "| model | code FULL | code SHARDED | code ratio | database FULL |" in md
    assert "| m | 75.0 | 25.0 | 0.33 | 0.0 | - | - | 100.0 | 50.0 | 0.50 |" in md
    assert "| code | sharded | 2 | 4 | 25.0 |" in md and "passed 1, timeout 3" in md
    files = write_report(report, tmp_path, plots=True)
    assert (tmp_path / "p_by_task.png").stat().st_size > 1000 and "p_by_task.png" in files


def test_math_only_report_keeps_its_layout(tmp_path):
    math = [r for r in records() if r["domain"] == "math"]
    report = build_report(math, scenarios=["full", "sharded"], protocol="lic", n_boot=20)
    assert not shows_task_table(report) and list(report["tasks"]) == ["math"]
    assert "Per task" not in markdown_report(report)
    write_report(report, tmp_path, plots=False)
    assert not (tmp_path / "p_by_task.png").exists()


def test_several_reports_make_one_table(tmp_path, capsys):
    a = build_report(records(), scenarios=["full", "sharded"], protocol="lic", n_boot=10, extra={"model": "A"})
    b = build_report(
        [r for r in records() if r["domain"] == "math"],
        scenarios=["full", "sharded"],
        protocol="lic",
        n_boot=10,
        extra={"model": "B"},
    )
    for name, r in (("a", a), ("b", b)):
        (tmp_path / f"{name}.json").write_text(json.dumps(r))
    assert main([str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert out == markdown_task_table([a, b]) + "\n"
    assert "| B |  |  |  |  |  |  | 100.0 | 50.0 | 0.50 |" in out
