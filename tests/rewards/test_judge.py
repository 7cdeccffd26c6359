"""Tests of the response-type judge: each rule, the labelled set, the LLM judge's parsing."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_mt.rewards.judge import (
    JUDGE_PROMPT,
    NON_ANSWER_TYPES,
    RESPONSE_TYPES,
    classify_llm,
    classify_rule_based,
    evaluate_labelled,
    format_table,
    is_answer_attempt,
    load_labelled,
    macro_f1,
    parse_judge_reply,
)

LABELLED = Path(__file__).with_name("judge_labelled.jsonl")
MACRO_F1_FLOOR = 0.95  # achieved: 1.000 on the 156 items (see the report in test output)
PER_TYPE_F1_FLOOR = 0.9


def test_types():
    assert RESPONSE_TYPES == (
        "answer_attempt", "clarification", "interrogation", "discussion", "hedging", "refusal",
        "missing",
    )
    assert NON_ANSWER_TYPES == set(RESPONSE_TYPES) - {"answer_attempt", "missing"}


# ----------------------------------------------------------------------------- one test per rule


@pytest.mark.parametrize(
    "text",
    [
        "",
        "  \n ",
        "<|im_end|>",
        "<|im_start|>assistant<|im_end|>",
        "?!...",
        "Answer:",
        "The final answer is",
        "assistant",
        "yes yes yes yes yes yes yes yes",  # 1 distinct word in 8
        "I think I think I think I think I think I think",  # 2 in 12 (ratio 0.17 <= 0.25)
    ],
)
def test_missing_rule(text):
    assert classify_rule_based(text) == "missing"


def test_missing_repetition_threshold():
    # 4 words, 1 distinct: 0.25 <= 0.25 -> missing; 3 words are too few to call repetition.
    assert classify_rule_based("go go go go") == "missing"
    assert classify_rule_based("go go go") != "missing"


@pytest.mark.parametrize(
    "text",
    [
        "It's either 4 or 6.",  # alternative pattern
        "It could be 15 or 20 marbles.",
        "She either has 8 or 12 left.",
        "If it rains, 5 people come. If not, 9 come.",  # two conditions, numbers after
        "Assuming no tax, $40. However, if tax applies, it is $43.",
        "It depends on the day: 3 buses on Monday, 5 on Friday.",  # framing + numbers
        "Case 1: 6 hours. Case 2: 3 hours.",
        "Two possible answers: 9 or 8.",
    ],
)
def test_hedging_rule(text):
    assert classify_rule_based(text) == "hedging"


@pytest.mark.parametrize(
    "text",
    [
        "If each box holds 6 eggs, 4 boxes hold 24 eggs.",  # one condition only
        "The total depends on how many they sell.",  # framing without numbers
        "The price is $3 for muffins and $1 for cookies. What they earn depends on sales.",
    ],
)
def test_hedging_needs_alternatives(text):
    assert classify_rule_based(text) != "hedging"


@pytest.mark.parametrize(
    "text",
    [
        "\\boxed{12}",
        "Working... #### 7",
        "The answer is 7. Would you like more examples?",
        "I'm not sure, but the answer is 3.",  # marker beats the refusal phrase
        "Final answer: 250 people. Do you know how many came last year?",  # marker beats question
    ],
)
def test_answer_marker_rule(text):
    assert classify_rule_based(text) == "answer_attempt"


@pytest.mark.parametrize(
    "text",
    [
        "Could you tell me how many apples there are?",
        "How many apples are there?",  # trailing question, no "you"
        "Please tell me the price.",  # request without "?"
        "Can you tell me the price? Once I know it I can finish.",  # "you" question, not last
        "I need the width. What is the width, in meters?",
        "Before I calculate, can you confirm the rate?",  # a bare comma does not add an ask
        "When you say a dozen, do you mean 12?",
        "I'd be happy to help! How old is Ben?",  # pleasantry dropped, question kept
    ],
)
def test_clarification_rule(text):
    assert classify_rule_based(text) == "clarification"


@pytest.mark.parametrize(
    "text",
    [
        "How many apples? How many pears?",
        "What is the width, and how long is it?",  # ", and how" adds an ask
        "I need two things: what is the price; how many items?",
        "Please give me these details:\n- the price\n- the number of items",  # request + list
        "Could you tell me:\n1. the speed\n2. the time\n3. the distance",
    ],
)
def test_interrogation_rule(text):
    assert classify_rule_based(text) == "interrogation"


def test_rhetorical_question_is_not_an_ask():
    # A question followed by reasoning that ends on a result is a restated problem.
    text = "How many are left? She had 10 and ate 4, so 10 - 4 = 6. She has 6 left."
    assert classify_rule_based(text) == "answer_attempt"


@pytest.mark.parametrize(
    "text",
    [
        "I can't help with that.",
        "I am unable to solve this.",
        "I'd rather not guess.",
        "This cannot be determined.",
        "This can't be answered.",
        "It is impossible to say.",
        "There is not enough information, so no answer can be given.",
        "As an AI, I will not do math homework.",
    ],
)
def test_refusal_rule(text):
    assert classify_rule_based(text) == "refusal"


def test_question_beats_refusal_phrase():
    assert classify_rule_based("I can't solve it yet. What is the price?") == "clarification"


@pytest.mark.parametrize(
    "text",
    [
        "18",  # a short reply holding a number
        "$18 dollars",
        "She has 9 eggs and sells them for $2 each, so 9 * 2 = 18.",  # "= N" in the last sentence
        "She has 9 eggs and sells them for $2 each. So she makes $18.",  # conclusion opener
        "3 fields of 45 cows is 45 * 3 = 135 cows. Selling 20, he keeps 135 - 20, or 115.",
        "Each bag holds 6, so 5 bags hold 30. Since 4 are rotten, 26 are good.",  # new number
        "36 / 4 gives 9. Each friend gets 9 cookies. Let me know if you need anything else!",
    ],
)
def test_conclusion_rule(text):
    assert classify_rule_based(text) == "answer_attempt"


@pytest.mark.parametrize(
    "text",
    [
        "We need to divide the distance by the speed.",
        "The trip is 240 miles, and the speed will determine the time.",  # planning word
        "First we add 3 and 4. Then we will need to multiply by 2.",  # new number, but planning
        "So we need to multiply 12 by 4 first.",
    ],
)
def test_discussion_is_the_default(text):
    assert classify_rule_based(text) == "discussion"


# Replies of the embedded model (tune split of tests/rewards/judge_real), one per rule.
@pytest.mark.parametrize(
    "text, question, label",
    [
        # A plain statement of the asked quantity commits, even to a number the user just gave.
        ("Jonas has 23 coins.", "How many coins does Jonas have at the end of the first day?", "answer_attempt"),
        ("The number of apples Liam has at the end of the first day is 1.",
         "How many apples does Liam have at the end of the first day?", "answer_attempt"),
        # Repeating the user's event, or the starting amount, does not.
        ("Ava loses 11 books on the first day.", "How many books does Ava have at the end of the first day?",
         "discussion"),
        ("Ava starts with 12 books.", "How many books does Ava have at the end of the first day?", "discussion"),
        # A value, then more work on the question: not concluded.
        ("Emma buys 25 more cards on the first day, which means she has 25 cards in total. On the second day, "
         "she receives 12 cards from a friend, so she has 2 * 12 = 24 cards left.\n\nTo find out how many cards "
         "Emma has at the end of the second day, we need to calculate the number of cards Emma has at the end of the",
         "How many cards does Emma have at the end of the second day?", "discussion"),
        # A closing remark about something else does not undo the stated value.
        ("If Chloe starts with 39 marbles, she has 3 * 39 = 108 marbles left over after the initial 39 marbles.\n\n"
         "This is a classic example of a geometric progression, where the ratio of the initial number to the final "
         "number is 3.", "How many marbles does Chloe have at the end of the first day?", "answer_attempt"),
        # A "label: value" line.
        ("D\u00eda de la Maderia: 20 books\n\nThis is a classic example of a mathematical concept.",
         "How many books does Diego have at the end of the second day?", "answer_attempt"),
        # Cut off in the middle of an expression.
        ("So, Ava has 12 - 11 = 1 book left.\n\nTo find out how many books Ava has at the end of the first day, we "
         "need to calculate the number of days she has left.\n\nThe number of days Ava has left is 12 -",
         "How many books does Ava have at the end of the first day?", "discussion"),
        # With the question known, a state of another quantity is not an answer.
        ("To find the cost we multiply tickets by price. The fee is a fixed $5.",
         "What is the total cost of the tickets?", "discussion"),
    ],
)
def test_statements_of_the_asked_quantity(text, question, label):
    assert classify_rule_based(text, question=question) == label


def test_other_domains():
    assert classify_rule_based("```python\nprint(1)\n```", domain="code") == "answer_attempt"
    assert classify_rule_based("SELECT name FROM users;", domain="database") == "answer_attempt"
    plan = "We need to loop over the list first."
    assert classify_rule_based(plan, domain="code") == "discussion"
    assert classify_rule_based("Which language should I use?", domain="code") == "clarification"
    # A marker is not needed outside math, and "the answer is" alone proves nothing there.
    assert classify_rule_based("Paris is the capital.", domain="summary") == "answer_attempt"


def test_is_answer_attempt():
    assert is_answer_attempt("#### 4")
    assert not is_answer_attempt("What is the price?")
    assert not is_answer_attempt("")


# ----------------------------------------------------------------------------- labelled set


def test_labelled_file_is_balanced():
    items = load_labelled(str(LABELLED))
    assert len(items) >= 60
    for label in RESPONSE_TYPES:
        assert sum(g == label for _, g in items) >= 8, label
    assert len({text for text, _ in items}) == len(items), "duplicate texts"


def test_rule_based_precision_recall_on_labelled_set():
    items = load_labelled(str(LABELLED))
    gold = [label for _, label in items]
    predicted = [classify_rule_based(text) for text, _ in items]
    scores = evaluate_labelled(gold, predicted)
    print("\n" + format_table(scores))
    errors = [(g, p, t) for (t, g), p in zip(items, predicted) if g != p]
    for g, p, t in errors:
        print(f"[{g} -> {p}] {t!r}")
    assert macro_f1(scores) >= MACRO_F1_FLOOR
    for s in scores:
        assert s.f1 >= PER_TYPE_F1_FLOOR, s


def test_evaluate_labelled_hand_computed():
    gold = ["answer_attempt", "answer_attempt", "refusal", "missing"]
    predicted = ["answer_attempt", "refusal", "refusal", "discussion"]
    by_label = {s.label: s for s in evaluate_labelled(gold, predicted)}
    a = by_label["answer_attempt"]
    assert (a.precision, a.recall, a.support, a.predicted) == (1.0, 0.5, 2, 1)
    assert a.f1 == pytest.approx(2 / 3)  # 2 * 1 * 0.5 / 1.5
    r = by_label["refusal"]
    assert (r.precision, r.recall) == (0.5, 1.0)
    m = by_label["missing"]
    assert math.isnan(m.precision) and m.recall == 0.0  # nothing predicted "missing"
    d = by_label["discussion"]
    assert d.precision == 0.0 and math.isnan(d.recall)
    # Macro over the 3 gold types: (2/3 + 2/3 + 0) / 3 (an undefined F1 counts as 0).
    assert macro_f1(list(by_label.values())) == pytest.approx(4 / 9)


def test_load_labelled_reports_file_line_and_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok", "label": "refusal"}\n{"text": "x", "label": "rant"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: field 'label' has unknown type 'rant'"):
        load_labelled(str(path))
    path.write_text('{"label": "refusal"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: field 'text'"):
        load_labelled(str(path))
    path.write_text("{oops\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not valid JSON"):
        load_labelled(str(path))


def test_cli_prints_table():
    out = subprocess.run(
        [sys.executable, "-m", "jaxrl_mt.rewards.judge", "--eval", str(LABELLED)],
        capture_output=True, text=True, check=True,
    ).stdout
    header = out.splitlines()[0].split()
    assert header == ["type", "precision", "recall", "f1", "support", "predicted"]
    for label in RESPONSE_TYPES:
        assert f"\n{label} " in out
    assert "macro-F1" in out


# ----------------------------------------------------------------------------- LLM judge


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("Category: hedging", "hedging"),
        ("category: **Answer_Attempt**", "answer_attempt"),
        ("Category = answer attempt", "answer_attempt"),
        ("**Category:** Refusal", "refusal"),
        ("Category: answer-attempt.", "answer_attempt"),
        ("Category: hedging - it gives two answers", "hedging"),
        ("Reasoning: it asks two things.\nCategory: interrogation", "interrogation"),
        ("refusal", "refusal"),
        ("  Clarification. ", "clarification"),
        ("The reply is a discussion of the problem.", "discussion"),
        ("clarification or interrogation", None),  # ambiguous
        ("I think it is fine.", None),
        ("Category: banana", None),
        ("", None),
    ],
)
def test_parse_judge_reply(reply, expected):
    assert parse_judge_reply(reply) == expected


class ScriptedBackend:
    """A ChatBackend that answers from a fixed list and records what it was sent."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.calls = []

    def chat(self, conversations, *, max_new_tokens=256, temperature=0.0):
        self.calls.append((conversations, max_new_tokens, temperature))
        return self.replies[: len(conversations)]


def test_classify_llm_parses_and_falls_back():
    backend = ScriptedBackend(["Category: hedging", "no idea", "Category: refusal"])
    texts = ["It is 4 or 6 maybe.", "What is the price?", "I won't.", "   "]
    stats = {}
    labels = classify_llm(backend, texts, questions=["Q1", "Q2", "Q3", "Q4"], stats=stats)
    # Reply 2 names no category: the rule-based verdict ("clarification") is used and counted.
    assert labels == ["hedging", "clarification", "refusal", "missing"]
    assert stats == {"llm": 2, "fallback": 1, "empty": 1}
    (conversations, max_new_tokens, temperature), = backend.calls
    assert len(conversations) == 3  # the empty reply was not sent
    assert temperature == 0.0 and max_new_tokens == 32
    prompt = conversations[0][0]["content"]
    assert conversations[0][0]["role"] == "user"
    assert "Q1" in prompt and "It is 4 or 6 maybe." in prompt
    for label in RESPONSE_TYPES:
        assert label in JUDGE_PROMPT


def test_classify_llm_without_questions_and_length_checks():
    backend = ScriptedBackend(["answer_attempt"])
    assert classify_llm(backend, ["#### 4"]) == ["answer_attempt"]
    assert "(not shown)" in backend.calls[0][0][0][0]["content"]
    with pytest.raises(ValueError, match="2 texts but 1 questions"):
        classify_llm(backend, ["a", "b"], questions=["q"])
    with pytest.raises(ValueError, match="1 replies for 2"):
        classify_llm(ScriptedBackend(["refusal"]), ["a", "b"])


def test_labelled_lines_are_plain_records():
    for line in LABELLED.read_text().splitlines():
        assert set(json.loads(line)) == {"text", "label"}


HELDOUT = Path(__file__).with_name("judge_heldout.jsonl")


def test_held_out_responses_keep_their_untuned_score():
    """30 hand-written responses (5 per type but ``missing``) written after an earlier freeze of the rules.

    Its 5 ``missing`` items were copies of ``judge_labelled.jsonl`` lines (3 exact, 2 up to
    whitespace) and were removed: held-out means held out (``test_judge_real`` checks that no
    held-out text repeats a tuning text). Measured then: 0.891 macro-F1 on 35; after this
    session's rules 28/30 (0.93). Do not tune the rules on this file."""
    items = load_labelled(str(HELDOUT))
    assert len(items) == 30 and {lab for _, lab in items} == set(RESPONSE_TYPES) - {"missing"}
    pred = [classify_rule_based(t) for t, _ in items]
    hits = sum(p == g for p, (_, g) in zip(pred, items))
    assert hits >= 28, hits


def test_folds_group_replies_by_problem_with_a_fixed_hash():
    """The cross-validation folds (round 3): sha256 of the task id mod 5, the same on every run."""
    from jaxrl_mt.rewards.judge_eval import N_FOLDS, answer_attempt_by_fold, fold_of, mean_over_folds

    assert N_FOLDS == 5 and fold_of("gsm8k/0") == int(hashlib.sha256(b"gsm8k/0").hexdigest(), 16) % 5
    recs = [{"task_id": f"t{i}", "label": "answer_attempt"} for i in range(40)]
    per_fold = answer_attempt_by_fold(recs, ["answer_attempt"] * 20 + ["discussion"] * 20)
    assert len(per_fold) == 5 and sum(s.support for s in per_fold) == 40
    p, r = mean_over_folds(per_fold)
    assert p == 1.0 and 0.0 < r < 1.0
