"""``enable_thinking`` from the configs to the rendered prompts (training and evaluation)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from jaxrl_mt import evaluate as evaluate_mod
from jaxrl_mt.eval.simulator import EvalError
from jaxrl_mt.evaluate import evaluate
from jaxrl_mt.models.config import ModelConfig
from jaxrl_mt.models.decoder import init_params
from jaxrl_mt.models.registry import DEFAULT_MODEL, Model, load_tokenizer, resolve
from jaxrl_mt.rl.recipe import ConfigError
from jaxrl_mt.rl.run_config import typed_config
from jaxrl_mt.rl.setup import load_policy_model
from tests.eval.test_evaluate_cli import tiny_config
from tests.qwen3_tok import qwen3_tokenizer
from tests.sampler_spy import recording_sampler

NO_THINK = "<think>\n\n</think>\n\n"  # what Qwen3's template appends to the prompt in no-think mode


@pytest.fixture(scope="module")
def qwen3_model():
    tok = qwen3_tokenizer(load_tokenizer(resolve(DEFAULT_MODEL)))
    cfg = ModelConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4,
                      num_kv_heads=2, head_dim=8, max_position_embeddings=4096, bos_token_id=1, eos_token_id=(2,),
                      pad_token_id=2)
    params = jax.tree_util.tree_map(np.asarray, init_params(cfg, jax.random.key(0)))
    return Model(cfg=cfg, params=params, tokenizer=tok, path=None, spec="qwen3-test")


@pytest.mark.parametrize("thinking", [None, False])
def test_evaluate_renders_with_the_configured_thinking_mode(thinking, qwen3_model, tmp_path, monkeypatch):
    made = []

    def spy(model, mesh_shape="auto", max_batch=None):
        made.append(recording_sampler(model, max_batch=8))
        return made[-1]

    monkeypatch.setattr(evaluate_mod, "make_sampler", spy)
    cfg = tiny_config(tmp_path, dataset=("synthetic:1",), limit=0, runs=1, scenarios=("full",), reuse_cache=False,
                      enable_thinking=thinking, max_new_tokens=2)
    evaluate(cfg, model=qwen3_model, log=lambda s: None)
    prompts = [qwen3_model.tokenizer.decode(p) for p in made[0].calls[0][0]]
    assert prompts and all(p.endswith(NO_THINK) == (thinking is False) for p in prompts)
    assert json.loads((tmp_path / "eval_config.json").read_text())["enable_thinking"] is thinking


def test_a_template_without_thinking_refuses_the_option(tiny_model, tmp_path, tiny_chat_model_dir):
    cfg = tiny_config(tmp_path, dataset=("synthetic:1",), limit=0, runs=1, scenarios=("full",), enable_thinking=True)
    with pytest.raises(EvalError, match="config field 'enable_thinking'"):
        evaluate(cfg, model=tiny_model, log=lambda s: None)
    from tests.rl.test_loop import tiny_config as train_config

    c = train_config(tiny_chat_model_dir, tmp_path / "w")
    c.chat.enable_thinking = True
    with pytest.raises(ConfigError, match=r"^chat\.enable_thinking: "):
        load_policy_model(typed_config(c), None)
    c.chat.enable_thinking = None
    assert typed_config(c).chat.enable_thinking is None
    raw = json.loads(c.to_json())
    raw["chat"]["enable_thinking"] = "yes"
    with pytest.raises(ConfigError, match=r"chat\.enable_thinking must be bool or NoneType"):
        typed_config(raw)
