"""Non-math LiC replies with think blocks: the task verifiers read the answer after the block (real records)."""

from __future__ import annotations

from jaxrl_mt.eval.task_scoring import score_task_turns
from tests.eval.test_task_scoring import records, replies  # noqa: F401  (the module's fixture and replies)


def test_task_verifiers_read_after_the_think_block(records):  # noqa: F811
    tasks, texts, want = [], [], []
    for d, (good, bad) in replies(records).items():
        tasks += [records[d]] * 3
        texts += [f"<think>\nFirst try:\n{bad}\n</think>\n\n{good}",  # the answer is right
                  f"<think>\nMaybe:\n{good}\n</think>\n\n{bad}",  # the right one only in the reasoning
                  f"<think>\nMaybe:\n{good}"]  # cut inside the think block: no answer
        want += [(1.0, True), (0.0, True), (0.0, False)]
    got = score_task_turns(texts, tasks, ["answer_attempt"] * len(texts), llm_label=False, workers=1)
    assert [(i["correct"], i["answer_attempt"]) for i in got] == want
