"""The rule-based judge on the embedded model's own replies (tests/rewards/judge_real/).

The replies of SmolLM2-135M-Instruct were collected with ``python -m jaxrl_mt.eval.collect_replies``
(FULL, SHARDED and underspecified turns; synthetic, GSM8K-test, LiC-math and RLSTA MT-Add
problems; T = 0 and T = 1) and labelled by the LiC definitions in ``GUIDELINES.md``. Their roles
since round 4 (docs/judge.md):

- tuning data (``TUNING_FILES``, 1105 replies): ``tune.jsonl``, ``heldout.jsonl`` (scored once as a
  held-out set in round 1), ``heldout2.jsonl`` (scored once in round 2: answer-attempt
  P 0.870 / R 0.823) and ``heldout3.jsonl`` (320 multi-turn replies at T = 0.7 on other
  templates, scored once in round 3: P 0.807 / R 0.791; a second blind annotation of it agrees
  with the first at P 0.989 / R 0.969). The floors below keep the level reached on all of them;
- the blind held-out set ``heldout4.jsonl`` (``HELDOUT4_FILE``): replies of the base model on the
  experiment's held-out problems, collected after the round-4 freeze and scored once against the
  0.95 target (a strict xfail while it is not met).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from tests.rewards.judge_real import (
    HELDOUT2_FILE,
    HELDOUT3_FILE,
    HELDOUT4_FILE,
    ROUND3_TUNING_FILES,
    TUNE_V2_FILES,
    TUNING_FILES,
)
from jaxrl_mt.rewards.judge import (
    NON_ANSWER_TYPES,
    RESPONSE_TYPES,
    answer_attempt_by,
    answer_attempt_by_fold,
    classify_rule_based,
    evaluate_labelled,
    format_table,
    macro_f1,
    mean_over_folds,
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
ALL_TUNING = [rec for name in TUNING_FILES for rec in _load(ROOT / name)]
ROUND3_TUNING = [rec for name in ROUND3_TUNING_FILES for rec in _load(ROOT / name)]
HELDOUT3_PATH = ROOT / HELDOUT3_FILE
HELDOUT4_PATH = ROOT / HELDOUT4_FILE
# Measured once after the round-2 freeze: P 0.870 (167/192), R 0.823 (167/203); round 3: 0.886 / 0.882.
AA_HELDOUT2_FLOOR = (0.865, 0.82)


def test_tuning_set_is_real_labelled_and_large_enough():
    assert [Path(n).name for n in TUNE_V2_FILES] == ["tune.jsonl", "heldout.jsonl"]
    assert len(TUNE_V2) >= 300
    for rec in TUNE_V2:
        assert rec["label"] in RESPONSE_TYPES, rec["id"]
        assert rec["kind"] in ("full", "sharded", "underspecified") and rec["temperature"] in (0.0, 1.0)
    both = Counter((r["kind"], r["temperature"]) for r in TUNE_V2)
    assert all(both[k, t] > 0 for k in ("full", "sharded", "underspecified") for t in (0.0, 1.0)), both
    assert len({r["id"] for r in TUNE_V2}) == len(TUNE_V2), "duplicate ids"


def test_heldout2_stays_disjoint_from_the_older_sets():
    """heldout2 was collected on other problems than tune_v2 (by task and normalised text)."""
    assert len(HELDOUT2) >= 300, HELDOUT2_FILE
    tuned_tasks = {r["task_id"] for r in TUNE_V2}
    tuned_texts = {_norm(r["text"]) for r in TUNE_V2 + WRITTEN_TUNE}
    for rec in HELDOUT2:
        assert rec.get("task_id") not in tuned_tasks, rec.get("id")
        assert _norm(rec["text"]) not in tuned_texts, rec["text"][:80]


def test_heldout3_never_overlapped_the_round3_tuning_data():
    """By task (the split unit) and by normalised text, against the three files round 3 tuned on."""
    heldout3 = _load(HELDOUT3_PATH)
    assert len(heldout3) >= 300, HELDOUT3_FILE
    tuned_tasks = {r["task_id"] for r in ROUND3_TUNING}
    tuned_texts = {_norm(r["text"]) for r in ROUND3_TUNING + WRITTEN_TUNE}
    for rec in heldout3:
        assert rec.get("task_id") not in tuned_tasks, rec.get("id")
        assert _norm(rec["text"]) not in tuned_texts, rec["text"][:80]


def test_hand_written_held_out_texts_never_repeat_tuning_texts():
    tuned = {_norm(r["text"]) for r in TUNE_V2 + WRITTEN_TUNE}
    for rec in WRITTEN_HELDOUT:
        assert _norm(rec["text"]) not in tuned, rec["text"][:80]


# Round 4, on all 1105 tuning replies: answer-attempt P 0.893 / R 0.896 (T=0: 0.945 / 0.945;
# T=0.7: 0.832 / 0.853; T=1: 0.700 / 0.636); round 3 on its 785: 0.922 / 0.910 (0.925 / 0.918 with
# the round-4 rules). Floors keep that level.
AA_TUNING_FLOOR = (0.89, 0.89)
AA_T0_FLOOR = (0.94, 0.94)
TYPE_F1_FLOOR = {"discussion": 0.82, "refusal": 0.80, "missing": 0.55}
AA_CV_FLOOR = (0.89, 0.89)  # with every rule on: mean over folds 0.898 / 0.896


def _scores(recs: list[dict], name: str):
    gold, pred = [r["label"] for r in recs], _predict(recs)
    scores = evaluate_labelled(gold, pred)
    print(f"\n{name}:\n" + format_table(scores) + f"\nmacro-F1 {macro_f1(scores):.3f}")
    for key, aa in answer_attempt_by(recs, pred, "source").items():
        print(f"  answer_attempt source={key}: P {aa.precision:.3f} R {aa.recall:.3f}")
    return {s.label: s for s in scores}, pred


def test_answer_attempt_on_the_tuning_set_keeps_its_level():
    by_type, pred = _scores(ALL_TUNING, "all tuning data (1105 real replies)")
    aa = by_type["answer_attempt"]
    assert aa.precision >= AA_TUNING_FLOOR[0] and aa.recall >= AA_TUNING_FLOOR[1], aa
    t0 = answer_attempt_by(ALL_TUNING, pred, "temperature")["0.0"]
    assert t0.precision >= AA_T0_FLOOR[0] and t0.recall >= AA_T0_FLOOR[1], t0
    for label, floor in TYPE_F1_FLOOR.items():
        assert by_type[label].f1 >= floor, by_type[label]
    p, r = mean_over_folds(answer_attempt_by_fold(ALL_TUNING, pred))
    assert p >= AA_CV_FLOOR[0] and r >= AA_CV_FLOOR[1], (p, r)


def test_answer_attempt_on_heldout2_keeps_its_measured_level():
    """A regression floor at the level measured once on heldout2 after the round-2 freeze.

    heldout2 is no longer held out: round 3 tuned on it (folds by problem), so this is a
    regression floor, not a held-out estimate."""
    by_type, _ = _scores(HELDOUT2, HELDOUT2_FILE)
    aa = by_type["answer_attempt"]
    assert aa.precision >= AA_HELDOUT2_FLOOR[0] and aa.recall >= AA_HELDOUT2_FLOOR[1], aa


@pytest.mark.skipif(not HELDOUT4_PATH.exists(), reason=f"{HELDOUT4_FILE} is not collected yet")
def test_heldout4_never_overlaps_the_tuning_data():
    """By task (the split unit) and by normalised text, against all four tuning files."""
    heldout4 = _load(HELDOUT4_PATH)
    assert len(heldout4) >= 300, HELDOUT4_FILE
    tuned_tasks = {r["task_id"] for r in ALL_TUNING}
    tuned_texts = {_norm(r["text"]) for r in ALL_TUNING + WRITTEN_TUNE}
    for rec in heldout4:
        assert rec["task_id"] not in tuned_tasks, rec["id"]
        assert _norm(rec["text"]) not in tuned_texts, rec["text"][:80]


@pytest.mark.skipif(not HELDOUT4_PATH.exists(), reason=f"{HELDOUT4_FILE} is not collected yet: "
                    "a fresh blind-labelled set judges round 4")
@pytest.mark.xfail(strict=True, reason="issue 14's target is not reached: heldout4 scored once with round 4, "
                   "P 0.746 / R 0.669")
def test_answer_attempt_precision_and_recall_reach_the_target_on_held_out_real_replies():
    """Issue 14's target, on the latest blind-labelled held-out set (scored once, after the freeze)."""
    by_type, _ = _scores(_load(HELDOUT4_PATH), HELDOUT4_FILE)
    aa = by_type["answer_attempt"]
    assert aa.precision >= AA_TARGET and aa.recall >= AA_TARGET, aa


def test_declarative_guesses_on_underspecified_prompts_are_rarely_rewarded_as_non_answers():
    """ICPO's reward: a confident guess on an underspecified prompt must not count as a non-answer.

    On the 44 labelled guesses of tune_v2: 14 called non-answers by the judge of session 3, 7 by
    that of session 4, 4 by session 5, 5 by round 3; on all 86 guesses of the tuning files, 12
    by rounds 3 and 4 (7 of the 42 of heldout2; heldout3 has no underspecified prompt).
    """
    guesses = [r for r in ALL_TUNING if r["kind"] == "underspecified" and r["label"] == "answer_attempt"]
    assert len(guesses) >= 80
    called_non_answer = sum(p in NON_ANSWER_TYPES for p in _predict(guesses))
    assert called_non_answer <= 12, called_non_answer


@pytest.mark.parametrize("name", [Path(n).name for n in TUNING_FILES])
def test_records_keep_their_provenance(name):
    for rec in _load(ROOT / "tests/rewards/judge_real" / name):
        assert set(rec) >= {"id", "text", "label", "split", "source", "kind", "turn", "temperature", "task_id",
                            "question", "user"}
        assert rec["id"].startswith(rec["task_id"] + "|" + rec["kind"])


def _assert_second_annotation_agrees(first_path: Path, second_name: str) -> None:
    """The second annotation (``{"id", "label", "note"}`` in the same order) against the first:
    answer-attempt P and R >= the target, and every differing label marked ambiguous by one side."""
    first = _load(first_path)
    second = _load(HERE / "judge_real" / second_name)
    assert [r["id"] for r in first] == [r["id"] for r in second]
    assert all(r["label"] in RESPONSE_TYPES for r in second)
    scores = {s.label: s for s in evaluate_labelled([r["label"] for r in first], [r["label"] for r in second])}
    aa = scores["answer_attempt"]
    assert aa.precision >= AA_TARGET and aa.recall >= AA_TARGET, aa
    for a, b in zip(first, second):
        if a["label"] != b["label"]:
            assert a.get("label_note", "").startswith("ambiguous") or b["note"].startswith("ambiguous"), a["id"]


def test_a_second_blind_annotator_agrees_with_the_heldout3_labels_above_the_target():
    """The target is a level a reader of the guidelines reaches: a second annotator session (the
    same assistant model as the first, so an upper bound on independent readers' agreement), who
    saw only GUIDELINES.md and the unlabelled replies (README_heldout3.md), against the first:
    answer-attempt P 0.989 / R 0.969 (kappa 0.948), 309/320 identical labels; every
    disagreement on an item one of them marked ambiguous."""
    _assert_second_annotation_agrees(HELDOUT3_PATH, "heldout3_annotator2.jsonl")


def test_a_second_blind_annotator_agrees_with_the_heldout4_labels():
    """heldout4 was labelled twice, by two separate annotator sessions (README_heldout4.md): they
    agree on answer attempt or not for all 320 replies and on 316 labels; the 4 others are marked
    ambiguous by one of them."""
    _assert_second_annotation_agrees(HELDOUT4_PATH, "heldout4_annotator2.jsonl")
