"""Rewards as registered plug-ins: lookup, a custom reward, output checks, and rlsta / grpo / icpo built by name."""

from __future__ import annotations

import numpy as np
import pytest

import jaxrl_mt.rewards.icpo  # noqa: F401  (registers "icpo")
import jaxrl_mt.rewards.rlsta  # noqa: F401  (registers "rlsta", "grpo")
from configs.icpo import get_config as icpo_config
from configs.rlsta import get_config
from jaxrl_mt.rewards.anchor import anchor_reward
from jaxrl_mt.rewards.registry import RewardEnv, RewardOutput, check_output, make_reward, register_reward, reward_names
from jaxrl_mt.rewards.verifier import verify
from jaxrl_mt.rl.histories import TrainItem
from jaxrl_mt.sampling import GenerationResult
from jaxrl_mt.rl.run_config import typed_config


def _item(i: int, answer: str, kind: str = "sharded", last: str = "How many?") -> TrainItem:
    return TrainItem(item_id=f"t{i}|{kind}|0", task_id=f"t{i}", kind=kind, history=(), last_user=last,
                     anchor_prompt=f"Tom has {answer} apples. How many?", merged_user=last, answer=answer)


def _generations(texts: list[str], tokenizer) -> GenerationResult:
    toks = [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    return GenerationResult(toks, [np.zeros(len(t), np.float32) for t in toks], np.array([len(t) for t in toks]),
                            ["stop"] * len(texts), texts)


def test_unknown_reward_lists_the_registered_ones():
    assert {"rlsta", "grpo", "icpo"} <= set(reward_names())
    with pytest.raises(KeyError, match="unknown reward .nope.; known: .*grpo.*icpo.*rlsta"):
        make_reward("nope", RewardEnv(None, 2))


def test_a_custom_reward_is_built_by_name_and_checked():
    @register_reward("length_test")
    def build(env):
        return lambda items, gen: RewardOutput(np.asarray(gen.lengths, float) * env.config, {"len": gen.lengths},
                                               {"n": list(gen.lengths)})

    gen = GenerationResult([[1], [1, 2]], [np.zeros(1), np.zeros(2)], np.array([1, 2]), ["stop", "stop"], ["a", "b"])
    out = check_output(make_reward("length_test", RewardEnv(0.5, 2))([None], gen), 2)
    np.testing.assert_allclose(out.rewards, [0.5, 1.0])
    with pytest.raises(ValueError, match=r"rewards have shape \(2,\), expected \(3,\)"):
        check_output(out, 3, "length_test")
    with pytest.raises(ValueError, match="non-finite"):
        check_output(RewardOutput(np.array([np.nan, 1.0]), {}, {}), 2)
    with pytest.raises(ValueError, match="column 'n' has 1 rows"):
        check_output(RewardOutput(np.ones(2), {}, {"n": [1]}), 2)


def test_rlsta_and_grpo_rewards_by_name(tiny_chat_model_dir):
    from jaxrl_mt.models.registry import load_model
    from jaxrl_mt.scoring import Scorer

    m = load_model(str(tiny_chat_model_dir))
    c = get_config("cpu")
    c.rl.alpha, c.rl.verifier_mode = 0.5, "strict"
    env = RewardEnv(typed_config(c), 2, m.tokenizer, None, Scorer(m.params, m.cfg, pad_id=m.pad_id))
    items = [_item(0, "3"), _item(1, "7")]
    texts = ["The answer is 3.", "maybe 4", "The answer is 7.", ""]
    gen = _generations(texts, m.tokenizer)
    r = make_reward("rlsta", env)(items, gen)
    g = make_reward("grpo", env)(items, gen)
    rv = np.array([verify(t, a, "strict") for t, a in zip(texts, ["3", "3", "7", "7"])], float)
    rs = anchor_reward(env.ref_scorer, m.tokenizer, [it.anchor_prompt for it in items for _ in range(2)], gen.tokens)
    assert rv.tolist() == [1.0, 0.0, 1.0, 0.0] and rs[3] == 0.0 and np.all(rs[:3] > 0)
    np.testing.assert_allclose(r.rewards, rv + 0.5 * rs, rtol=1e-6)
    np.testing.assert_allclose(g.rewards, rv)  # grpo: alpha = 0 ...
    np.testing.assert_allclose(g.components["anchor"], rs, rtol=1e-6)  # ... the anchor still logged
    assert r.columns["gold"] == ["3", "3", "7", "7"]


def test_icpo_reward_by_name():
    c = icpo_config("cpu")
    assert c.icpo.judge == "rule"
    items = [_item(0, "3", "complete"), _item(1, "5", "underspecified", "Tom has some apples. How many?")]
    texts = ["The answer is 3.", "The answer is 4.", "How many apples did Tom start with?", "The answer is 5."]
    out = make_reward("icpo", RewardEnv(typed_config(c), 2))(items, GenerationResult([[]] * 4, [np.zeros(0)] * 4,
                                                                      np.zeros(4, int), ["stop"] * 4, texts))
    assert out.rewards.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert out.components["complete_acc"].tolist() == [1.0, 0.0]
    assert out.components["underspecified_non_answer"].tolist() == [1.0, 0.0]
    assert out.columns["kind"] == ["complete", "complete", "underspecified", "underspecified"]
