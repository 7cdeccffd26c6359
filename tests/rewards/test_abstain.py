"""The registered ``rlaar`` reward, built by name: abstention on unsolvable items, the verifier on solvable ones."""

from __future__ import annotations

import numpy as np

from configs.rlsta import get_config
from jaxrl_mt.rewards.abstain import UNSOLVABLE
from jaxrl_mt.rewards.registry import RewardEnv, check_output, make_reward, reward_names
from jaxrl_mt.rl.histories import TrainItem
from jaxrl_mt.sampling import GenerationResult
from jaxrl_mt.rl.run_config import typed_config


def _item(kind: str) -> TrainItem:
    return TrainItem(item_id=f"t|{kind}|0", task_id="t", kind=kind, history=(("user", "Tom has 3 apples."),),
                     last_user="He buys some more. How many now?", anchor_prompt="", merged_user="", answer="7")


def test_rlaar_reward_by_name():
    assert "rlaar" in reward_names()
    c = get_config("cpu")
    c.rl.verifier_mode = "strict"
    texts = ["The answer is 7.", "\\boxed{abstain}", "\\boxed{8}",  # solvable: right, abstained, wrong
             "\\boxed{7}", "<think>\nThe number bought is missing.\n</think>\n\\boxed{Abstain}", "I think 9."]
    gen = GenerationResult([[1]] * 6, [np.zeros(1)] * 6, np.ones(6, int), ["stop"] * 6, texts)
    env = RewardEnv(typed_config(c), 3)
    out = check_output(make_reward("rlaar", env)([_item("sharded"), _item(UNSOLVABLE)], gen), 6)
    np.testing.assert_array_equal(out.rewards, [1, 0, 0, 0, 1, 0])
    np.testing.assert_array_equal(out.components["abstain"], [0, 1, 0, 0, 1, 0])
    np.testing.assert_array_equal(out.components["solvable_acc"], [1, 0, 0])
    np.testing.assert_array_equal(out.components["unsolvable_abstain"], [0, 1, 0])
    assert out.columns["kind"] == ["sharded"] * 3 + [UNSOLVABLE] * 3
