"""The report from a hand-made comparison folder: seeds, cut shares, pass@k / pass^k, training dynamics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.report import build, write

RIGHT, WRONG = "The answer is 5.", "The answer is 7."  # gold 5


def _conv(task: str, kind: str, reply: str, run: int = 0, cut: bool = False, protocol: str = "final_turn") -> dict:
    """One single-turn transcript record (gold 5); `cut`: the reply budget stopped its reply."""
    turn = {"index": 0, "user": "How many?", "assistant": reply, "label": "answer_attempt", "answer_attempt": True,
            "new_tokens": 8 if cut else 3, "finish_reason": "length" if cut else "stop"}
    return {"conv_id": f"{task}|{kind}|{run}", "task_id": task, "kind": kind, "run": run, "gold": "5",
            "protocol": protocol, "score": float(reply == RIGHT), "first_answer_turn": 1, "stop_reason": "end",
            "n_turns": 1, "turns": [turn]}


def _greedy(full: tuple[str, str], sharded: tuple[str, str], refine: tuple[str, str],
            cut_full: tuple[bool, bool] = (False, False)) -> list[dict]:
    """Problems p0 and p1: their replies in FULL, MT-Add and MT-Refine."""
    return [_conv(f"gsm8k/p{i}", "full", full[i], cut=cut_full[i]) for i in range(2)] + \
        [_conv(f"gsm8k/p{i}", k, r[i]) for k, r in (("sharded", sharded), ("mt_refine", refine)) for i in range(2)]


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    """base (LiC: FULL p0 2 of 4 runs right, p1 none; SHARDED p0 4 of 4, p1 1 of 4) and two seeds of arm a:
    FULL a_s0 1, 1 (p1 cut), a_s1 0, 1; multi (mean of MT-Add and MT-Refine) a_s0 1, 0.5, a_s1 0.5, 0."""
    out = tmp_path / "cmp"
    manifest = {"models": [{"name": n, "spec": n, "run_dir": None} for n in ("base", "a_s0", "a_s1")],
                "heldout": "h.jsonl", "n_problems": 2, "families": ["gsm8k"], "lic_problems": 2, "lic_runs": 4,
                "greedy_only": ["a_s0", "a_s1"], "max_new_tokens": 8, "system": "", "seed": 0, "bootstrap": 200,
                "code": None, "command": "python -m experiments.compare (by hand)"}
    _write(out / "manifest.json", [manifest])
    greedy = {"base": _greedy((RIGHT, WRONG), (WRONG, WRONG), (RIGHT, WRONG)),
              "a_s0": _greedy((RIGHT, RIGHT), (RIGHT, WRONG), (RIGHT, RIGHT), cut_full=(False, True)),
              "a_s1": _greedy((WRONG, RIGHT), (WRONG, WRONG), (RIGHT, WRONG))}
    for name, recs in greedy.items():
        _write(out / "models" / name / "greedy" / "transcripts.jsonl", recs)
    right = {("full", 0): 2, ("full", 1): 0, ("sharded", 0): 4, ("sharded", 1): 1}
    _write(out / "models" / "base" / "lic" / "transcripts.jsonl",
           [_conv(f"gsm8k/p{i}", k, RIGHT if run < n else WRONG, run=run, protocol="lic")
            for (k, i), n in right.items() for run in range(4)])
    for name, probe in (("a_s0", (0.0, 0.5)), ("a_s1", (0.25, 0.25))):
        _write(out / "runs" / name / "metrics.jsonl",
               [{"step": 0, "probe/multi_turn_strict": probe[0]}, {"step": 1, "reward/total": 0.1},
                {"step": 2, "probe/multi_turn_strict": probe[1]}])
    return out


def test_report_sections_from_the_files(folder: Path) -> None:
    rep = build(folder)
    a0 = rep["models"]["a_s0"]
    assert a0["final_reply"]["full"]["cut"]["mean"] == 0.5  # p1's FULL reply hit the budget
    assert (a0["uncut_strict"]["full"]["mean"], a0["uncut_strict"]["full"]["n"]) == (1.0, 1)  # p0 only
    lic = rep["models"]["base"]["lic"]
    assert lic["full"]["pass@k"]["1"]["mean"] == lic["full"]["last_reply_strict"]["mean"] == 0.25
    assert lic["full"]["pass@k"]["2"]["mean"] == pytest.approx((5 / 6 + 0) / 2)
    assert lic["full"]["pass^k"]["2"]["mean"] == pytest.approx((1 / 6 + 0) / 2)
    assert lic["sharded"]["pass@k"]["2"]["mean"] == pytest.approx((1 + 0.5) / 2)  # p1: 1 - C(3, 2) / C(4, 2)
    assert lic["sharded"]["pass^k"]["2"]["mean"] == pytest.approx((1 + 0) / 2)
    assert sorted(lic["full"]["pass^k"]) == ["1", "2", "3", "4"] and "pass@k" not in rep["models"]["a_s0"]
    g = rep["seeds"]["groups"]["a"]
    assert g["models"] == ["a_s0", "a_s1"]
    assert g["strict"]["full"]["seeds"] == {"a_s0": 1.0, "a_s1": 0.5} and g["strict"]["full"]["mean"] == 0.75
    assert g["strict"]["multi"]["seeds"] == {"a_s0": 0.75, "a_s1": 0.25} and g["strict"]["multi"]["mean"] == 0.5
    assert g["curves"] == {"probe/multi_turn_strict": [[0, 0.125], [2, 0.375]]}
    assert list(rep["seeds"]["pairs"]) == ["a_s* - base"]
    assert rep["seeds"]["pairs"]["a_s* - base"]["full"]["diff"] == 0.25  # 0.75 - 0.5
    assert rep["seeds"]["pairs"]["a_s* - base"]["multi"]["diff"] == 0.25  # 0.5 - (0.5 + 0) / 2
    # average (Table 1's "Avg.": FULL, MT-Add, MT-Refine per problem): a_s0 p0 (1+1+1)/3, p1 (1+0+1)/3;
    # a_s1 p0 (0+0+1)/3, p1 (1+0+0)/3; base p0 (1+0+1)/3, p1 0
    assert rep["models"]["a_s0"]["strict"]["avg"]["mean"] == pytest.approx(5 / 6)
    assert g["strict"]["avg"]["mean"] == pytest.approx((5 / 6 + 1 / 3) / 2)
    assert rep["seeds"]["pairs"]["a_s* - base"]["avg"]["diff"] == pytest.approx(7 / 12 - 1 / 3)
    assert rep["pairs"]["a_s1 - base"]["avg"]["diff"] == pytest.approx(1 / 3 - 1 / 3)


def test_pairs_with_keeps_the_pairs_that_involve_the_named_models(folder: Path) -> None:
    assert list(build(folder)["pairs"]) == ["a_s0 - base", "a_s1 - base", "a_s1 - a_s0"]  # default: every pair
    manifest = json.loads((folder / "manifest.json").read_text())
    _write(folder / "manifest.json", [{**manifest, "pairs_with": ["base"]}])
    rep = build(folder)
    assert list(rep["pairs"]) == ["a_s0 - base", "a_s1 - base"]
    assert rep["pairs"]["a_s0 - base"]["full"]["diff"] == 0.5  # FULL: a_s0 1, 1 against base 1, 0
    _write(folder / "manifest.json", [{**manifest, "pairs_with": ["base"], "pairs": [["a_s0", "a_s1"]]}])
    rep = build(folder)  # compare --pairs a_s0:a_s1: that difference as well, in the order given
    assert list(rep["pairs"]) == ["a_s0 - base", "a_s1 - base", "a_s0 - a_s1"]
    assert rep["pairs"]["a_s0 - a_s1"]["full"]["diff"] == 0.5  # FULL: a_s0 1, 1 against a_s1 0, 1
    _write(folder / "manifest.json", [{**manifest, "pairs": [["a_s1", "a_s0"]]}])
    assert list(build(folder)["pairs"]) == ["a_s0 - base", "a_s1 - base", "a_s1 - a_s0"]  # not twice


def test_markdown_and_figure_are_written_the_same_twice(folder: Path) -> None:
    md = folder.with_suffix(".md")
    paths = write(build(folder), folder, md)
    assert (folder / "training_dynamics.png") in paths and (folder / "training_dynamics.png").stat().st_size > 1000
    text = md.read_text()
    for line in ("| base | FULL | 25.0 / 25.0 | 41.7 / 8.3 | 50.0 / 0.0 | 50.0 / 0.0 |",
                 "| base | MT-Add | 62.5 / 62.5 | 75.0 / 50.0 | 87.5 / 50.0 | 100.0 / 50.0 |",
                 "| a_s* | sd over seeds | 35.4 | 35.4 | 35.4 | 35.4 |",  # |x - y| / sqrt(2), x - y = 0.5 each
                 "| a_s* | a_s1 | 50.0 | 0.0 | 50.0 | 25.0 |",
                 "![training_dynamics.png](cmp/training_dynamics.png)"):
        assert line in text, line
    assert "| a_s0 | 50.0 [" in text and " | 100.0 [100.0, 100.0] | 1 | " in text  # FULL: cut, then uncut acc.
    for head in ("## Seeds", "## Training dynamics", "| a_s* - base | +25.0 ["):
        assert head in text, head
    before = [p.read_bytes() for p in paths]
    assert write(build(folder), folder, md) == paths and [p.read_bytes() for p in paths] == before


def test_total_compute_sums_every_training_invocation_and_evaluation() -> None:
    from experiments.markdown import _compute

    report = {"runs": {"a": {"info": {"wall_s": 1800.0}}, "b": {"info": {"wall_s": 5400.0}}, "c": {"info": {}}},
              "code": {"base": {"greedy": [{"seconds": 600.0}, {"seconds": 1200.0}], "lic": []},
                       "a": {"greedy": [{"code": {}}, {"seconds": 3600.0}], "lic": [{"code": {}}]}}}
    # training 7,200 s = 2.00 h over 2 timed runs; evaluations 1,800 + 3,600 s = 1.50 h over 2 timed ones (a/greedy's
    # first invocation was killed: no time), a/lic never timed
    assert _compute(report) == [
        "Total compute: training 2.00 h (2 runs), evaluation 1.50 h (2 evaluations), 3.50 h in all (wall time: "
        "each run's `run_info.json`, each evaluation's `code.json`); not timed (or an invocation of it): c, a/greedy, "
        "a/lic."]
    assert _compute({"runs": {}, "code": {}}) == []
    assert _compute({"runs": report["runs"], "code": {"b": {"greedy": [{"code": {}}]}}}) == [
        "Total compute: training 2.00 h (2 runs) (wall time: each run's `run_info.json`, each evaluation's "
        "`code.json`); not timed (or an invocation of it): c, b/greedy."]

    # a killed training invocation (timed to its last write by the resume) and a killed evaluation one
    killed = {"runs": {"d": {"info": {"wall_s": 900.0, "invocations": [{"wall_s": 300.0, "killed": True},
                                                                      {"wall_s": 600.0}]}}},
              "code": {"d": {"greedy": [{"code": {}, "seconds_to_last_write": 1000.0}, {"seconds": 800.0}]}}}
    assert _compute(killed) == [
        "Total compute: training 0.25 h (1 runs), evaluation 0.50 h (1 evaluations), 0.75 h in all (wall time: "
        "each run's `run_info.json`, each evaluation's `code.json`); killed and resumed, timed to the last write "
        "before the kill: d, d/greedy."]


def test_icpo_view_rows_and_differences() -> None:
    from experiments.markdown_behaviour import icpo_view

    ci = lambda m, lo, hi, n=2: {"mean": m, "lo": lo, "hi": hi, "n": n}  # noqa: E731
    model = lambda na, a: {"early_turns": {"non_answer": na, "answer": a},  # noqa: E731
                           "first_answer_turn": {"sharded": {"mean": 2.5, "frac_never": 0.25}},
                           "strict": {"sharded": ci(0.1, 0.0, 0.2)}}
    report = {"models": {"base": model(ci(0.2, 0.1, 0.3), ci(0.7, 0.6, 0.8)),
                         "icpo_s0": model(ci(0.6, 0.5, 0.7), ci(0.3, 0.2, 0.4))},
              "pairs": {"icpo_s0 - base": {"early_non_answer": {"diff": 0.4, "lo": 0.3, "hi": 0.5, "n": 2,
                                                                "excludes_zero": True}}}}
    out = icpo_view(report)
    assert out[-4:] == ["| base | 20.0 [10.0, 30.0] | 70.0 [60.0, 80.0] | 2.50 | 0.25 | 10.0 [0.0, 20.0] |",
                        "| icpo_s0 | 60.0 [50.0, 70.0] | 30.0 [20.0, 40.0] | 2.50 | 0.25 | 10.0 [0.0, 20.0] |", "",
                        "Difference in that non-answer share (percentage points, paired by problem; * = excludes 0): "
                        "icpo_s0 - base +40.0 [+30.0, +50.0] *."]
    for m in report["models"].values():  # no conversation with turns before the last: no table
        m["early_turns"]["non_answer"] = ci(None, None, None, n=0)
    assert icpo_view(report) == []


def test_a_run_that_keeps_a_best_checkpoint_says_which_step_is_evaluated(tmp_path) -> None:
    from experiments.markdown import _runs
    from experiments.report import _run_section

    run = tmp_path / "sft_s0"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"method": "sft", "rl": {"steps": 95}}))
    (run / "best.json").write_text(json.dumps({"step": 38, "value": 0.62968, "metric": "eval/val_loss"}))
    (tmp_path / "grpo_s0").mkdir()
    lines = _runs({"runs": {"sft_s0": _run_section(run), "grpo_s0": _run_section(tmp_path / "grpo_s0")}})
    assert lines[lines.index("- sft_s0: step 38 of 95, eval/val_loss 0.6297") - 2].startswith("Runs that keep a best")
    assert not any(line.startswith("- grpo_s0: step") for line in lines)


def test_the_models_line_says_what_each_model_adds_to_its_spec(folder: Path) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["models"][1]["strategy"] = "sedt"
    manifest["models"][2].update(recap=True, abstain=True)
    _write(folder / "manifest.json", [manifest])
    md = folder.with_suffix(".md")
    write(build(folder), folder, md)
    assert "Models: `base` (`base`), `a_s0` (`a_s0`, strategy sedt), `a_s1` (`a_s1`, RECAP, with the abstain " \
           "instruction).\n" in md.read_text()
