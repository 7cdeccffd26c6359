"""The rule-based judge on the embedded model's own replies (tests/rewards/judge_real/).

``tune.jsonl`` and ``heldout.jsonl`` hold replies of SmolLM2-135M-Instruct collected with
``python -m jaxrl_mt.eval.collect_replies`` (FULL, SHARDED and underspecified turns; synthetic,
GSM8K-test and LiC-math problems; T = 0 and T = 1) and labelled by the LiC definitions in
``GUIDELINES.md``. The split is by task (a hash of the task id), fixed before any label or rule;
the rules were written from ``tune.jsonl`` (and the hand-written ``judge_labelled.jsonl``) only.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from jaxrl_mt.rewards.judge import (
    NON_ANSWER_TYPES,
    RESPONSE_TYPES,
    classify_rule_based,
    evaluate_labelled,
    format_table,
    macro_f1,
)

HERE = Path(__file__).parent
REAL = HERE / "judge_real"
AA_FLOOR = 0.95  # answer-attempt precision and recall on the held-out replies (issue 14)


def _load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _norm(text: str) -> str:
    return re.sub(r"\W+", " ", text.lower()).strip()


def _predict(recs: list[dict]) -> list[str]:
    return [classify_rule_based(r["text"], "math", question=r["question"], user=r["user"]) for r in recs]


TUNE, HELDOUT = _load(REAL / "tune.jsonl"), _load(REAL / "heldout.jsonl")
WRITTEN_TUNE = _load(HERE / "judge_labelled.jsonl")
WRITTEN_HELDOUT = _load(HERE / "judge_heldout.jsonl")


def test_sets_are_real_labelled_and_large_enough():
    assert len(TUNE) + len(HELDOUT) >= 300 and len(HELDOUT) >= 150
    for rec in TUNE + HELDOUT:
        assert rec["label"] in RESPONSE_TYPES, rec["id"]
        assert rec["kind"] in ("full", "sharded", "underspecified") and rec["temperature"] in (0.0, 1.0)
    both = Counter((r["kind"], r["temperature"]) for r in HELDOUT)
    assert all(both[k, t] > 0 for k in ("full", "sharded", "underspecified") for t in (0.0, 1.0)), both


def test_held_out_never_overlaps_the_tuning_data():
    """By task (the split unit) and by normalised text, against every set rules were tuned on."""
    assert {r["task_id"] for r in TUNE}.isdisjoint({r["task_id"] for r in HELDOUT})
    assert all(r["split"] == "tune" for r in TUNE) and all(r["split"] == "heldout" for r in HELDOUT)
    tuned = {_norm(r["text"]) for r in TUNE + WRITTEN_TUNE}
    for rec in HELDOUT + WRITTEN_HELDOUT:
        assert _norm(rec["text"]) not in tuned, rec["text"][:80]


# Measured once on the held-out part after the rules were frozen (session 4): answer-attempt
# precision 0.733, recall 0.804 (synthetic T=0: 0.98 / 0.96; GSM8K and LiC-math long replies cut
# off mid-reasoning, and T=1 word salad, are where it fails). The floors below keep that level;
# the target (0.95 / 0.95) is the strict xfail beneath, which fails loudly once met.
AA_MEASURED_FLOOR = (0.72, 0.79)


def _aa_scores():
    gold, pred = [r["label"] for r in HELDOUT], _predict(HELDOUT)
    scores = evaluate_labelled(gold, pred)
    print("\nheld-out real replies:\n" + format_table(scores) + f"\nmacro-F1 {macro_f1(scores):.3f}")
    return next(s for s in scores if s.label == "answer_attempt"), scores


def test_answer_attempt_on_held_out_real_replies_keeps_its_measured_level():
    aa, scores = _aa_scores()
    assert aa.precision >= AA_MEASURED_FLOOR[0] and aa.recall >= AA_MEASURED_FLOOR[1], format_table(scores)


@pytest.mark.xfail(strict=True, reason="issue 14 target not met yet: held-out answer-attempt P 0.733, R 0.804")
def test_answer_attempt_precision_and_recall_reach_the_target_on_held_out_real_replies():
    aa, scores = _aa_scores()
    assert aa.precision >= AA_FLOOR and aa.recall >= AA_FLOOR, format_table(scores)


def test_declarative_guesses_on_underspecified_prompts_are_rarely_rewarded_as_non_answers():
    """ICPO's reward: a confident guess on an underspecified prompt must not count as a non-answer.

    Measured: 7 of 44 labelled guesses called non-answers (the judge before this session: 14 of 44).
    """
    guesses = [r for r in TUNE + HELDOUT if r["kind"] == "underspecified" and r["label"] == "answer_attempt"]
    assert len(guesses) >= 20
    called_non_answer = sum(p in NON_ANSWER_TYPES for p in _predict(guesses))
    assert called_non_answer / len(guesses) <= 0.16, called_non_answer


@pytest.mark.parametrize("name", ["tune", "heldout"])
def test_records_keep_their_provenance(name):
    for rec in _load(REAL / f"{name}.jsonl"):
        assert set(rec) >= {"id", "text", "label", "split", "source", "kind", "turn", "temperature", "task_id",
                            "question", "user"}
        assert rec["id"].startswith(rec["task_id"] + "|" + rec["kind"])
