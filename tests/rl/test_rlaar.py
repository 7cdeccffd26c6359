r"""RLAAR: the shard-count curriculum against hand-worked reward sequences, unsolvable samples (never their last
shard, on the shipped RLSTA problems), ``\boxed{abstain}`` detection on realistic replies, the reward."""

from __future__ import annotations

import json

import pytest

from jaxrl_mt.data.loaders import load_source
from jaxrl_mt.rl.rlaar import Curriculum, CurriculumConfig, abstention_reward, is_abstain, shard_turns


def _run(cur: Curriculum, rewards):
    counts = []
    for r in rewards:
        counts.append(cur.count())
        cur = cur.update(r)
    return counts, cur


def test_schedule_hand_worked():
    """max_shards = 3. Steps 0-9 reward 0.5: threshold 0.8 x 0.5 = 0.4; after step 9 the window mean 0.5 > 0.4
    and 10 steps passed: 2 shards. Steps 10-19 reward 0.3: the window falls to 0.3. From step 20 reward 0.45:
    after step 19 + j the window mean is 0.3 + 0.015 j, first > 0.4 at j = 7 (0.405; j = 6: 0.39), step 26:
    3 shards = max, so from step 27 a random count in [1, 3]."""
    cfg = CurriculumConfig(max_shards=3, seed=7)
    counts, cur = _run(Curriculum(cfg), [0.5] * 10 + [0.3] * 10 + [0.45] * 30)
    assert counts[:27] == [1] * 10 + [2] * 17
    assert cur.threshold == pytest.approx(0.4) and cur.last_increase == 27 and cur.random_phase
    rand = counts[27:]
    assert set(rand) <= {1, 2, 3} and len(set(rand)) == 3  # random, all three values drawn
    assert rand == [Curriculum(cfg, step=s, random_phase=True).count() for s in range(27, 50)]  # seeded by step


def test_schedule_defaults_constant_reward():
    """Reward 1 every step: one more shard every 10 steps (the gap), 10 shards after step 89, random after."""
    counts, cur = _run(Curriculum(), [1.0] * 300)
    assert counts[:90] == [1 + t // 10 for t in range(90)]
    assert cur.shards == 10 and cur.last_increase == 90
    assert set(counts[90:]) == set(range(1, 11))  # uniform in [1, 10]: all values appear in 210 draws
    other, _ = _run(Curriculum(CurriculumConfig(seed=1)), [1.0] * 300)
    assert other[:90] == counts[:90] and other[90:] != counts[90:]  # the seed changes only the random phase


def test_schedule_gated_by_threshold_and_gap():
    # a competence drop after the first increase: never above 0.8 x 1.0 again, no more shards
    counts, cur = _run(Curriculum(), [1.0] * 10 + [0.79] * 40)
    assert counts == [1] * 10 + [2] * 40 and cur.threshold == pytest.approx(0.8)
    counts, _ = _run(Curriculum(), [0.0] * 30)  # zero reward: threshold 0, "exceeds" is strict
    assert counts == [1] * 30


def test_resume_continues_the_same_schedule():
    rewards = [0.5] * 10 + [0.3] * 10 + [0.45] * 30
    cfg = CurriculumConfig(max_shards=3)
    full, _ = _run(Curriculum(cfg), rewards)
    first, mid = _run(Curriculum(cfg), rewards[:23])
    restored = Curriculum.from_json(json.loads(json.dumps(mid.to_json())))
    assert restored == mid
    rest, _ = _run(restored, rewards[23:])
    assert first + rest == full


def test_unsolvable_never_contains_the_last_shard():
    tasks = load_source("rlsta_add:@")
    assert len(tasks) >= 5
    for t in tasks:
        shards = [t.target, *t.conditions]
        last = shards[-1]
        assert all(last not in s for s in shards[:-1])  # the check below can tell
        for k in range(1, 11):
            solv = shard_turns(shards, k)
            uns = shard_turns(shards, k, unsolvable=True)
            assert len(solv) == min(k, len(shards)) and len(uns) == min(k, len(shards) - 1)
            assert last in "\n".join(solv) and not any(last in turn for turn in uns)
            assert "\n".join(uns).split("\n") == "\n".join(shards[:-1]).split("\n")  # every other shard, in order


def test_shard_turns_groups_exact():
    s = ["Q?", "a", "b", "c", "d"]
    assert shard_turns(s, 1) == ("Q?\na\nb\nc\nd",)
    assert shard_turns(s, 2) == ("Q?\na\nb", "c\nd")
    assert shard_turns(s, 3, unsolvable=True) == ("Q?\na", "b", "c")
    assert shard_turns(s, 9) == tuple(s)
    with pytest.raises(ValueError):
        shard_turns(["Q?"], 1, unsolvable=True)
    with pytest.raises(ValueError):
        shard_turns(s, 0)


ABSTAIN = [
    "I don't have enough information to determine the total cost, because the price per item was "
    "never given.\n\n\\boxed{abstain}",
    "The problem does not say how many apples Tom gives away. Final answer: $\\boxed{Abstain}$",
    "Without the rate I can't compute it. \\boxed{ ABSTAIN }",
    "The answer cannot be determined. \\boxed{\\text{abstain}}",
    "<think>\nThe question asks for the total but the number of boxes is missing. Maybe 12? No, "
    "it was never stated.\n</think>\n\nSome information is missing, so I will not guess.\n\n\\boxed{abstain}",
    "First I tried \\boxed{42}, but that assumed a price that was never given. So: \\boxed{abstain}",
]
NOT_ABSTAIN = [
    "Tom has 3 + 4 = 7 apples.\n\n\\boxed{7}",
    "If the information were incomplete I would answer \\boxed{abstain}, but it is complete: \\boxed{18}",
    "<think>\nI could write \\boxed{abstain} here... no, 5 * 3 = 15.\n</think>\n\n\\boxed{15}",
    "<think>\nThe rate is missing, so perhaps \\boxed{abstain}",  # cut inside the think block: no answer
    "I abstain from guessing; the answer is unclear.",  # no boxed abstain
    "\\boxed{abstained}",
    "\\boxed{abstain: missing price}",
    "The answer is 12. \\boxed{12}",
]


@pytest.mark.parametrize("reply", ABSTAIN)
def test_is_abstain_positive(reply):
    assert is_abstain(reply)


@pytest.mark.parametrize("reply", NOT_ABSTAIN)
def test_is_abstain_negative(reply):
    assert not is_abstain(reply)


def test_abstention_reward():
    assert abstention_reward(ABSTAIN[0], solvable=False, gold="7") == 1.0
    assert abstention_reward(NOT_ABSTAIN[0], solvable=False, gold="7") == 0.0  # answered an unsolvable sample
    assert abstention_reward(ABSTAIN[4], solvable=True, gold="7") == 0.0  # abstained on a solvable one
    assert abstention_reward(NOT_ABSTAIN[0], solvable=True, gold="7") == 1.0
    assert abstention_reward(NOT_ABSTAIN[0], solvable=True, gold="8") == 0.0
    # the verifier reads the answer after the think block, not a number inside it
    assert abstention_reward("<think>\nIt is 9? No.\n</think>\n\\boxed{15}", solvable=True, gold="15") == 1.0
    assert abstention_reward("<think>\n\\boxed{15}\n</think>\nI am not sure.", solvable=True, gold="15") == 0.0


def test_drop_last_shard_item_never_holds_the_last_shard():
    from jaxrl_mt.data.scenarios import build_scenario
    from jaxrl_mt.rl.histories import TrainItem
    from jaxrl_mt.rl.rlaar import drop_last_shard

    for t in load_source("rlsta_add:@"):
        sc = build_scenario(t, "sharded")
        hist = tuple(x for i, u in enumerate(sc.turns[:-1]) for x in (("user", u), ("assistant", f"Noted {i}.")))
        item = TrainItem(item_id=f"{t.task_id}|sharded|0", task_id=t.task_id, kind="sharded", history=hist,
                         last_user=sc.turns[-1], anchor_prompt=sc.anchor_prompt, merged_user="\n".join(sc.turns),
                         answer=sc.answer)
        uns = drop_last_shard(item)
        last = sc.turns[-1]
        assert uns.kind == "unsolvable" and uns.item_id == item.item_id + "|unsolvable"
        text = "\n".join([c for _, c in uns.history] + [uns.last_user, uns.anchor_prompt, uns.merged_user])
        assert last not in text and last in item.anchor_prompt + item.merged_user
        assert [m["content"] for m in uns.messages if m["role"] == "user"] == list(sc.turns[:-1])
        assert uns.messages == item.messages[:-2]  # the conversation up to the previous user turn
    with pytest.raises(ValueError, match="no user turn"):
        drop_last_shard(TrainItem("x", "x", "sharded", (), "Q?", "Q?", "Q?", "1"))
