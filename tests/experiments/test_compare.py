"""compare's job list: which evaluations each model gets (greedy always; LiC unless --greedy-only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments import compare
from experiments.compare import (Comparison, attach_run_files, evaluation_jobs, extra_pairs, greedy_only,
                                 inference_arms, main, parse, resolve_models)


def _args(lic_runs: int = 4, only: str = "", strategy: str = "", recap: str = "", abstain: str = "") -> Comparison:
    return parse(["--lic-runs", str(lic_runs), "--greedy-only", only, "--strategy", strategy, "--recap", recap,
                  "--abstain-models", abstain])


def _m(name: str, **kw) -> dict:
    return {"name": name, "spec": "B", "run_dir": None, **kw}


def test_greedy_only_models_skip_the_lic_runs_and_the_others_keep_them() -> None:
    a = _args(only=" rlsta_a05, rlsta_a2 ,")
    assert greedy_only(a) == ["rlsta_a05", "rlsta_a2"]
    g, lic = Path("g.jsonl"), Path("l.jsonl")
    full = evaluation_jobs(_m("rlsta_exp"), g, lic, a)
    assert [sub for sub, _ in full] == ["greedy", "lic"]
    assert full[0][1] == dict(dataset=("tasks:g.jsonl",), scenarios="full,sharded,mt_refine", runs=1,
                              temperature=0.0, protocol="final_turn")
    assert full[1][1] == dict(dataset=("tasks:l.jsonl",), scenarios="full,sharded", runs=4, temperature=1.0,
                              protocol="lic")
    assert [sub for sub, _ in evaluation_jobs(_m("rlsta_a2"), g, lic, a)] == ["greedy"]
    assert [sub for sub, _ in evaluation_jobs(_m("rlsta_exp"), g, lic, _args(lic_runs=0))] == ["greedy"]


def test_inference_arms_change_only_their_strategy_or_scenarios() -> None:
    a = _args(strategy="sedt=sedt", recap="recap", abstain="rlaar_s0")
    arms = inference_arms(a, ["base", "sedt", "recap", "rlaar_s0"])
    assert arms == {"sedt": {"strategy": "sedt"}, "recap": {"recap": True}, "rlaar_s0": {"abstain": True}}
    g, lic = Path("g.jsonl"), Path("l.jsonl")
    plain = evaluation_jobs(_m("base"), g, lic, a)
    sedt = evaluation_jobs(_m("sedt", **arms["sedt"]), g, lic, a)
    recap = evaluation_jobs(_m("recap", **arms["recap"]), g, lic, a)
    for (_, p), (_, s_) in zip(plain, sedt):
        assert s_ == {**p, "strategy": "sedt"}  # the strategy is the one thing compared
    assert recap[0][1] == {**plain[0][1], "scenarios": "full,recap"}
    assert recap[1][1] == {**plain[1][1], "scenarios": "full,recap"}
    rlaar = evaluation_jobs(_m("rlaar_s0", **arms["rlaar_s0"]), g, lic, a)
    assert [kw for _, kw in rlaar] == [{**kw, "abstain": True} for _, kw in plain]
    with pytest.raises(SystemExit, match=r"\['sedt2'\] are not among"):
        inference_arms(_args(strategy="sedt2=sedt"), ["base", "sedt"])
    with pytest.raises(SystemExit, match="not NAME=STRATEGY"):
        inference_arms(_args(strategy="sedt"), ["sedt"])


def test_a_greedy_only_name_that_is_not_a_model_fails_before_anything_runs(tmp_path: Path) -> None:
    out = tmp_path / "r.md"
    with pytest.raises(SystemExit, match=r"--greedy-only: \['rlsta_a5'\] are not among the --models names"):
        main(["--models", "base", "--greedy-only", "rlsta_a5", "--out", str(out)])
    assert not out.with_suffix("").exists()


def test_extra_pairs_name_two_models_each_and_a_wrong_one_fails_before_anything_runs(tmp_path: Path) -> None:
    models = [_m("base"), _m("rlaar_s0"), _m("base_abstain")]
    assert extra_pairs(parse(["--pairs", " rlaar_s0:base_abstain,"]), models) == [["rlaar_s0", "base_abstain"]]
    assert extra_pairs(Comparison(), models) == []
    for bad in ("rlaar_s0", "rlaar_s0:", "a:b:c"):
        with pytest.raises(SystemExit, match="is not B:A"):
            extra_pairs(Comparison(pairs=(bad,)), models)
    out = tmp_path / "r.md"
    with pytest.raises(SystemExit, match=r"--pairs: \['rlaar'\] are not among the --models names"):
        main(["--models", "base", "--pairs", "rlaar:base", "--out", str(out)])
    assert not out.with_suffix("").exists()


def test_named_model_specs(tmp_path: Path) -> None:
    run = tmp_path / "grpo_exp"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    spec = "builtin:smollm2-135m-instruct+lora:docs/results/exp2/runs/grpo_s0/adapter"
    got = resolve_models(f"base,grpo_s0={spec},{run},http:x=1", "B")
    assert got == [{"name": "base", "spec": "B", "run_dir": None},
                   {"name": "grpo_s0", "spec": spec, "run_dir": None},
                   {"name": "grpo_exp", "spec": f"workdir:{run}", "run_dir": str(run)},
                   {"name": "http_x=1", "spec": "http:x=1", "run_dir": None}]  # ':' before '=': not a name
    with pytest.raises(SystemExit, match="duplicate"):
        resolve_models(f"a={spec},a=base", "B")


def test_committed_run_files_are_attached_to_named_models_only(tmp_path: Path) -> None:
    (tmp_path / "grpo_s0").mkdir()
    (tmp_path / "grpo_s0" / "run_info.json").write_text("{}")
    (tmp_path / "sft_s0").mkdir()  # no run_info.json: not a run's files
    models = [_m("base"), _m("grpo_s0"), _m("sft_s0"), {**_m("rlsta_exp"), "run_dir": "runs/rlsta_exp"}]
    got = attach_run_files(models, tmp_path)
    assert [m["run_dir"] for m in got] == [None, str(tmp_path / "grpo_s0"), None, "runs/rlsta_exp"]


def test_the_command_line_is_a_thin_wrapper_of_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """main parses the options into a Comparison (each a typed field) and hands it to run, the manifest's
    command the one given; a Comparison's argv parses back to itself."""
    seen = []
    monkeypatch.setattr(compare, "run", lambda c: seen.append(c) or 0)
    argv = ["--models", "base, x=B ,", "--limit", "3", "--abstain", "--system", "Be brief.", "--out", "o.md"]
    assert main(argv) == 0
    assert seen == [Comparison(models=("base", "x=B"), limit=3, abstain=True, system="Be brief.", out="o.md",
                               command="python -m experiments.compare --models 'base, x=B ,' --limit 3 "
                               "--abstain --system 'Be brief.' --out o.md")]
    c = Comparison(models=("base",), pairs=("a:b",), title="It's", gzip=True, lic_runs=0)
    assert parse(c.argv()) == c and c.argv() == ["--lic-runs", "0", "--pairs", "a:b", "--title", "It's", "--gzip"]
    assert c.command_line() == "python -m experiments.compare --lic-runs 0 --pairs a:b --title 'It'\"'\"'s' --gzip"
    assert parse([]) == Comparison() and greedy_only(Comparison()) == []
