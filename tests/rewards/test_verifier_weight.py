"""RLSTA without a verifier (``rl.verifier_weight = 0``): the reward is the anchor alone, whatever the verdicts.

The worked example of test_rlsta (hand-set reference log-probs, G = 8 completions of one MT-Refine item);
the verdicts are flipped by changing the item's gold answer (660 -> 700), which turns the verifier's 0/1
column around while the anchor (the reference log-probs) stays.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import jaxrl_mt.rewards.rlsta  # noqa: F401  (registers "rlsta", "grpo")
from configs.rlsta import get_config
from jaxrl_mt.rewards.registry import RewardEnv, make_reward
from jaxrl_mt.rl.data import validate_config
from jaxrl_mt.rl.recipe import ConfigError
from jaxrl_mt.rl.run_config import typed_config
from tests.rewards.test_rlsta import LOGPS, TEXTS, TableScorer, _gen, _refine_item


def _table(tok, gen):
    table = {}
    for text, lp in zip(TEXTS[:4], LOGPS):
        ids = tuple(gen.tokens[TEXTS.index(text)])
        n, mean = len(ids), (lp[0] + lp[1]) / 2
        table[ids] = [lp[0]] * (n - 1) + [n * mean - (n - 1) * lp[0]]
    return table


def _reward(tok, weight, gold):
    c = get_config("paper")
    if weight is not None:
        with c.rl.unlocked():
            c.rl.verifier_weight = weight
    gen = _gen(tok, TEXTS)
    item = dataclasses.replace(_refine_item(), answer=gold)
    return make_reward(c.reward, RewardEnv(typed_config(c), 8, tok, None, TableScorer(_table(tok, gen))))([item], gen)


def test_anchor_only_reward_ignores_the_verifier(embedded_model):
    tok = embedded_model.tokenizer
    a, b = _reward(tok, 0.0, "660"), _reward(tok, 0.0, "700")
    assert not np.array_equal(a.components["verifier"], b.components["verifier"])  # the verdicts did change
    np.testing.assert_array_equal(a.components["verifier"], [1, 0, 1, 0] * 2)
    np.testing.assert_array_equal(b.components["verifier"], [0, 1, 0, 0] * 2)
    np.testing.assert_array_equal(a.rewards, b.rewards)  # the reward did not
    rs = [math.exp(-1.0), math.exp(-2.0), math.exp(-0.2), math.exp(-2.0)] * 2  # paper: alpha = 1/G, merged turns
    np.testing.assert_allclose(a.rewards, np.array(rs) / 8, rtol=1e-12)


def test_weight_one_is_todays_reward(embedded_model):
    tok = embedded_model.tokenizer
    for gold in ("660", "700"):
        today, one = _reward(tok, None, gold), _reward(tok, 1.0, gold)  # None: a config without the field
        np.testing.assert_array_equal(one.rewards, today.rewards)
        np.testing.assert_allclose(today.rewards, today.components["verifier"] + today.components["anchor"] / 8,
                                   rtol=1e-12)
    half = _reward(tok, 0.5, "660")
    np.testing.assert_allclose(half.rewards, 0.5 * half.components["verifier"] + half.components["anchor"] / 8,
                               rtol=1e-12)


def test_no_verifier_refuses_zeroing_wrong_answers(embedded_model, tmp_path):
    c = get_config("paper_described")  # zero_anchor_for_wrong = True
    c.workdir = str(tmp_path / "wd")
    with c.rl.unlocked():
        c.rl.verifier_weight = 0.0
    with pytest.raises(ConfigError, match="zero_anchor_for_wrong"):
        validate_config(c)
    c.rl.verifier_weight = -1.0
    c.rl.zero_anchor_for_wrong = False
    with pytest.raises(ConfigError, match="verifier_weight must be >= 0"):
        validate_config(c)
    c.rl.verifier_weight = 0.0
    validate_config(c)  # anchor-only without zeroing is a valid run
    tok = embedded_model.tokenizer
    gen = _gen(tok, TEXTS)
    c.rl.zero_anchor_for_wrong = True
    env = RewardEnv(typed_config(c), 8, tok, None, TableScorer(_table(tok, gen)))
    with pytest.raises(ValueError, match="verifier's verdicts"):
        make_reward(c.reward, env)([_refine_item()], gen)
