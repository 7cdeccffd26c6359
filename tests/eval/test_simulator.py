"""The LiC simulator: planning, per-turn judging and scoring, lockstep batching, transcripts.

Model-backed tests use the session's tiny random Llama (2 layers, hidden 32) carrying the embedded
model's tokenizer and chat template (``tiny_chat_model_dir`` in conftest), loaded through
``load_model``.
"""

from __future__ import annotations

import dataclasses

import json

import numpy as np
import pytest

from jaxrl_mt.conversations import ConversationRun, TurnRecord
from jaxrl_mt.data import load_source, synthetic_tasks
from jaxrl_mt.eval.simulator import (
    LIC_SCENARIOS,
    EvalError,
    Judge,
    LengthSortedSampler,
    TranscriptStore,
    TurnScorer,
    canonical_scenarios,
    first_answer_turn,
    check_strategy,
    plan_runs,
    run_score,
    simulate,
)
from jaxrl_mt.sampling import SamplingConfig
from jaxrl_mt.strategies import STRATEGIES
from tests.sampler_spy import RecordingSampler, recording_sampler


SYSTEM = "Solve it."  # a short system prompt keeps every test prompt under 256 tokens


def counting_sampler(model, max_batch: int | None = 4) -> RecordingSampler:
    """Chunks of 4 rows and one prompt bucket (256): a test run compiles one program."""
    return recording_sampler(model, max_batch=max_batch, min_prompt_bucket=256)


# --------------------------------------------------------------------------- pure parts


def test_canonical_scenarios_and_bad_names():
    assert canonical_scenarios(["FULL", "mt_add", "sharded", "aiwr"]) == ("full", "sharded", "aiwr")
    with pytest.raises(EvalError, match=r"unknown scenario kind 'shardd'"):
        canonical_scenarios(["full", "shardd"])
    with pytest.raises(EvalError, match=r"'underspecified' is not a LiC evaluation scenario"):
        canonical_scenarios(["underspecified"])


def test_plan_runs_ids_turns_and_order():
    tasks = synthetic_tasks(2, steps=2)  # target + 3 conditions
    runs, skipped = plan_runs(tasks, ["full", "sharded", "recap"], 3, seed=0)
    assert skipped == []
    assert len(runs) == 2 * 3 * 3
    assert runs[0].conv_id == "synthetic/0/0|full|0" and runs[5].conv_id == f"{tasks[1].task_id}|full|2"
    assert [r.meta["kind"] for r in runs] == ["full"] * 6 + ["sharded"] * 6 + ["recap"] * 6
    assert len({r.conv_id for r in runs}) == len(runs)
    n_turns = {r.meta["kind"]: len(r.user_turns) for r in runs}
    assert n_turns == {"full": 1, "sharded": 4, "recap": 5}
    assert runs[6].user_turns[0] == tasks[0].target and runs[6].user_turns[1:] == list(tasks[0].conditions)
    with pytest.raises(EvalError, match="field 'runs'"):
        plan_runs(tasks, ["full"], 0)


def test_plan_runs_skips_tasks_without_corruptible_shards():
    t = synthetic_tasks(1)[0].replace(task_id="nonum", conditions=("She has some apples.",))
    runs, skipped = plan_runs([t], ["sharded", "mt_refine"], 1)
    assert [r.meta["kind"] for r in runs] == ["sharded"]
    assert skipped[0]["task_id"] == "nonum" and skipped[0]["kind"] == "mt_refine"
    assert "no condition shard holds a number" in skipped[0]["reason"]


def _info(*pairs):
    return [{"answer_attempt": a, "correct": c} for a, c in pairs]


def test_run_score_protocols_by_hand():
    turns = _info((False, 0.0), (True, 0.0), (False, 1.0), (True, 1.0), (False, 0.0))
    assert run_score(turns, "lic") == (1.0, 4)  # the last answer attempt is turn 4, correct
    assert run_score(turns, "final_turn") == (0.0, 5)  # only the last turn counts
    turns = _info((True, 1.0), (True, 0.0), (False, 1.0))
    assert run_score(turns, "lic") == (0.0, 2)  # the last attempt is wrong
    assert run_score(turns, "final_turn") == (1.0, 3)  # verifier score of the last turn
    assert run_score(_info((False, 1.0)), "lic") == (0.0, None)  # no attempt scores 0
    assert first_answer_turn(_info((False, 0.0), (True, 0.0), (True, 1.0))) == 2
    assert first_answer_turn(_info((False, 0.0))) is None
    with pytest.raises(EvalError, match="unknown protocol 'best'"):
        run_score(turns, "best")


def _run_with_replies(replies, kind="sharded", gold="75"):
    """A finished-looking run whose assistant turns are `replies` (as if the sampler wrote them)."""
    r = ConversationRun(conv_id=f"t|{kind}|0", system=None, user_turns=[f"u{i}" for i in range(len(replies))],
                        meta={"task_id": "t", "kind": kind, "run": 0, "answer": gold, "domain": "math",
                              "question": "q", "n_planned": len(replies)})
    return r


def _step(scorer, run, reply):
    run.turns.append(TurnRecord(index=len(run.turns), user=run.user_turns[len(run.turns)], assistant=reply,
                                tokens=[1, 2], logprobs=[-0.1, -0.2], finish_reason="stop", prompt_tokens=10))
    scorer([run])


def test_turn_scorer_lic_stops_at_first_correct_answer():
    replies = ["Could you tell me how many stickers Liam starts with?", "The answer is 70.",
               "So we get 25 * 3 = 75. The answer is 75.", "unused"]
    run = _run_with_replies(replies)
    out = []
    scorer = TurnScorer([run], Judge(), protocol="lic", verifier_mode="strict", sink=out.extend)
    for reply in replies[:3]:
        assert not run.done
        _step(scorer, run, reply)
    assert run.done and run.stop_reason == "correct_answer"
    info = [t.info for t in run.turns]
    assert [i["label"] for i in info] == ["clarification", "answer_attempt", "answer_attempt"]
    assert [i["extracted"] for i in info] == [None, "70", "75"]
    assert [i["correct"] for i in info] == [0.0, 0.0, 1.0]
    assert len(out) == 1 and out[0]["score"] == 1.0 and out[0]["scored_turn"] == 3
    assert out[0]["first_answer_turn"] == 2 and out[0]["n_turns"] == 3 and out[0]["n_planned_turns"] == 4


def test_turn_scorer_final_turn_runs_all_turns():
    replies = ["The answer is 75.", "Let me think about the days.", "The answer is 80."]
    run = _run_with_replies(replies)
    out = []
    scorer = TurnScorer([run], Judge(), protocol="final_turn", verifier_mode="strict", sink=out.extend)
    for reply in replies:
        _step(scorer, run, reply)
    assert run.done and run.stop_reason == "no_more_turns"
    assert out[0]["score"] == 0.0 and out[0]["scored_turn"] == 3 and out[0]["first_answer_turn"] == 1
    assert [t["correct"] for t in out[0]["turns"]] == [1.0, 0.0, 0.0]


def test_transcript_store_roundtrip_truncated_tail_and_bad_line(tmp_path):
    store = TranscriptStore(tmp_path / "t.jsonl")
    assert store.load() == {}
    recs = [{"conv_id": f"a|full|{i}", "task_id": "a", "kind": "full", "run": i, "score": 1.0, "turns": []}
            for i in range(3)]
    store.append(recs[:2])
    store.append(recs[2:])
    assert list(store.load()) == ["a|full|0", "a|full|1", "a|full|2"]
    with open(store.path, "a") as f:
        f.write('{"conv_id": "a|full|3", "task')  # an interrupted write
    assert list(store.load()) == ["a|full|0", "a|full|1", "a|full|2"]
    assert store.path.read_text().count("\n") == 3  # the cut line was removed
    with open(store.path, "a") as f:  # cut right after a nested "}": ends in "}" yet is no record
        f.write('{"conv_id": "a|full|3", "task_id": "a", "turns": [{"k": 1}')
    assert list(store.load()) == ["a|full|0", "a|full|1", "a|full|2"]  # lost: conversation 3, run again
    store.append([{**recs[0], "conv_id": "a|full|3"}])
    assert list(store.load()) == ["a|full|0", "a|full|1", "a|full|2", "a|full|3"]
    store.path.write_text('{"conv_id": "x"}\n' + store.path.read_text())
    with pytest.raises(EvalError, match=r"t\.jsonl:1: field 'task_id': missing"):
        store.load()
    store.path.write_text('not json\n{"conv_id": "x"}\n')
    with pytest.raises(EvalError, match=r"t\.jsonl:1: invalid JSON"):
        store.load()


def test_strategy_registry():
    from jaxrl_mt.conversations import run_conversations

    assert check_strategy("plain") is run_conversations is STRATEGIES.get("plain")
    assert {"plain", "sedt"} <= set(STRATEGIES.names())  # sedt: a built-in, loaded on first use
    with pytest.raises(EvalError, match=r"field 'strategy': unknown strategy 'nope'; known: .*plain, .*sedt"):
        check_strategy("nope")
    with pytest.raises(KeyError, match=r"unknown strategy 'nope'; known: .*plain"):
        STRATEGIES.get("nope")


# --------------------------------------------------------------------------- with a (tiny) model


def test_simulate_lockstep_one_sampler_call_per_turn(tiny_model):
    tasks = synthetic_tasks(1, steps=2)
    runs, _ = plan_runs(tasks, LIC_SCENARIOS, 4, seed=0, system=SYSTEM)
    sampler = counting_sampler(tiny_model)
    got = []
    recs = simulate(sampler, runs, SamplingConfig(max_new_tokens=4, temperature=1.0), judge=Judge(),
                    protocol="final_turn", verifier_mode="strict", seed=0, sink=got.extend)
    longest = max(len(r.user_turns) for r in runs)  # atr / aiwr: target + 3 shown + 3 fixes = 7
    assert longest == 7
    # One generate_ids call per turn: the first holds every conversation, then the ones still
    # running (the sampler splits a call into chunks of max_batch rows internally).
    want = [sum(len(r.user_turns) > k for r in runs) for k in range(longest)]
    assert sampler.sizes == want == [32, 24, 24, 24, 12, 8, 8]
    # every turn's prompts in one bucket: one admission program (4 rows x 256) and one segment program
    assert sampler.compiled_shapes == {("admit", 4, 4, 256), ("segment", 4, 272, 16)}
    assert [r["conv_id"] for r in recs] == [r.conv_id for r in runs]
    assert sorted(r["conv_id"] for r in got) == sorted(r.conv_id for r in runs)  # each flushed once
    for rec, run in zip(recs, runs):
        assert rec["n_turns"] == len(run.user_turns) == rec["n_planned_turns"]
        assert [t["user"] for t in rec["turns"]] == run.user_turns
        for t in rec["turns"]:
            assert set(t) >= {"user", "assistant", "label", "answer_attempt", "extracted", "correct", "new_tokens"}
            assert 1 <= t["new_tokens"] <= 4
        assert rec["score"] == rec["turns"][-1]["correct"]
    json.dumps(recs)  # JSON-ready


def test_length_sorted_sampler_chunks_by_memory_and_keeps_row_order(tiny_model):
    inner = counting_sampler(tiny_model, max_batch=4)
    inner.engine = dataclasses.replace(inner.engine, min_prompt_bucket=32)
    rng = np.random.default_rng(0)
    lengths = [40, 3, 70, 5, 33, 2, 64, 10, 1, 90, 4, 6, 7, 8]
    prompts = [rng.integers(10, 1000, n).tolist() for n in lengths]
    budgets = [4, 3, 4, 2, 4, 4, 1, 4, 4, 4, 4, 4, 4, 4]
    greedy = SamplingConfig(max_new_tokens=4, temperature=0.0)
    # Cap 2 x 64 x (64 + 16): 4 rows fit at prompt bucket 32 (4 x 32 x 48), 2 at 64, 1 at 128.
    wrapped = LengthSortedSampler(inner, max_cells=2 * 64 * 80)
    got = wrapped.generate_ids(prompts, greedy, seed=0, max_new_tokens=budgets)
    # Sorted: [1 2 3 4][5 6 7 8] (two full chunks, one call) [10 33] [40 64] [70] [90].
    assert inner.sizes == [8, 2, 2, 1, 1] and got.stats["chunks"] == 5
    assert got.lengths.tolist() == budgets
    # Each row as generated in a different grouping of the same shapes (greedy): same tokens.
    for group in ([9], [2], [6, 0], [4, 7], [13, 12, 11, 10], [3, 5, 1, 8]):
        ref = inner.generate_ids([prompts[i] for i in group], greedy, max_new_tokens=[budgets[i] for i in group])
        assert [got.tokens[i] for i in group] == ref.tokens and [got.texts[i] for i in group] == ref.texts
    assert wrapped.tokenizer is inner.tokenizer and wrapped.max_batch == 4


def test_simulate_custom_strategy_and_context_guard(tiny_model, scratch_strategies):
    calls = []

    def spy(sampler, runs, sampling, **kw):
        from jaxrl_mt.conversations import run_conversations

        calls.append(len(runs))
        return run_conversations(sampler, runs, sampling, **kw)

    scratch_strategies.add("spy", spy, replace=True)
    tasks = synthetic_tasks(1, steps=2)
    runs, _ = plan_runs(tasks, ["sharded"], 2)
    sampler = counting_sampler(tiny_model, max_batch=None)
    # room for 3 turns
    sampler.engine = dataclasses.replace(sampler.engine, cfg=sampler.cfg.replace(max_position_embeddings=120))
    recs = simulate(sampler, runs, SamplingConfig(max_new_tokens=8, temperature=1.0), judge=Judge(),
                    protocol="final_turn", verifier_mode="strict", strategy="spy")
    assert calls == [2]
    assert all(r["stop_reason"] == "context_full" and 1 <= r["n_turns"] < 4 for r in recs)
    assert all(t["prompt_tokens"] + 8 <= 120 for r in recs for t in r["turns"])


def test_lic_shipped_sample_plans_every_scenario():
    tasks = load_source("lic:@:math")
    runs, skipped = plan_runs(tasks, LIC_SCENARIOS, 1)
    assert skipped == []
    assert {r.meta["kind"] for r in runs} == set(LIC_SCENARIOS)
    assert np.all([r.meta["answer"] for r in runs])


def test_a_math_checker_that_raises_marks_its_turn_and_the_run_goes_on(monkeypatch, caplog):
    """Fault injection: the rule judge and the verifier raise on one reply (as the recursive
    scanners did on ``"[[" * 600``); that turn gets a non-answer / ``checker_error`` verdict."""
    import jaxrl_mt.eval.judging as sim

    real_rule, real_verify = sim.classify_rule_based, sim.verify

    def rule(text, *a, **k):
        if "BOOM-JUDGE" in text:
            raise RecursionError("maximum recursion depth exceeded")
        return real_rule(text, *a, **k)

    def verify(text, *a, **k):
        if "BOOM" in text:
            raise RecursionError("maximum recursion depth exceeded")
        return real_verify(text, *a, **k)

    monkeypatch.setattr(sim, "classify_rule_based", rule)
    monkeypatch.setattr(sim, "verify", verify)
    replies = ["BOOM-JUDGE. The answer is 70.", "BOOM. The answer is 75.", "So 25 * 3 = 75. The answer is 75."]
    run = _run_with_replies(replies)
    out = []
    scorer = TurnScorer([run], Judge(), protocol="lic", verifier_mode="strict", sink=out.extend)
    for reply in replies:
        _step(scorer, run, reply)
    info = [t.info for t in run.turns]
    assert [i.get("status") for i in info] == ["checker_error", "checker_error", None]
    assert [i["answer_attempt"] for i in info] == [False, False, True]
    assert info[0]["label"] == info[1]["label"] == "discussion"
    assert info[1]["reason"] == "the checker raised RecursionError: maximum recursion depth exceeded"
    assert run.stop_reason == "correct_answer" and out[0]["score"] == 1.0 and out[0]["scored_turn"] == 3
    assert sum("raised on a" in r.getMessage() for r in caplog.records) == 3
