"""The verifier on real replies of the embedded model (SmolLM2-135M-Instruct).

Every input is a reply recorded in ``tests/rewards/judge_real/tune.jsonl`` (looked up by its id,
unchanged); the expected values were worked out by hand from the reply's text and the task's
question. The gold answers are written here by hand and checked against the data they come from
(the synthetic generator, the shipped GSM8K test sample).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jaxrl_mt.data import synthetic_tasks
from jaxrl_mt.data.loaders import load_source
from jaxrl_mt.rewards.verifier import extract_answer, extract_marked_answer, offers_several_candidates, verify

TUNE = Path(__file__).parent / "judge_real" / "tune.jsonl"

# id -> (gold, extracted, marked, several candidates, strict, lenient, why)
CASES = {
    # answer markers
    "synthetic/8/0|full|0|T0": ("30", "8", "8", False, 0.0, 0.0,
                                "'#### 8' then 'The answer is: 8': two markers that agree"),
    "synthetic/7/0|underspecified|0|T0": ("10", "20", "20", False, 0.0, 0.0,
                                          "'... = 20 coins.\\n#### 20\\nThe answer is: 20'"),
    "gsm8k/test_sample/12|sharded|0|T0": ("13", "12", "12", False, 0.0, 0.0,
                                          "'the answer is 12 months' mid-reply outranks the later '12 months'"),
    "synthetic/7/16|full|0|T1": ("53", "0", "0", False, 0.0, 0.0,
                                 "'373 - 373 = 0 coins left.\\n#### 0\\nJonas still has 0 coins.': zero is a value"),
    # the result of an equation, no marker: the last number
    "synthetic/7/2|sharded|0|T0": ("88", "900", None, False, 0.0, 0.0, "'Jonas has 1000 - 1 = 900 beads.'"),
    "synthetic/7/23|full|0|T0": ("13", "229", None, False, 0.0, 0.0,
                                 "'13 * 17 = 229.\\nSo, Ben has 229 stickers ...' (wrong arithmetic, read as is)"),
    "synthetic/7/8|sharded|1|T0": ("117", "39", None, False, 0.0, 0.0,
                                   "'39 - 1 = 39 marbles left over after the initial 39 marbles.'"),
    # several candidates: a range offered as the answer
    "synthetic/7/2|sharded|0|T1": ("88", "90", None, True, 0.0, 0.0,
                                   "'approximately 85-90 beads ... 85-90 of the 110 total pieces ...' (hedging)"),
    # cut-off replies
    "synthetic/7/0|full|0|T0": ("10", "15", "15", False, 0.0, 1.0,
                                "'25 - 10 = 15 coins remaining.\\n#### 15\\nThe' cut off after the marker; lenient, "
                                "as RLSTA's code, accepts 10 among the last three numbers (10, 15, 15)"),
    "synthetic/7/2|full|0|T0": ("88", "108", None, False, 0.0, 0.0,
                                "'... 48 - 224 = 48 * 2 = 108 beads left' cut off mid-sentence"),
    "gsm8k/test_sample/12|underspecified|0|T0": ("13", "8", None, False, 0.0, 0.0,
                                                 "'1 + 1 + 2 + 3 + 4 + 5 + 6 + 7 + 8' cut off in a sum"),
    # units and currency
    "gsm8k/test_sample/2|full|0|T0": ("70000", "150", None, False, 0.0, 0.0,
                                      "'$80,000 - $80,000 = $10,000.\\n\\nThe profit is 150%': a percent reads 150"),
    "gsm8k/test_sample/2|sharded|0|T0": ("70000", "10.5", "10.5", False, 0.0, 0.0,
                                         "'The answer is: 10.5% of the total profit.'"),
    "gsm8k/test_sample/11|sharded|0|T0": ("694", "12.5", None, False, 0.0, 0.0,
                                          "'The total cost of the meal was $12.50.'"),
    "gsm8k/test_sample/11|sharded|2|T0": ("694", "32", None, False, 0.0, 0.0,
                                          "'$68 + 2*3 = $154. ... 6*6 = $32.' ($ amounts, last one)"),
    "gsm8k/test_sample/11|underspecified|0|T0": ("694", "1800", "1800", False, 0.0, 0.0,
                                                 "'600 * 3 = 1800 pastries.\\n#### 1800'"),
    "gsm8k/test_sample/7|underspecified|0|T0": ("160", "200", None, False, 0.0, 0.0,
                                                "'it takes approximately 200 GB ... 200 GB file size limit'"),
    # no number at all
    "synthetic/7/16|underspecified|0|T1": ("53", None, None, False, 0.0, 0.0, "'the answer is infinity'"),
}


@pytest.fixture(scope="module")
def replies() -> dict[str, dict]:
    rows = [json.loads(line) for line in TUNE.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {r["id"]: r for r in rows}


@pytest.mark.parametrize("rid", list(CASES))
def test_real_reply(replies, rid):
    gold, extracted, marked, several, strict, lenient, why = CASES[rid]
    text = replies[rid]["text"]
    assert extract_answer(text) == extracted, why
    assert extract_marked_answer(text) == marked, why
    assert offers_several_candidates(text) is several, why
    assert verify(text, gold, "strict") == strict, why
    assert verify(text, gold, "lenient") == lenient, why
    if extracted is not None:  # the extracted value is what strict mode compares: right for that gold
        assert verify(text, extracted, "strict") == 1.0
        assert verify(text, extracted, "lenient") == (0.0 if several else 1.0)  # a hedge is refused


def test_hand_golds_match_the_data(replies):
    gsm = {t.task_id: t for t in load_source("gsm8k:@gsm8k/test_sample.jsonl")}
    syn = {t.task_id: t for t in synthetic_tasks(24, steps=1, seed=7) + synthetic_tasks(24, steps=2, seed=8)}
    for rid, (gold, *_rest) in CASES.items():
        rec = replies[rid]
        task = gsm.get(rec["task_id"]) or syn[rec["task_id"]]
        assert task.answer == gold, rid
        assert rec["question"].split()[:6] == task.full_prompt.split()[:6], rid
    assert len(CASES) >= 15
