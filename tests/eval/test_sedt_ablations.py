"""SeDT's ablation arms: one signal alone, uniform relevance, random return-to-go (issue 33, item 7).

Pure tests work the relevance out by hand on a three-turn example; model-backed tests run the arms
in ``sedt_eval`` on the session's tiny random Llama (``tiny_model`` in conftest) next to SeDT, on
the same histories.
"""

from __future__ import annotations

import json
import re
import zlib

import numpy as np
import pytest

from jaxrl_mt.eval.sedt_eval import (ABLATION_ARMS, CONTROL, DEFAULT_SOURCE, NO_FORMAT, PLAIN, SEDT, SEDT_NC, main,
                                     parse_overrides, plan, report_md, results_from_records, run_eval)
from jaxrl_mt.eval.sedt_files import check_settings, stored_config
from jaxrl_mt.sampling import SamplingConfig
from jaxrl_mt.sedt import (ABLATIONS, CONFIRMED, UNCERTAIN, Annotation, SeDTConfig, ablate, ablation_rng, annotate,
                           format_prompt, random_returns_to_go, returns_to_go)
from tests.eval.test_sedt_eval import FMT, AnnotationReader, _clip_runs, _sampler

ANCHOR = "Compute the final numeric answer to the word problem"  # compute final numeric answer word problem
SHARDS = ["What is the final answer?",  # final, answer: Jaccard 2/6
          "She sold 48 clips.",  # sold, 48, clips: 0
          "Compute the numeric answer to this word problem."]  # compute numeric answer word problem: 5/6
NUMBER = re.compile(r"\d+(?:\.\d+)?")
C, U = CONFIRMED, UNCERTAIN


def _ann(sem=(0.9, 0.2, 0.7)) -> Annotation:
    return annotate(SHARDS, list(sem), ANCHOR, SeDTConfig())


def _rtg_numbers(prompt: str) -> list[float]:
    return [float(x) for x in re.findall(r"^\((\d+\.\d\d), ", prompt, flags=re.M)]


# --------------------------------------------------------------------------- pure


def test_single_signal_relevance_by_hand():
    ann, cfg = _ann(), SeDTConfig()
    assert ann.lex == (1 / 3, 0.0, 5 / 6) and ann.pos == (0.5, 1.0, 0.5)  # the hand-worked signals
    sem = ablate(ann, "semantic_only", cfg)
    assert sem.rel == (0.9, 0.2, 0.7) and sem.labels == (C, U, C)
    assert sem.rtg == pytest.approx((1.8, 0.9, 0.7), abs=1e-15)
    lex = ablate(ann, "lexical_only", cfg)
    assert lex.rel == (1 / 3, 0.0, 5 / 6) and lex.labels == (U, U, C)  # mean 7/18 > 1/3
    pos = ablate(ann, "positional_only", cfg)
    assert pos.rel == (0.5, 1.0, 0.5) and pos.labels == (U, C, U) and pos.rtg == (2.0, 1.5, 0.5)
    # the last-shard floor (0.5) still applies to a single signal, as in SeDT
    low = ablate(_ann(sem=(0.9, 0.2, 0.3)), "semantic_only", cfg)
    assert low.rel == (0.9, 0.2, 0.5)
    # everything but the relevance, return-to-go and labels is SeDT's
    for a in (sem, lex, pos):
        assert (a.shards, a.anchor, a.sem, a.lex, a.pos) == (ann.shards, ann.anchor, ann.sem, ann.lex, ann.pos)
    assert ann.rel != sem.rel and ann.rel != lex.rel  # SeDT mixes the signals (0.6, 0.2, 0.2)


def test_uniform_relevance_is_equal_for_every_turn():
    ann = _ann()
    uni = ablate(ann, "uniform", SeDTConfig())
    m = sum(ann.rel) / 3
    assert len(set(uni.rel)) == 1 and uni.rel[0] == pytest.approx(m, abs=1e-15)
    assert uni.rtg == pytest.approx((3 * m, 2 * m, m), abs=1e-12) and uni.rtg[0] == pytest.approx(ann.rtg[0])
    assert uni.labels == (U, U, U)  # no turn is strictly above the mean


def test_random_rtg_prompt_differs_from_sedt_only_in_the_numbers():
    ann, cfg = _ann(), SeDTConfig()
    rnd = ablate(ann, "random_rtg", cfg, ablation_rng(7, "clips0|sharded|0"))
    sedt, ablated = format_prompt(ann, FMT), format_prompt(rnd, FMT)
    assert NUMBER.sub("#", sedt) == NUMBER.sub("#", ablated) and sedt != ablated
    a, b = _rtg_numbers(sedt), _rtg_numbers(ablated)
    assert len(a) == len(b) == 3 and all(x != y for x, y in zip(a, b))  # every return-to-go number differs
    assert b == sorted(b, reverse=True) and 0 <= b[-1] and b[0] < 3  # the same format: non-increasing sums of [0, 1)
    assert (rnd.labels, rnd.rel, rnd.shards) == (ann.labels, ann.rel, ann.shards)  # labels and text are SeDT's
    # seeded: u ~ U[0, 1) from (seed, crc32(conv_id)); the same seed gives the same prompt, another run other numbers
    u = np.random.default_rng([7, zlib.crc32(b"clips0|sharded|0")]).uniform(0.0, 1.0, size=3)
    assert rnd.rtg == tuple(returns_to_go(u))
    assert format_prompt(ablate(ann, "random_rtg", cfg, ablation_rng(7, "clips0|sharded|0")), FMT) == ablated
    assert _rtg_numbers(format_prompt(ablate(ann, "random_rtg", cfg, ablation_rng(7, "clips0|sharded|1")), FMT)) != b
    assert random_returns_to_go(1, np.random.default_rng(0)).shape == (1,)


def test_ablations_are_selected_like_the_guard_ablation():
    assert parse_overrides(["ablations=all"]).ablations == ABLATIONS
    assert parse_overrides(["ablations=random_rtg,semantic_only"]).ablations == ("semantic_only", "random_rtg")
    assert parse_overrides(['ablations=["uniform"]', "guard=coverage"]).ablations == ("uniform",)
    assert SeDTConfig().ablations == ()
    with pytest.raises(ValueError, match="field 'ablations': unknown 'semantic'"):
        parse_overrides(["ablations=semantic"])
    with pytest.raises(ValueError, match="random_rtg"):
        ablate(_ann(), "random_rtg", SeDTConfig())  # random numbers need a seeded generator
    assert list(ABLATION_ARMS.values()) == ["ablation: semantic_only", "ablation: lexical_only",
                                            "ablation: positional_only", "ablation: uniform", "ablation: random_rtg"]


# --------------------------------------------------------------------------- in sedt_eval, with a (tiny) model


def test_ablation_arms_run_on_the_same_histories_with_paired_intervals(tiny_model):
    sampling, runs = SamplingConfig(max_new_tokens=6), plan(DEFAULT_SOURCE, 2, 2)
    cfg = SeDTConfig(ablations="all", self_correct=False)
    s = _sampler(tiny_model)
    results, records = run_eval(s, runs, sampling, cfg=cfg, seed=5)
    arms = [NO_FORMAT, PLAIN, CONTROL, SEDT_NC, SEDT, *ABLATION_ARMS.values()]
    assert results["arms"] == arms and set(results["P_ci"]) == set(arms)
    # one sampler call per ablation arm, after SeDT's, at SeDT's seed, one row per conversation
    calls = s.calls[-len(ABLATIONS) - 1:]
    assert len({seed for _, seed in calls}) == 1 and all(len(p) == 4 for p, _ in calls)
    final_seed = calls[0][1]
    for rec in records:
        base = Annotation.from_json(rec["sedt"]["annotation"])
        for n, arm in ABLATION_ARMS.items():
            want = ablate(base, n, cfg, ablation_rng(final_seed, rec["conv_id"]))
            assert rec["arms"][arm]["message"] == format_prompt(want, FMT)
            assert rec["arms"][arm]["annotation"] == json.loads(json.dumps(want.to_json()))
        rnd = rec["arms"][ABLATION_ARMS["random_rtg"]]["message"]
        assert NUMBER.sub("#", rnd) == NUMBER.sub("#", rec["arms"][SEDT_NC]["message"])
        assert _rtg_numbers(rnd) != _rtg_numbers(rec["arms"][SEDT_NC]["message"])
    # each ablation arm: paired differences from SeDT's first answer and from the control
    rows = {(d["from"], d["to"]): d for d in results["ablations"]}
    assert set(rows) == {(b, arm) for arm in ABLATION_ARMS.values() for b in (SEDT_NC, CONTROL)}
    for (b, arm), d in rows.items():
        assert d["dP"] == pytest.approx(results["metrics"][arm]["P"] - results["metrics"][b]["P"])
        assert d["dcorrect"] == results["correct"][arm] - results["correct"][b]
        lo, hi = d["dP_ci"]
        assert lo <= d["dP"] <= hi
    assert results == results_from_records(json.loads(json.dumps(records)), sampling, cfg, 5, results["seconds"])
    rep = report_md(results)
    for arm in ABLATION_ARMS.values():
        n = arm.removeprefix("ablation: ")
        assert f"| {arm} | " in rep and f"| {n} vs SeDT's relevance | {SEDT_NC} -> {arm} | " in rep
        assert f"| {n} vs no annotation | {CONTROL} -> {arm} | " in rep


def test_ablations_leave_the_histories_and_todays_arms_as_they_are(tiny_model):
    """The same histories, and the same messages and answers of today's arms, as a run without the ablations."""
    sampling = SamplingConfig(max_new_tokens=6)
    _, with_abl = run_eval(_sampler(tiny_model), plan(DEFAULT_SOURCE, 2, 1), sampling,
                           cfg=SeDTConfig(ablations="all"), seed=2)
    _, without = run_eval(_sampler(tiny_model), plan(DEFAULT_SOURCE, 2, 1), sampling, cfg=SeDTConfig(), seed=2)
    assert len(with_abl) == len(without) == 2
    for a, b in zip(with_abl, without):
        assert a["history"] == b["history"] and a["sedt"] == b["sedt"]
        assert set(a["arms"]) == set(b["arms"]) | set(ABLATION_ARMS.values())
        assert {k: v for k, v in a["arms"].items() if k in b["arms"]} == b["arms"]


def test_a_run_without_ablations_keeps_the_stored_settings_of_earlier_runs(tmp_path):
    """settings.json of a run from before the ablation arms (docs/results/sedt30) still matches, so it resumes;
    a run with ablation arms is another experiment."""
    old = json.loads(open("docs/results/sedt30/settings.json", encoding="utf-8").read())
    settings = {**old, "sedt_config": stored_config(SeDTConfig())}
    (tmp_path / "settings.json").write_text(json.dumps(old))
    check_settings(tmp_path, settings)
    with pytest.raises(ValueError, match="holds a run with sedt_config="):
        check_settings(tmp_path, {**old, "sedt_config": stored_config(SeDTConfig(ablations="uniform"))})


def test_an_annotation_reader_gains_as_much_from_every_ablation(tiny_model):
    """A policy that answers right whenever it sees SeDT's prompt format: every ablation arm is right too,
    so the ablations' paired intervals are certain: 0 from SeDT's first answer, +100 from the control."""
    s = _sampler(tiny_model, AnnotationReader)
    cfg = SeDTConfig(ablations="all")
    results, _ = run_eval(s, _clip_runs(2, 2), SamplingConfig(max_new_tokens=4), cfg=cfg, seed=0)
    for arm in ABLATION_ARMS.values():
        assert results["metrics"][arm]["P"] == 100.0 and results["P_ci"][arm] == (100.0, 100.0)
    got = {(d["from"], d["to"]): (d["dP"], d["dP_ci"]) for d in results["ablations"]}
    assert got == {**{(SEDT_NC, arm): (0.0, (0.0, 0.0)) for arm in ABLATION_ARMS.values()},
                   **{(CONTROL, arm): (100.0, (100.0, 100.0)) for arm in ABLATION_ARMS.values()}}


def test_cli_selects_the_ablation_arms(tiny_chat_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--problems", "1", "--runs", "2", "--max-new-tokens", "4", "--model", str(tiny_chat_model_dir),
            "--mesh-shape", "none", "--set", "ablations=uniform,random_rtg", "--out", str(out)]
    assert main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["arms"][-2:] == [ABLATION_ARMS["uniform"], ABLATION_ARMS["random_rtg"]]
    assert res["sedt_config"]["ablations"] == ["uniform", "random_rtg"]
    assert [(d["from"], d["to"]) for d in res["ablations"]] == [
        (SEDT_NC, ABLATION_ARMS["uniform"]), (CONTROL, ABLATION_ARMS["uniform"]),
        (SEDT_NC, ABLATION_ARMS["random_rtg"]), (CONTROL, ABLATION_ARMS["random_rtg"])]
    assert "SeDT's ablations" in (out / "report.md").read_text()
    assert main(argv[:-4] + ["--set", "ablations=semantic", "--out", str(out)]) == 2
    assert "unknown 'semantic'" in capsys.readouterr().err
