"""The rule-based judge on the embedded model's own replies (tests/rewards/judge_real/).

The replies of SmolLM2-135M-Instruct were collected with ``python -m jaxrl_mt.eval.collect_replies``
(FULL, SHARDED and underspecified turns; synthetic, GSM8K-test and LiC-math problems; T = 0 and
T = 1) and labelled by the LiC definitions in ``GUIDELINES.md``. Their roles:

- the tuning set "tune_v2" (``TUNE_V2_FILES``): ``tune.jsonl`` and ``heldout.jsonl``. The latter was
  scored once as a held-out set (answer-attempt P 0.733 / R 0.804) and is spent: the rules were
  then rewritten reading every error of both files. The floors below keep the level reached on
  them, so a regression fails;
- the held-out set ``heldout2.jsonl`` (``HELDOUT2_FILE``), labelled blind by another session and
  never read while writing rules; scored once after the rules were frozen: answer-attempt
  P 0.870 / R 0.823 (the rules before this round: 0.764 / 0.798). The floor below keeps that
  level; the issue's target (0.95 / 0.95) is a strict xfail. heldout2 is now spent as well: a
  further round of rules may tune on it, and needs a fresh blind-labelled set to be judged.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from jaxrl_mt.rewards.judge import (
    HELDOUT2_FILE,
    NON_ANSWER_TYPES,
    RESPONSE_TYPES,
    TUNE_V2_FILES,
    answer_attempt_by,
    classify_rule_based,
    evaluate_labelled,
    format_table,
    macro_f1,
)

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
AA_TARGET = 0.95  # answer-attempt precision and recall on the held-out replies (issue 14)


def _load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _norm(text: str) -> str:
    return re.sub(r"\W+", " ", text.lower()).strip()


def _predict(recs: list[dict]) -> list[str]:
    return [classify_rule_based(r["text"], "math", question=r.get("question"), user=r.get("user")) for r in recs]


TUNE_V2 = [rec for name in TUNE_V2_FILES for rec in _load(ROOT / name)]
HELDOUT2_PATH = ROOT / HELDOUT2_FILE
WRITTEN_TUNE = _load(HERE / "judge_labelled.jsonl")
WRITTEN_HELDOUT = _load(HERE / "judge_heldout.jsonl")
HELDOUT2 = _load(HELDOUT2_PATH)
AA_HELDOUT2_FLOOR = (0.865, 0.82)  # measured once after the freeze: P 0.870 (167/192), R 0.823 (167/203)


def test_tuning_set_is_real_labelled_and_large_enough():
    assert [Path(n).name for n in TUNE_V2_FILES] == ["tune.jsonl", "heldout.jsonl"]
    assert len(TUNE_V2) >= 300
    for rec in TUNE_V2:
        assert rec["label"] in RESPONSE_TYPES, rec["id"]
        assert rec["kind"] in ("full", "sharded", "underspecified") and rec["temperature"] in (0.0, 1.0)
    both = Counter((r["kind"], r["temperature"]) for r in TUNE_V2)
    assert all(both[k, t] > 0 for k in ("full", "sharded", "underspecified") for t in (0.0, 1.0)), both
    assert len({r["id"] for r in TUNE_V2}) == len(TUNE_V2), "duplicate ids"


def test_held_out_set_never_overlaps_the_tuning_data():
    """By task (the split unit) and by normalised text, against every set the rules were tuned on."""
    heldout2 = HELDOUT2
    assert len(heldout2) >= 300, HELDOUT2_FILE
    tuned_tasks = {r["task_id"] for r in TUNE_V2}
    tuned_texts = {_norm(r["text"]) for r in TUNE_V2 + WRITTEN_TUNE}
    for rec in heldout2:
        assert rec.get("task_id") not in tuned_tasks, rec.get("id")
        assert _norm(rec["text"]) not in tuned_texts, rec["text"][:80]


def test_hand_written_held_out_texts_never_repeat_tuning_texts():
    tuned = {_norm(r["text"]) for r in TUNE_V2 + WRITTEN_TUNE}
    for rec in WRITTEN_HELDOUT:
        assert _norm(rec["text"]) not in tuned, rec["text"][:80]


# Measured on tune_v2 (350 replies) after this session's rules: answer-attempt P 0.988 / R 0.942
# (T=0: 1.000 / 0.981; T=1: 0.846 / 0.611); before them 0.811 / 0.867. Floors keep that level.
AA_TUNE_V2_FLOOR = (0.98, 0.93)
AA_T0_FLOOR = (0.99, 0.97)
TYPE_F1_FLOOR = {"discussion": 0.93, "refusal": 0.9, "hedging": 0.99, "missing": 0.5}


def _scores(recs: list[dict], name: str):
    gold, pred = [r["label"] for r in recs], _predict(recs)
    scores = evaluate_labelled(gold, pred)
    print(f"\n{name}:\n" + format_table(scores) + f"\nmacro-F1 {macro_f1(scores):.3f}")
    for key, aa in answer_attempt_by(recs, pred, "source").items():
        print(f"  answer_attempt source={key}: P {aa.precision:.3f} R {aa.recall:.3f}")
    return {s.label: s for s in scores}, pred


def test_answer_attempt_on_the_tuning_set_keeps_its_level():
    by_type, pred = _scores(TUNE_V2, "tune_v2 (tuning set, 350 real replies)")
    aa = by_type["answer_attempt"]
    assert aa.precision >= AA_TUNE_V2_FLOOR[0] and aa.recall >= AA_TUNE_V2_FLOOR[1], aa
    t0 = answer_attempt_by(TUNE_V2, pred, "temperature")["0.0"]
    assert t0.precision >= AA_T0_FLOOR[0] and t0.recall >= AA_T0_FLOOR[1], t0
    for label, floor in TYPE_F1_FLOOR.items():
        assert by_type[label].f1 >= floor, by_type[label]


def test_answer_attempt_on_held_out_real_replies_keeps_its_measured_level():
    """The level measured once on the blind-labelled held-out set after the freeze (a regression fails)."""
    by_type, _ = _scores(HELDOUT2, HELDOUT2_FILE)
    aa = by_type["answer_attempt"]
    assert aa.precision >= AA_HELDOUT2_FLOOR[0] and aa.recall >= AA_HELDOUT2_FLOOR[1], aa


@pytest.mark.xfail(strict=True, reason="issue 14's target is not reached: held-out answer-attempt P 0.870 / R 0.823")
def test_answer_attempt_precision_and_recall_reach_the_target_on_held_out_real_replies():
    """Issue 14's target, on the blind-labelled held-out set (scored once, after the freeze)."""
    by_type, _ = _scores(HELDOUT2, HELDOUT2_FILE)
    aa = by_type["answer_attempt"]
    assert aa.precision >= AA_TARGET and aa.recall >= AA_TARGET, aa


def test_declarative_guesses_on_underspecified_prompts_are_rarely_rewarded_as_non_answers():
    """ICPO's reward: a confident guess on an underspecified prompt must not count as a non-answer.

    On the 44 labelled guesses of tune_v2: 14 called non-answers by the judge of session 3, 7 by
    that of session 4, 4 now (two T=1 replies; "He runs a 30-meter circuit every week." for the
    weekly total, which states no total; a value followed by the cut-off "We can calculate this").
    """
    guesses = [r for r in TUNE_V2 if r["kind"] == "underspecified" and r["label"] == "answer_attempt"]
    assert len(guesses) >= 40
    called_non_answer = sum(p in NON_ANSWER_TYPES for p in _predict(guesses))
    assert called_non_answer <= 4, called_non_answer


@pytest.mark.parametrize("name", [Path(n).name for n in TUNE_V2_FILES])
def test_records_keep_their_provenance(name):
    for rec in _load(ROOT / "tests/rewards/judge_real" / name):
        assert set(rec) >= {"id", "text", "label", "split", "source", "kind", "turn", "temperature", "task_id",
                            "question", "user"}
        assert rec["id"].startswith(rec["task_id"] + "|" + rec["kind"])
