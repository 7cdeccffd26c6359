"""The `attention` config field reaches the model in training and evaluation; a bad value fails at start-up."""

from __future__ import annotations

import pytest

from jaxrl_mt.eval.simulator import EvalError
from jaxrl_mt.evaluate import load_eval_model, normalize_config
from jaxrl_mt.rl.data import validate_config
from jaxrl_mt.rl.recipe import ConfigError
from jaxrl_mt.rl.run_config import typed_config
from jaxrl_mt.rl.setup import load_policy_model
from tests.eval.test_evaluate_cli import tiny_config as eval_config
from tests.rl.test_loop import tiny_config


def test_training_and_evaluation_load_the_configured_attention(tiny_chat_model_dir, tmp_path):
    c = tiny_config(tiny_chat_model_dir, tmp_path / "w")
    assert typed_config(c).attention == "auto"
    c.attention = "blockwise"
    assert load_policy_model(typed_config(c), None).cfg.attention == "blockwise"
    assert load_eval_model(str(tiny_chat_model_dir), attention="einsum").cfg.attention == "einsum"
    c.attention = "flash"
    with pytest.raises(ConfigError, match="attention must be one of"):
        validate_config(c)
    with pytest.raises(EvalError, match="config field 'attention'"):
        normalize_config({**eval_config(tmp_path).to_dict(), "attention": "flash"})
