"""report.json / report.md / plots from hand-made transcript records with hand-computed metrics."""

from __future__ import annotations

import json

import pytest

from jaxrl_mt.eval.report import PERCENTILE_NOTE, build_report, markdown_report, write_report


def rec(task, kind, run, score, first=None, labels=("discussion",), stop="no_more_turns"):
    turns = [{"label": lab, "answer_attempt": lab == "answer_attempt", "correct": 0.0} for lab in labels]
    return {"conv_id": f"{task}|{kind}|{run}", "task_id": task, "kind": kind, "run": run, "score": score,
            "first_answer_turn": first, "n_turns": len(turns), "stop_reason": stop, "turns": turns}


def records():
    out = []
    # FULL: A scores [1, 1, 0, 1], B [0, 0, 0, 1].
    for task, scores in (("A", (1, 1, 0, 1)), ("B", (0, 0, 0, 1))):
        out += [rec(task, "full", r, float(s), first=1, labels=("answer_attempt",)) for r, s in enumerate(scores)]
    # SHARDED: A [0, 0, 0, 0], B [1, 0, 0, 0]; first answers at turns 2, 3, never...
    firsts = {("A", 0): 2, ("A", 1): 3, ("A", 2): None, ("A", 3): 2, ("B", 0): 3, ("B", 1): None, ("B", 2): None,
              ("B", 3): 4}
    for task, scores in (("A", (0, 0, 0, 0)), ("B", (1, 0, 0, 0))):
        for r, s in enumerate(scores):
            out.append(rec(task, "sharded", r, float(s), first=firsts[task, r],
                           labels=("clarification", "answer_attempt", "discussion")))
    return out


def test_metrics_by_hand():
    rep = build_report(records(), scenarios=["full", "sharded", "recap"], protocol="lic", n_boot=200, seed=0)
    full, sh = rep["scenarios"]["full"], rep["scenarios"]["sharded"]
    # A: sorted [0,1,1,1]: p10 at position 0.3 -> 0.3, p90 at 2.7 -> 1  => P 75, A90 100, U 70.
    # B: sorted [0,0,0,1]: p10 -> 0, p90 at 2.7 -> 0.7            => P 25, A90 70, U 70.
    assert full["per_instruction"]["A"] == {"scores": [1.0, 1.0, 0.0, 1.0], "P": 75.0, "A90": 100.0,
                                            "U90_10": pytest.approx(70.0), "n": 4}
    assert (full["P"], full["A90"], full["U90_10"]) == pytest.approx((50.0, 85.0, 70.0))
    # Sharded: A all 0 (P 0, A90 0, U 0); B as FULL's B (P 25, A90 70, U 70).
    assert (sh["P"], sh["A90"], sh["U90_10"]) == pytest.approx((12.5, 35.0, 35.0))
    assert sh["ratio_to_full"] == pytest.approx(0.25) and full["ratio_to_full"] == pytest.approx(1.0)
    assert (sh["n_instructions"], sh["n_runs"]) == (2, 8)
    fa = sh["first_answer_turn"]
    assert fa["n_answered"] == 5 and fa["mean"] == pytest.approx(14 / 5) and fa["median"] == 3.0
    assert fa["histogram"] == {"2": 2, "3": 2, "4": 1} and fa["frac_never"] == pytest.approx(3 / 8)
    assert sh["response_types"] == {"1": {"clarification": 8}, "2": {"answer_attempt": 8}, "3": {"discussion": 8}}
    assert sh["stop_reasons"] == {"no_more_turns": 8}
    # CIs bracket the point estimate; with two instructions they lie between the two values.
    lo, hi = sh["ci"]["P"]
    assert 0.0 <= lo <= 12.5 <= hi <= 25.0
    assert rep["missing_scenarios"] == ["recap"]
    assert rep["percentile_method"] == "linear" and "q/100*(N-1)" in rep["metrics_note"]
    assert rep["n_conversations"] == 16


def test_nan_becomes_null_and_zero_full():
    rs = [rec("A", "full", 0, 0.0), rec("A", "sharded", 0, 0.0)]
    rep = build_report(rs, scenarios=["full", "sharded"], protocol="final_turn", n_boot=10)
    sh = rep["scenarios"]["sharded"]
    assert sh["ratio_to_full"] is None  # P(FULL) = 0
    assert sh["first_answer_turn"]["mean"] is None and sh["first_answer_turn"]["frac_never"] == 1.0
    json.loads(json.dumps(rep, allow_nan=False))
    no_full = build_report([rec("A", "sharded", 0, 1.0)], scenarios=["sharded"], protocol="lic", n_boot=10)
    assert no_full["scenarios"]["sharded"]["ratio_to_full"] is None


def test_write_report_files(tmp_path):
    rep = build_report(records(), scenarios=["full", "sharded"], protocol="lic", n_boot=50,
                       extra={"model": "tiny"})
    files = write_report(rep, tmp_path)
    assert sorted(files) == ["aptitude_unreliability.png", "first_answer_turn.png", "p_by_scenario.png",
                             "report.html", "report.json", "report.md"]
    assert json.loads((tmp_path / "report.json").read_text()) == rep
    for name in ("aptitude_unreliability.png", "first_answer_turn.png", "p_by_scenario.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    md = (tmp_path / "report.md").read_text()
    assert md == markdown_report(rep)
    assert "| full | 2 | 8 | 50.0 |" in md and "| 85.0 | 70.0 | 1.00 |" in md
    assert "| sharded | 2 | 8 | 12.5 |" in md and "| 35.0 | 35.0 | 0.25 | 2.80 | 0.38 |" in md
    assert PERCENTILE_NOTE in md and "Model: `tiny`" in md
    assert write_report(rep, tmp_path / "np", plots=False).keys() == {"report.json", "report.md", "report.html"}


def _with_last(rec_: dict, strict: float, lenient: float | None = None) -> dict:
    rec_["turns"][-1] = {**rec_["turns"][-1], "correct": strict if lenient is None else lenient,
                         "correct_strict": strict}
    return rec_


def test_judge_free_last_reply_accuracy_and_warning():
    # FULL: P 50 (A 75, B 25); last replies correct: A [1, 1, 1, 1], B [0, 0, 0, 1] -> 100 and 25 -> 62.5.
    out = []
    for task, scores, last in (("A", (1, 1, 0, 1), (1, 1, 1, 1)), ("B", (0, 0, 0, 1), (0, 0, 0, 1))):
        out += [_with_last(rec(task, "full", r, float(s), first=1, labels=("answer_attempt",)), float(x))
                for r, (s, x) in enumerate(zip(scores, last))]
    # SHARDED: P 12.5; last replies all correct under the strict verifier except B's run 3 -> (100 + 75) / 2.
    # Its lenient "correct" is 0 everywhere: the cross-check must read the strict field.
    for task, scores in (("A", (0, 0, 0, 0)), ("B", (1, 0, 0, 0))):
        out += [_with_last(rec(task, "sharded", r, float(s), labels=("discussion",)),
                           0.0 if (task, r) == ("B", 3) else 1.0, lenient=0.0) for r, s in enumerate(scores)]
    rep = build_report(out, scenarios=["full", "sharded"], protocol="lic", n_boot=10)
    full, sh = rep["scenarios"]["full"], rep["scenarios"]["sharded"]
    assert full["last_reply_accuracy"] == pytest.approx(62.5) and full["judge_gap"] == pytest.approx(-12.5)
    assert sh["last_reply_accuracy"] == pytest.approx(87.5) and sh["judge_gap"] == pytest.approx(-75.0)
    assert len(rep["warnings"]) == 2 and rep["warnings"][0].startswith("full: P = 50.0")
    assert "87.5" in rep["warnings"][1]
    md = markdown_report(rep)
    assert "last-reply acc. (judge-free)" in md and "| 62.5 |" in md and md.count("**Warning**") == 2


def test_no_warning_within_ten_points():
    # P 100 and last-reply accuracy 90 (one of ten runs ends on a wrong reply): a gap of exactly 10 is no warning.
    out = [_with_last(rec("A", "full", r, 1.0, first=1, labels=("answer_attempt",)), 0.0 if r == 0 else 1.0)
           for r in range(10)]
    rep = build_report(out, scenarios=["full"], protocol="lic", n_boot=10)
    assert rep["scenarios"]["full"]["judge_gap"] == pytest.approx(10.0) and rep["warnings"] == []
