"""Replies with think blocks (Qwen3 thinking): the verifier, the judges and abstention read the answer after it."""

from __future__ import annotations

import json

import pytest

from jaxrl_mt.rewards.abstain import is_abstain
from jaxrl_mt.rewards.judge_llm import judge_llm, parse_judge_answer, parse_judge_reply
from jaxrl_mt.rewards.judge_rules import classify_rule_based
from jaxrl_mt.rewards.think import answer_part, has_think_block
from jaxrl_mt.rewards.verifier import extract_answer, extract_marked_answer, verify, verify_both
from tests.rewards.judge_real import REAL_DIR

# a reply as Qwen3 writes it in thinking mode: reasoning with its own (wrong) candidate, then the answer
THINK = "<think>\nShe has 3 apples and buys 4, or was it 5? The answer is 8.\n</think>\n\n"


@pytest.mark.parametrize("reply, answer", [
    ("The answer is 7.", "The answer is 7."),
    (THINK + "The answer is 7.", "\n\nThe answer is 7."),
    ("<think>\nhm</think>a</think>b", "b"),  # the last close wins
    ("<think>\nstill thinking, 12", ""),  # cut inside the block: no answer
    ("<think>a</think>b<think>again", ""),  # a block opened again and left open
    ("reasoning only closed</think>\n\n42", "\n\n42"),  # the template opened the block in the prompt
    ("", ""),
])
def test_answer_part_by_hand(reply, answer):
    got = answer_part(reply)
    assert got == answer
    assert answer_part(got) == got and not has_think_block(got)


def test_verifier_reads_after_the_think_block():
    reply = THINK + "She has 3 + 4 = 7 apples.\n\\boxed{7}"
    assert verify(reply, "7") == 1.0 and verify(reply, "8") == 0.0
    assert verify(reply, "7", "lenient") == 1.0 and verify(reply, "8", "lenient") == 0.0
    assert extract_answer(reply) == "7" and extract_marked_answer(reply) == "7"
    # the numbers of the reasoning do not count, even as lenient's "last three numbers"
    assert verify(THINK + "7", "8", "lenient") == 0.0 and verify(THINK + "7", "5", "lenient") == 0.0
    # the reasoning's "4, or was it 5?" is no second candidate of the answer
    assert verify(THINK + "The answer is 7.", "7", "lenient") == 1.0
    # without the think block the same text reads differently (the test can fail)
    assert verify(THINK.replace("<think>", "").replace("</think>", "") + "\\boxed{7}", "8", "lenient") == 0.0
    assert extract_answer("She buys 4, the answer is 8.") == "8"
    # a think block cut by the budget holds no answer, whatever it says
    cut = "<think>\nThe answer is 7. \\boxed{7}"
    assert verify(cut, "7") == 0.0 and verify(cut, "7", "lenient") == 0.0
    assert extract_answer(cut) is None and extract_marked_answer(cut) is None
    assert verify_both(THINK + "#### 7", "7") == {"strict": 1.0, "lenient": 1.0}
    assert verify_both(cut, "7") == {"strict": 0.0, "lenient": 0.0}


def test_abstention_inside_the_think_block_is_no_abstention():
    assert is_abstain("<think>\nMaybe \\boxed{abstain}?\n</think>\n\n\\boxed{abstain}")
    assert not is_abstain("<think>\n\\boxed{abstain}\n</think>\n\n\\boxed{12}")
    assert not is_abstain("<think>\n\\boxed{abstain}")


def _labelled(n: int) -> list[dict]:
    with open(f"{REAL_DIR}/tune.jsonl") as f:
        rows = [json.loads(line) for line in f]
    by_label: dict[str, list[dict]] = {}
    for r in rows:
        by_label.setdefault(r["label"], []).append(r)
    return [r for label in sorted(by_label) for r in by_label[label][:n]]


def test_rule_judge_on_real_replies_wrapped_in_think_blocks():
    """The embedded model's labelled replies keep their verdict behind a think block that would
    change it (a question, a number, a hedge)."""
    rows = _labelled(8)
    assert len({r["label"] for r in rows}) >= 5
    think = "<think>\nWhat exactly is asked? Maybe 12 or 14. I am not sure, could you tell me the price?\n</think>\n\n"
    changed = 0
    for r in rows:
        kw = {"question": r.get("question"), "user": r.get("user")}
        plain = classify_rule_based(r["text"], **kw)
        assert classify_rule_based(think + r["text"], **kw) == plain, r["id"]
        changed += classify_rule_based(think.replace("<think>", "").replace("</think>", "") + r["text"], **kw) != plain
        # cut inside the think block: no answer
        assert classify_rule_based("<think>\n" + r["text"], **kw) == "missing"
    assert changed > 0  # the reasoning, read as answer, would change verdicts


class ScriptedBackend:
    """A ChatBackend that answers from a fixed list and records what it was sent."""

    def __init__(self, replies):
        self.replies, self.calls = list(replies), []

    def chat(self, conversations, *, max_new_tokens=256, temperature=0.0):
        self.calls.append(conversations)
        return self.replies[: len(conversations)]


def test_llm_judge_sees_the_answer_and_reads_a_thinking_judge():
    backend = ScriptedBackend(["<think>\nCategory: hedging? no.\n</think>\nCategory: answer_attempt\nAnswer: 7",
                               "<think>\nCategory: refusal"])
    texts = [THINK + "She has 7 apples.", "<think>\nI could answer 7", THINK + "Which apples do you mean?"]
    stats: dict[str, int] = {}
    got = judge_llm(backend, texts, ["q1", "q2", "q3"], stats=stats)
    (sent,) = backend.calls
    assert len(sent) == 2  # the open think block is missing without asking
    prompt = sent[0][0]["content"]
    assert "She has 7 apples." in prompt and "<think>" not in prompt and "or was it 5" not in prompt
    assert [(v.label, v.answer, v.source) for v in got] == [
        ("answer_attempt", "7", "llm"), ("missing", None, "empty"), ("clarification", None, "fallback")]
    assert stats == {"llm": 1, "fallback": 1, "empty": 1}
    assert parse_judge_reply("<think>\nCategory: refusal\n</think>\nCategory: hedging") == "hedging"
    assert parse_judge_answer("<think>\nAnswer: 3\n</think>\nCategory: answer_attempt\nAnswer: 4") == "4"
